"""Chaos, the long version of tests/chaos: drainer processes (two lanes each) migrate several
tenants' copies of a `small` Pipedrive account from a sandbox with request faults, while a seeded
chaos thread SIGKILLs drainers (starting replacements) and terminates random backends of the
bench database, and the reaper sweeps with a 5 s stale-lock threshold. Every kind of every tenant
is then reconciled with the sandbox's truth and with a fault-free run of the same account.

    python bench/chaos.py [--seed N] [--scale small] [--tenants 2] [--drainers 4] [--chaos-seconds 150]

Prints the chaos events as they happen and, last, its figures: kills, terminations, lost,
duplicated, refetched bodies (the sandbox's `bodies_fetched`: fetches of one body beyond one per
tenant), wall time - and every problem found. Exit status 0 only when nothing was lost,
duplicated or misreported. The same --seed replays the same strike schedule.

The database is a fresh `bench_chaos` database (dropped and re-created) on the server of
DATABASE_URL, or on the embedded server under MIGRATE_HOME; it is dropped at the end unless --keep.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_core import db as dbmod  # noqa: E402
from tests.chaos.support import FAULTS, ChaosConfig, run_chaos, with_app  # noqa: E402

DBNAME = "bench_chaos"


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    return float(lo), float(hi or lo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="the strike schedule's seed (default: a random one, printed)")
    parser.add_argument("--scale", default="small")
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--drainers", type=int, default=4)
    parser.add_argument("--width", type=int, default=2, help="lanes per drainer process")
    parser.add_argument("--faults", default=FAULTS)
    parser.add_argument("--latency", default="realistic:0.15")
    parser.add_argument("--kill-every", type=_pair, default=(2.0, 6.0), help="min,max seconds between two SIGKILLs")
    parser.add_argument("--terminate-every", type=_pair, default=(1.0, 4.0), help="min,max seconds between two terminations")
    parser.add_argument("--chaos-seconds", type=float, default=180.0, help="strike for this long, then let the runs finish")
    parser.add_argument("--stale-lock-seconds", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="the runs must finish within this many seconds")
    parser.add_argument("--keep", action="store_true", help="keep the bench database for inspection")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    print(f"chaos bench seed {seed} (--seed {seed} replays this schedule)", flush=True)

    server = os.environ.get("DATABASE_URL", "").strip() or dbmod.embedded_url(database="postgres")
    admin = with_app(server, "chaos-bench-admin", dbname="postgres")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DBNAME}"')
    url = with_app(server, "chaos-bench", dbname=DBNAME)
    dbmod.apply_schema(url)
    config = ChaosConfig(
        seed=seed, scale=args.scale, tenants=args.tenants, drainers=args.drainers, width=args.width,
        faults=args.faults, latency=args.latency, kill_every=args.kill_every, terminate_every=args.terminate_every,
        chaos_seconds=args.chaos_seconds, stale_lock_seconds=args.stale_lock_seconds, timeout=args.timeout,
    )
    try:
        with tempfile.TemporaryDirectory(prefix="chaos-bench-") as workdir:
            result = run_chaos(config, url, Path(workdir))
    finally:
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{DBNAME}" WITH (FORCE)')
    print()
    print(result.summary(limit=200))
    width = max(len(k) for k in result.figures)
    print(f"\nchaos bench, seed {seed}, {args.tenants} tenants x {args.scale}, {args.drainers} drainers x {args.width} lanes")
    for key, value in result.figures.items():
        print(f"  {key:<{width}}  {value}")
    print("CLEAN" if result.clean else f"{len(result.problems)} PROBLEMS (see above)")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
