"""Two worker hosts against one, for a multi-tenant migration on the deployment of docs/deploy.md.

The hosts are network namespaces on this machine (tests/deploy/hosts.py): PostgreSQL + RabbitMQ on
a data host, dagster-webserver + dagster-daemon on a control host, `dagster api grpc` on a code
host, and 1 or 2 dagster-celery worker hosts with `--slots` step slots each; the Pipedrive sandbox
(scaled realistic latency, no rate limit) in the root namespace. For each variant the whole
deployment is brought up fresh, `--tenants` tenants are launched through the webserver's GraphQL
at once (lane width `--lane`), and the wall time is taken from the first launch until every run
has succeeded. Throughput = ledger entries written (all tenants) / that wall time. Variants
alternate (1, 2, 2, 1, ...) over `--reps` rounds; medians are reported.

What the ratio says: a step is a lane slot's worth of work (one engine worker draining one
tenant's run); a worker host with S slots executes at most S at once, so with the lane wider than
one host's slots the second host is what lets the lane fill. The engine is latency-bound (it
waits on the source), so the ratio approaches min(lane, 2S) / min(lane, S) until the machine's two
cores, which every host here shares, become the limit: on real machines each host brings its own.
Hence the default latency (twice the sandbox's realistic delays): at x0.5 the steps' own CPU
(execution plans, resources, the writes) saturated the two shared cores and one host did as well
as two (0.93 at load 13); at x2, 1.70 (medians of 2 rounds, load 8-15) and 1.36 (1 round, load 13-17).

Needs root (network namespaces) and RabbitMQ, like the cross-host test; prints why and exits 0
otherwise. Usage: python bench/deploy_hosts.py [--tenants 4] [--scale tiny] [--latency realistic:2]
[--slots 2] [--lane 4] [--reps 1]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median, print_ratios, ratio  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from tests.deploy import hosts  # noqa: E402

FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}


def one(workers: int, args: argparse.Namespace) -> tuple[float, int, list[str]]:
    """(wall seconds, ledger entries, 'run id tenant -> workers' lines) for one fresh deployment."""
    from tests.deploy.deployment import celery_hosts, deployment, launch_phases

    settings = {"MIGRATE_HEARTBEAT_SECONDS": "2", "MIGRATE_LANE_INTERVAL_SECONDS": "5",
                "MIGRATE_REAPER_INTERVAL_SECONDS": "10"}
    with deployment(workers=workers, lane_width=args.lane, worker_slots=args.slots, scale=args.scale,
                    latency=args.latency, settings=settings) as dep:
        tenants = [f"tenant{i + 1}" for i in range(args.tenants)]
        for t in tenants:
            dep.ui.add_partition(t)
        instance = dep.instance()
        started = time.perf_counter()
        run_ids = {t: launch_phases(dep.ui, t) for t in tenants}
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            states = {t: instance.get_run_by_id(r).status.value for t, r in run_ids.items()}
            if all(s in FINISHED for s in states.values()):
                break
            time.sleep(0.5)
        wall = time.perf_counter() - started
        if any(s != "SUCCESS" for s in states.values()):
            raise SystemExit(f"runs did not all succeed: {states}\n{dep.logs()}")
        db = dbmod.Database(dep.engine_url, max_size=1)
        entries = db.sql("SELECT count(*) AS n FROM migration_records")[0]["n"]
        db.close()
        lines = []
        for t, r in run_ids.items():
            used = sorted({w.split("@")[0] for _, _, w in celery_hosts(instance, r)})
            lines.append(f"{r} {t} -> {', '.join(used)}")
        instance.dispose()
    return wall, entries, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tenants", type=int, default=4)
    p.add_argument("--scale", default="tiny")
    p.add_argument("--latency", default="realistic:2")
    p.add_argument("--slots", type=int, default=2, help="celery slots per worker host")
    p.add_argument("--lane", type=int, default=4, help="the lane width (dagster.yaml's run limit)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args()
    reason = hosts.missing()
    if reason:
        print(f"SKIPPED: {reason}")
        return
    print(f"deploy_hosts: {args.tenants} tenants, scale {args.scale}, latency {args.latency}, lane {args.lane}, "
          f"{args.slots} slots per worker host, {args.reps} round(s)")
    rates: dict[int, list[float]] = {1: [], 2: []}
    for rnd in range(args.reps):
        for workers in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            wall, entries, lines = one(workers, args)
            rates[workers].append(entries / wall)
            print(f"  {workers} worker host(s): {entries} ledger entries in {wall:.1f} s = {entries / wall:.1f}/s")
            for line in lines:
                print(f"    {line}")
            sys.stdout.flush()
    one_host, two_hosts = median(rates[1]), median(rates[2])
    print_ratios("deploy_hosts", [
        ("entries/s, 1 worker host", one_host, f"{args.slots} slots"),
        ("entries/s, 2 worker hosts", two_hosts, f"{2 * args.slots} slots"),
        ("2 worker hosts / 1 worker host", ratio(two_hosts, one_host),
         f"ideal min({args.lane}, {2 * args.slots}) / min({args.lane}, {args.slots})"),
    ])


if __name__ == "__main__":
    main()
