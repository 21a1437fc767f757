"""The email phase against the source's allowed rate: requests per second the sandbox answered,
divided by the allowed B / 2 s, for B = 80 and B = 600 per 2-second window, with one worker process
and with two worker processes (two tenants importing the same account, so one budget row), from
one run.

    python bench/email_phase.py [--scale small] [--latency realistic:0.05] [--burst-limits 80,600]

A `small` sandbox runs in a subprocess (its own interpreter, so its event loop does not share a GIL
with the workers), with the realistic latency profile scaled down. Each tenant's other kinds are
migrated once with no limit; then, for each B, the email phase runs with one process (tenant A,
lane width 4, four fetch threads per task) and with two processes at once (tenants A and B, each
its own process and run, same token, same account), with the emails forgotten in between (ledger
and target rows), so every run fetches the same listings and bodies. A ratio is (requests the
sandbox answered during the phase / the phase's wall time) / (B / 2 s); the sandbox enforces the
rolling window and counts its 429s. The budget's own ceiling, L / (W + ttl + margin), is printed
alongside, and so is the client's own rate with no limit at all (what the lanes and fetch threads
can ask for: above B = 600's allowed rate, or the budget is not what limits that row).

The database is a fresh one (`bench_email_phase_<pid>_0`) on DATABASE_URL's server or the embedded
server under MIGRATE_HOME, dropped at the end. Part of `make bench` (bench/README.md): its
ratios are printed last (issue 11's target: >= 0.9 of the allowed rate, 0 429s).
"""
from __future__ import annotations

import argparse
import multiprocessing
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
from engine_core.providers.pipedrive.provider import PipedriveProvider  # noqa: E402
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402
from engine_core.providers.registry import for_run
from pipedrive_sandbox.config import SandboxConfig  # noqa: E402
from pipedrive_sandbox.server import start_subprocess  # noqa: E402

TOKEN = "bench-token-" + uuid.uuid4().hex[:12]
SETTINGS = Settings(lane_width=4, heartbeat_seconds=1.0, retry_backoff_seconds=0.5)
UNLIMITED = 100_000


@dataclass
class Phase:
    label: str
    burst_limit: int
    processes: int
    seconds: float = 0.0
    requests: int = 0
    bodies: int = 0
    rate_limited: int = 0
    status: str = ""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def ratio(self) -> float:
        return self.rps / (self.burst_limit / 2.0)


def email_run(url: str, base_url: str, tenant: str, burst_limit: int, width: int, fetch_threads: int, go: Any, out: Any) -> None:
    """One worker process: the tenant's email phase, drained here (spawned: its own Database)."""
    db = dbmod.Database(url, max_size=width * 3 + 6)
    try:
        options = {"base_url": base_url, "burst_limit": burst_limit, "fetch_threads": fetch_threads}
        go.wait()
        run = runs.start_run(db, PipedriveProvider(base_url=base_url), tenant, kinds=["emails"], options=options, settings=SETTINGS)
        drain_threads(db, run.id, width=width, settings=SETTINGS, providers=for_run)
        failed = db.sql("SELECT cursor_key, error FROM migration_tasks WHERE migration_id = %(r)s AND status = 'failed' LIMIT 3", {"r": run.id})
        from engine_core.providers.pipedrive import provider as provider_mod  # this process's budget, for its slot counts

        slots = [b.stats() for per_db in list(provider_mod._budgets.values()) for b in per_db.values()]
        spent, expired, leased = (sum(getattr(x, k) for x in slots) for k in ("slots_spent", "slots_expired", "slots_leased"))
        out.put((tenant, runs.get_run(db, run.id).status, [f"{r['cursor_key']}: {r['error']}" for r in failed]
                 + ([] if not leased else [f"(slots: {leased} leased, {spent} spent, {expired} expired unspent)"])))
    finally:
        db.close()


def run_phase(url: str, sb: Sandbox, tenants: list[str], phase: Phase, width: int, fetch_threads: int) -> Phase:
    """The email phase of `tenants`, one process each, all at once; the sandbox's counts for it."""
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=email_run, args=(url, sb.base_url, t, phase.burst_limit, width, fetch_threads, go, out))
             for t in tenants]
    for p in procs:
        p.start()
    time.sleep(2.0)  # the interpreters are up and imported before the clock starts
    sb.configure(burst_limit=phase.burst_limit)  # a fresh window
    sb.reset()
    started = time.monotonic()
    go.set()
    results = [out.get(timeout=1800) for _ in procs]
    phase.seconds = time.monotonic() - started
    for p in procs:
        p.join(60)
    stats = sb.stats()
    phase.requests = int(stats["requests_total"])
    phase.bodies = sum(int(v) for v in stats["bodies_fetched"].values())
    phase.rate_limited = int(stats["rate_limited"]["burst"]) + int(stats["rate_limited"]["daily"])
    phase.status = ",".join(sorted({status for _, status, _ in results}))
    for tenant, _, lines in results:
        for line in lines:
            print(f"  {phase.label} {tenant}: {line if line.startswith('(') else 'task ' + line + ' failed'}", flush=True)
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
    parser.add_argument("--burst-limits", default="80,600", help="B values: requests per 2-second window")
    parser.add_argument("--width", type=int, default=4, help="lane threads per process")
    parser.add_argument("--fetch-threads", type=int, default=4, help="fetch threads per task")
    args = parser.parse_args(argv)
    limits = [int(b) for b in args.burst_limits.split(",") if b.strip()]

    config = SandboxConfig(scale=args.scale, seed=1, token=TOKEN, burst_limit=UNLIMITED, latency="none")
    proc, base_url = start_subprocess(config)
    # A database of its own on DATABASE_URL's server (or the embedded one), dropped at the end: the
    # default one is where a running Dagster instance's sensors look for live runs to drain.
    dbs = Databases("email_phase")
    url = dbs.new()
    db = dbmod.Database(url, max_size=args.width * 3 + 6)
    tenants = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    os.environ[ENV_BASE_URL] = base_url
    os.environ[ENV_TOKEN] = TOKEN
    phases: list[Phase] = []
    try:
        sb = Sandbox(base_url)
        sb.configure(burst_limit=UNLIMITED)  # the other kinds, quickly: only the email phase is measured
        everything_but_mail = [k for group in PHASES[:-1] for k in group]
        t = time.monotonic()
        for tenant in tenants:
            first = runs.start_run(db, PipedriveProvider(base_url=base_url), tenant, kinds=everything_but_mail,
                                   options={"base_url": base_url, "burst_limit": UNLIMITED}, settings=SETTINGS)
            drain_threads(db, first.id, width=4, settings=SETTINGS, providers=for_run)
            print(f"setup: {args.scale} account without mail migrated for {tenant} ({runs.get_run(db, first.id).status})", flush=True)
        print(f"setup took {time.monotonic() - t:.1f}s", flush=True)
        sb.configure(latency=args.latency)

        def phase(label: str, burst_limit: int, n: int) -> Phase:
            for tenant in tenants:
                forget_emails(db, tenant)
            p = run_phase(url, sb, tenants[:n], Phase(label, burst_limit, n), args.width, args.fetch_threads)
            print(f"  {label}: {p.requests} requests in {p.seconds:.1f}s = {p.rps:.1f} req/s, {p.rate_limited} 429s ({p.status})", flush=True)
            phases.append(p)
            return p

        free = phase("no limit, 1 process", UNLIMITED, 1)
        results: dict[tuple[int, int], Phase] = {}
        for B in limits:
            for n in (1, 2):
                results[(B, n)] = phase(f"B={B}, {n} process{'es' if n > 1 else ''}", B, n)

        ceiling = {B: Budget(db, "bench", "bench", burst_limit=B).rate() for B in limits}
        print(f"\nemail phase, {args.scale} sandbox, latency {args.latency}, lanes x fetch threads {args.width} x {args.fetch_threads} per process")
        print(f"{'run':<24}{'seconds':>9}{'requests':>10}{'bodies':>8}{'429s':>6}{'req/s':>9}{'/ (B/2s)':>10}")
        for p in phases:
            ratio = f"{p.ratio:>10.3f}" if p.burst_limit != UNLIMITED else f"{'-':>10}"
            print(f"{p.label:<24}{p.seconds:>9.1f}{p.requests:>10}{p.bodies:>8}{p.rate_limited:>6}{p.rps:>9.1f}{ratio}   ({p.status})")
        lines: list[tuple[str, float, str]] = []
        for B in limits:
            for n in (1, 2):
                p = results[(B, n)]
                lines.append((f"B={B}, {n} proc: req/s / allowed (B/2 s)", p.ratio, f"{p.rps:.1f} of {B / 2:.0f} req/s; target >= 0.9"))
                lines.append((f"B={B}, {n} proc: 429s", float(p.rate_limited), "target 0"))
            lines.append((f"B={B}: budget ceiling / allowed", ceiling[B] / (B / 2), "L / (W + ttl + margin)"))
        lines.append(("no limit, 1 proc: req/s / (600/2 s)", free.rps / 300.0, f"{free.rps:.1f} req/s: what 4 lanes x 4 fetch threads ask for"))
        print_ratios(f"email phase, {args.scale} sandbox, latency {args.latency}", lines)
        return 0 if all(p.status == "succeeded" for p in phases) else 1
    finally:
        try:
            for tenant in tenants:
                remove_tenant(db, tenant)
            db.sql("DELETE FROM source_budgets WHERE account = %(a)s", {"a": PipedriveProvider(base_url=base_url).account()})
        finally:
            db.close()
            dbs.close()
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
