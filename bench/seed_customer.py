"""A whole account at the seed customer's size, against its floors: the run's wall time divided by
the time the source itself allows - the burst floor (requests / (B / window)) and the token floor
(tokens / daily budget x day length) - the larger of the two being the binding one.

    python bench/seed_customer.py [--scale seed-customer] [--latency realistic:0.1]
        [--burst-limit 80] [--daily-budget N --day-seconds S] [--width 4] [--kinds all]

Not one of `make bench`'s quick benches: at B = 80 per 2 s the seed customer's ~120,000 requests
take about 50 minutes whatever the engine does (that is the floor). `--scale small` is a smoke
run of a minute or two.

The sandbox (a subprocess) serves the account with the realistic latency profile times the
factor, a burst window of B requests per 2 s and, when given, a daily token budget over a
simulated day of S seconds. The engine migrates every kind (or `--kinds`) with `width` lane
threads in this process. The floors are computed from what the sandbox counted for this very run
(requests and tokens answered, 429s included), so they are the least this run's requests could
have taken at the source's rates; wall / binding floor is the ratio to read (target <= 1.2).

The catch-up (the plan's last phase: one sequential walk of every list, `inventory.py`) is also
reported on its own, from its tasks' stats and times: its share of the run's requests, tokens and
wall time, and its wall against its own burst floor (one page at a time, it cannot use the window).
"""
from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TOKEN, Databases, Timer, print_ratios, ratio, sandbox, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive.plan import PHASES  # noqa: E402
from engine_core.providers.pipedrive.provider import PipedriveProvider  # noqa: E402
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402
from engine_core.providers.registry import for_run

WINDOW_SECONDS = 2.0  # Pipedrive's burst window (the sandbox's default)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="seed-customer")
    parser.add_argument("--latency", default="realistic:0.1")
    parser.add_argument("--burst-limit", type=int, default=80, help="B: requests per 2-second window")
    parser.add_argument("--daily-budget", type=int, default=None, help="tokens per (simulated) day")
    parser.add_argument("--day-seconds", type=float, default=86_400.0, help="length of the simulated day")
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--kinds", default="all", help="comma list of kinds, or all")
    args = parser.parse_args(argv)
    B = args.burst_limit
    kinds = [k for group in PHASES for k in group] if args.kinds == "all" else [k.strip() for k in args.kinds.split(",")]
    settings = Settings(lane_width=args.width, heartbeat_seconds=1.0, retry_backoff_seconds=0.5)
    extra = {"daily_budget": args.daily_budget, "day_seconds": args.day_seconds} if args.daily_budget else {}
    dbs = Databases("seed_customer")
    with sandbox(args.scale, latency=args.latency, burst_limit=B, **extra) as sb:
        os.environ[ENV_BASE_URL] = sb.base_url
        os.environ[ENV_TOKEN] = TOKEN
        db = dbmod.Database(dbs.new(), max_size=args.width * 3 + 6)
        print(f"seed-customer bench: {args.scale} sandbox, latency {args.latency}, B = {B} per 2 s, "
              f"daily budget {args.daily_budget or 'none'}; {server_facts(dbs.server)}", flush=True)
        try:
            sb.reset()
            t = Timer()
            run = runs.start_run(db, PipedriveProvider(base_url=sb.base_url), f"bench-{uuid.uuid4().hex[:8]}",
                                 kinds=kinds, options={"base_url": sb.base_url, "burst_limit": B}, settings=settings)
            drain_threads(db, run.id, width=args.width, settings=settings, providers=for_run)
            wall = t.seconds
            status = runs.get_run(db, run.id).status
            stats = sb.stats()
            rows = int(db.sql("SELECT count(*) AS n FROM migration_records WHERE migration_id = %(r)s", {"r": run.id})[0]["n"])
            catchup = db.sql(
                "SELECT COALESCE(sum((stats->>'requests')::bigint), 0) AS requests,"
                " COALESCE(sum((stats->>'tokens')::bigint), 0) AS tokens,"
                " COALESCE(extract(epoch FROM max(finished_at) - min(started_at)), 0) AS seconds"
                " FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'catchup'", {"r": run.id})[0]
        finally:
            db.close()
            dbs.close()
    requests, tokens = int(stats["requests_total"]), int(stats["tokens_total"])
    limited = int(stats["rate_limited"]["burst"]) + int(stats["rate_limited"]["daily"])
    burst_floor = requests / (B / WINDOW_SECONDS)
    token_floor = tokens / args.daily_budget * args.day_seconds if args.daily_budget else 0.0
    binding = max(burst_floor, token_floor)
    print(f"run {status}: {rows} ledger rows in {wall:.0f} s; {requests} requests ({limited} answered 429), "
          f"{tokens} tokens; burst floor {burst_floor:.0f} s, token floor "
          f"{f'{token_floor:.0f} s' if args.daily_budget else 'n/a (no daily budget given)'}")
    print_ratios(f"seed-customer run, {args.scale}, latency {args.latency}, B = {B}", [
        ("wall / binding floor", ratio(wall, binding), f"{'token' if token_floor > burst_floor else 'burst'} floor binds; target <= 1.2"),
        ("wall / burst floor", ratio(wall, burst_floor), f"{requests} requests at {B / WINDOW_SECONDS:.0f} req/s"),
        ("wall / token floor", ratio(wall, token_floor) if token_floor else float("nan"), f"{tokens} tokens"),
        ("rows per second", rows / wall if wall else float("nan"), f"{rows} ledger rows"),
        ("429s", float(limited), "burst + daily"),
        ("catch-up share of requests", ratio(float(catchup["requests"]), requests), f"{catchup['requests']} requests"),
        ("catch-up share of tokens", ratio(float(catchup["tokens"]), tokens), f"{catchup['tokens']} tokens"),
        ("catch-up share of wall", ratio(float(catchup["seconds"]), wall), f"{float(catchup['seconds']):.1f} s"),
        ("catch-up wall / its burst floor", ratio(float(catchup["seconds"]), int(catchup["requests"]) / (B / WINDOW_SECONDS)),
         "sequential walks: one request in flight"),
    ])
    return 0 if status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
