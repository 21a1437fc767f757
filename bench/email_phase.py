"""The email phase, before and after: requests per second against the source, divided by its burst
limit B, for the phase as built (lane width 4, four fetch threads per task) and for the same phase
run serially (one lane thread, one fetch thread: the seed's twenty-hour shape), from one run.

    python bench/email_phase.py [--scale small] [--latency realistic:0.05] [--burst-limit 600]

A `small` sandbox runs in a subprocess (its own interpreter, so its event loop does not share a GIL
with the workers), with the realistic latency profile scaled down and a burst limit of B requests
per 2-second window. The account's other kinds are migrated once with no latency; then the email
phase runs twice for the same tenant - concurrent, then serial - with the emails forgotten in
between (ledger and target rows), so both runs fetch the same listings and bodies. A ratio is
(requests the sandbox answered during the phase / the phase's wall time) / B; the most the
budget allows is (B - chunk) / (window + lease ttl + margin) / B, printed alongside.

The database is a fresh one (`bench_email_phase_<pid>_0`) on DATABASE_URL's server or the embedded
server under MIGRATE_HOME, dropped at the end. Part of `make bench` (bench/README.md): its
ratios are printed last, against the allowed rate B / 2 s (the issue's "0.54 of the allowed rate").
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any


sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Databases, Sandbox, print_ratios  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs  # noqa: E402
from engine_core.budget import Budget  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive.plan import PHASES  # noqa: E402
from engine_core.providers.pipedrive.provider import ENV_BASE_URL, ENV_TOKEN, PipedriveProvider  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402
from pipedrive_sandbox.config import SandboxConfig  # noqa: E402
from pipedrive_sandbox.server import start_subprocess  # noqa: E402

TOKEN = "bench-token-" + uuid.uuid4().hex[:12]
SETTINGS = Settings(lane_width=4, heartbeat_seconds=1.0, retry_backoff_seconds=0.5)


@dataclass
class Phase:
    label: str
    width: int
    fetch_threads: int
    seconds: float = 0.0
    requests: int = 0
    bodies: int = 0
    rate_limited: int = 0
    status: str = ""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def run_phase(db: dbmod.Database, sb: Sandbox, tenant: str, phase: Phase, burst_limit: int) -> Phase:
    sb.reset()
    options = {"base_url": sb.base_url, "burst_limit": burst_limit, "fetch_threads": phase.fetch_threads}
    started = time.monotonic()
    run = runs.start_run(db, PipedriveProvider(base_url=sb.base_url), tenant, kinds=["emails"], options=options, settings=SETTINGS)
    drain_threads(db, run.id, width=phase.width, settings=SETTINGS)
    phase.seconds = time.monotonic() - started
    stats = sb.stats()
    phase.requests = int(stats["requests_total"])
    phase.bodies = sum(int(v) for v in stats["bodies_fetched"].values())
    phase.rate_limited = int(stats["rate_limited"]["burst"]) + int(stats["rate_limited"]["daily"])
    phase.status = runs.get_run(db, run.id).status
    for row in db.sql("SELECT cursor_key, error FROM migration_tasks WHERE migration_id = %(r)s AND status = 'failed' LIMIT 3", {"r": run.id}):
        print(f"  {phase.label}: task {row['cursor_key']} failed: {row['error']}", flush=True)
    return phase


def forget_emails(db: dbmod.Database, tenant: str) -> None:
    with db.transaction() as tx:
        tx.sql("DELETE FROM crm.emails WHERE tenant_id = %(t)s", {"t": tenant})
        tx.sql("DELETE FROM migration_records WHERE tenant_id = %(t)s AND kind = 'emails'", {"t": tenant})


def remove_tenant(db: dbmod.Database, tenant: str) -> None:
    with db.transaction() as tx:
        for table in ("emails", "notes", "activities", "leads", "deals", "contacts", "companies", "users", "custom_field_definitions"):
            tx.sql(f"DELETE FROM crm.{table} WHERE tenant_id = %(t)s", {"t": tenant})
        tx.sql("DELETE FROM migration_records WHERE tenant_id = %(t)s", {"t": tenant})
        tx.sql("DELETE FROM migrations WHERE tenant_id = %(t)s", {"t": tenant})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--latency", default="realistic:0.05", help="the sandbox's latency during the email phase")
    parser.add_argument("--burst-limit", type=int, default=600, help="B: requests per 2-second window")
    parser.add_argument("--width", type=int, default=4, help="lane threads of the concurrent run")
    parser.add_argument("--fetch-threads", type=int, default=4, help="fetch threads per task of the concurrent run")
    args = parser.parse_args(argv)
    B = args.burst_limit

    config = SandboxConfig(scale=args.scale, seed=1, token=TOKEN, burst_limit=B, latency="none")
    proc, base_url = start_subprocess(config)
    # A database of its own on DATABASE_URL's server (or the embedded one), dropped at the end: the
    # default one is where a running Dagster instance's sensors look for live runs to drain.
    dbs = Databases("email_phase")
    db = dbmod.Database(dbs.new(), max_size=args.width * 3 + 6)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    os.environ[ENV_BASE_URL] = base_url
    os.environ[ENV_TOKEN] = TOKEN
    try:
        sb = Sandbox(base_url)
        sb.configure(burst_limit=100_000)  # the other kinds, quickly: only the email phase is measured
        everything_but_mail = [k for group in PHASES[:-1] for k in group]
        t = time.monotonic()
        first = runs.start_run(db, PipedriveProvider(base_url=base_url), tenant, kinds=everything_but_mail,
                               options={"base_url": base_url, "burst_limit": 100_000}, settings=SETTINGS)
        drain_threads(db, first.id, width=4, settings=SETTINGS)
        print(f"setup: {args.scale} account without mail migrated in {time.monotonic() - t:.1f}s "
              f"({runs.get_run(db, first.id).status})", flush=True)

        sb.configure(burst_limit=B, latency=args.latency)
        after = run_phase(db, sb, tenant, Phase("concurrent", args.width, args.fetch_threads), B)
        forget_emails(db, tenant)
        before = run_phase(db, sb, tenant, Phase("serial", 1, 1), B)

        budget = Budget(db, "bench", "bench", burst_limit=B)
        ceiling = (B - budget.lease_size()) / (budget.window_seconds + budget.lease_ttl + budget.latency_margin)
        print(f"\nemail phase, {args.scale} sandbox, latency {args.latency}, burst limit B = {B} per 2 s")
        print(f"{'run':<12}{'lanes x fetch':>14}{'seconds':>10}{'requests':>10}{'bodies':>8}{'429s':>6}{'req/s':>9}{'req/s / B':>11}")
        for p in (after, before):
            print(f"{p.label:<12}{f'{p.width} x {p.fetch_threads}':>14}{p.seconds:>10.1f}{p.requests:>10}{p.bodies:>8}"
                  f"{p.rate_limited:>6}{p.rps:>9.1f}{p.rps / B:>11.3f}   ({p.status})")
        print(f"the budget's ceiling: {ceiling:.1f} req/s = {ceiling / B:.3f} x B; "
              f"speed-up {after.rps / before.rps if before.rps else float('nan'):.1f}x")
        print_ratios(f"email phase, {args.scale} sandbox, latency {args.latency}, B = {B} per 2 s", [
            ("concurrent req/s / allowed rate (B/2 s)", after.rps / (B / 2), f"{after.rps:.1f} of {B / 2:.0f} req/s; target >= 0.9"),
            ("serial req/s / allowed rate", before.rps / (B / 2), f"{before.rps:.1f} req/s (one lane, one fetch thread)"),
            ("budget ceiling / allowed rate", ceiling / (B / 2), "(B - chunk) / (window + ttl + margin)"),
            ("429s during the concurrent phase", float(after.rate_limited), "target 0"),
            ("concurrent / serial", after.rps / before.rps if before.rps else float("nan"), "speed-up"),
        ])
        return 0 if after.status == before.status == "succeeded" else 1
    finally:
        try:
            remove_tenant(db, tenant)
            db.sql("DELETE FROM source_budgets WHERE account = %(a)s", {"a": PipedriveProvider(base_url=base_url).account()})
        finally:
            db.close()
            dbs.close()
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
