"""The deployment of docs/deploy.md across hosts on this machine (network namespaces joined by veth
pairs, tests/deploy/hosts.py): PostgreSQL and RabbitMQ on a data host, dagster-webserver and
dagster-daemon on a control host, `dagster api grpc` on a code host, dagster-celery workers on two
worker hosts, the Pipedrive sandbox in the root namespace; every address is a veth address.

Two tenants are launched through the webserver's GraphQL (as the UI's launchpad does). The test
proves:
* steps run on both worker hosts (the engine's `locked_by` carries the host's name, and the
  celery executor's "Executing steps ... in celery worker" events name the worker);
* worker-a is killed (SIGKILL to all its processes, then its namespace deleted) while it holds an
  engine task in the middle of the migration; the step it was running goes back to the broker and
  runs on worker-b (same step key, worker-b, later in the run's event log), the task it held is
  released by the reaper sensor on the control host and finished on worker-b;
* both runs succeed and both tenants reconcile exactly with the sandbox's truth (ledger ids per
  kind, target rows = created + matched, no duplicates, no failed task);
* the lane limit (here 2) held across hosts: never more than 2 migration runs in progress in the
  shared run storage, never more than 2 live engine workers holding tasks;
* a third tenant terminated from the UI while its step runs on a worker host ends CANCELED with its
  engine run stopped (migration_pipeline/lane/executors.py: dagster-celery alone would let the step drain
  on), and no drainer run is started for it.
Skipped, saying why, where network namespaces cannot be made (not root, no iproute2, no RabbitMQ);
a failure instead under CI=true.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from dagster import DagsterRunStatus, RunsFilter

from engine_core import db as dbmod
from tests.deploy import hosts
from tests.deploy.deployment import celery_hosts
from tests.pipedrive.support import TABLE, actions, ledger, ledger_truth

REASON = hosts.missing()
UNDER_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Skipped with the reason where hosts cannot be made; under CI (root, RabbitMQ on the machine) a
# missing piece is a failure, so the test cannot pass in CI by being skipped.
pytestmark = [pytest.mark.skipif(REASON is not None and not UNDER_CI, reason=f"cross-host test: {REASON}"),
              pytest.mark.timeout(420)]

LANE = 2
LATENCY = "realistic:0.3"  # tasks long enough to be caught mid-flight, short enough for the suite
IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
TENANTS = ("acme", "globex")
STOPPED = "initech"  # launched, then terminated from the UI
FAST = {
    "MIGRATE_STALE_LOCK_SECONDS": "6",  # a dead host's task is free again within seconds
    "MIGRATE_HEARTBEAT_SECONDS": "1",
    "MIGRATE_REAPER_INTERVAL_SECONDS": "2",
    "MIGRATE_LANE_INTERVAL_SECONDS": "2",
    "MIGRATE_RETRY_BACKOFF_SECONDS": "0",
}


class Sampler(threading.Thread):
    """Every 0.3 s: the migration runs in progress (shared run storage) and who holds engine tasks."""

    def __init__(self, dep, db: dbmod.Database) -> None:
        super().__init__(daemon=True)
        self.instance = dep.instance()
        self.db = db
        self.stop = threading.Event()
        self.max_runs = 0
        self.max_workers = 0
        self.hosts_seen: set[str] = set()
        self.dead: set[str] = set()
        self.running: list[dict] = []
        self.connections: dict[str, int] = {}  # the most Postgres connections seen from each address
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.wait(0.3):
                n = self.instance.get_runs_count(RunsFilter(statuses=IN_PROGRESS))
                self.max_runs = max(self.max_runs, n)
                rows = self.db.sql("SELECT t.id, t.phase, t.kind, t.locked_by, m.tenant_id FROM migration_tasks t "
                                   "JOIN migrations m ON m.id = t.migration_id WHERE t.status = 'running'")
                self.running = rows
                live = {r["locked_by"] for r in rows if r["locked_by"] and r["locked_by"].split(":")[0] not in self.dead}
                self.max_workers = max(self.max_workers, len(live))
                self.hosts_seen.update(r["locked_by"].split(":")[0] for r in rows if r["locked_by"])
                for r in self.db.sql("SELECT host(client_addr) AS addr, count(*) AS n FROM pg_stat_activity "
                                     "WHERE client_addr IS NOT NULL GROUP BY 1"):
                    self.connections[r["addr"]] = max(self.connections.get(r["addr"], 0), r["n"])
        except BaseException as e:  # reported by the test
            self.error = e


def in_flight(db: dbmod.Database, instance, run_id: str, row: dict) -> bool:
    """Whether engine task `row` is still running under worker-a's lock and the Dagster step of its
    phase has not ended in run `run_id` (no STEP_SUCCESS or STEP_FAILURE for that step yet)."""
    from dagster import DagsterEventType

    task = db.sql("SELECT status, locked_by FROM migration_tasks WHERE id = %(id)s", {"id": row["id"]})[0]
    if task["status"] != "running" or not (task["locked_by"] or "").startswith("worker-a:"):
        return False
    ended = [rec for kind in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE)
             for rec in instance.get_records_for_run(run_id, of_type=kind).records]
    return not any(f"phase_{row['phase'] + 1}_" in (rec.event_log_entry.step_key or "") for rec in ended)


def test_two_tenants_across_hosts_survive_a_worker_host_dying(tmp_path):
    if REASON is not None:
        pytest.fail(f"cross-host test cannot run under CI: {REASON}")
    from tests.deploy.deployment import deployment, launch_phases

    t0 = time.monotonic()
    with deployment(workers=2, lane_width=LANE, worker_slots=2, scale="tiny", latency=LATENCY,
                    settings=FAST) as dep:
        up = time.monotonic() - t0
        truth = httpx_truth(dep.sandbox_url)
        db = dbmod.Database(dep.engine_url, max_size=2)
        sampler = Sampler(dep, db)
        sampler.start()
        try:
            run_ids = {}
            for tenant in TENANTS:
                dep.ui.add_partition(tenant)
                run_ids[tenant] = launch_phases(dep.ui, tenant)
            instance = dep.instance()

            # worker-a dies while it holds an engine task past the first phase AND runs the Dagster
            # step of that task's phase for its tenant: worker-a's lane threads also drain tasks of
            # steps running on worker-b, and a kill then finds no step of its own to move
            victim: list[dict] = []
            deadline = time.monotonic() + 240
            tenant_runs = dict(run_ids)

            def step_here(row: dict) -> bool:
                placed = celery_hosts(instance, tenant_runs[row["tenant_id"]]) if row["tenant_id"] in tenant_runs else []
                return bool(placed) and placed[-1][2].startswith("worker-a") and \
                    f"phase_{row['phase'] + 1}_" in placed[-1][1]

            while not victim and time.monotonic() < deadline:
                victim = [r for r in sampler.running if r["locked_by"].startswith("worker-a:") and r["phase"] >= 1
                          and step_here(r)]
                if victim:
                    # the sample is up to 0.3 s old and a tiny tenant's phase can end inside that:
                    # worker-a is frozen, and killed only if its task and its step are still in flight
                    dep.top.signal_host("worker-a", signal.SIGSTOP)
                    if not all(in_flight(db, instance, tenant_runs[r["tenant_id"]], r) for r in victim):
                        dep.top.signal_host("worker-a", signal.SIGCONT)
                        victim = []
                        continue
                    break
                if all(instance.get_run_by_id(r).status in FINISHED for r in run_ids.values()):
                    break
                time.sleep(0.1)
            assert victim, f"worker-a never held a task past phase 1 (hosts seen: {sampler.hosts_seen})\n{dep.logs()}"
            sampler.dead.add("worker-a")
            killed = dep.top.kill_host("worker-a")
            assert killed and not dep.top.hosts["worker-a"].alive
            killed_at = time.monotonic()
            kill_after = killed_at - t0 - up
            # the latency was there to catch a task mid-flight; what is left (the step moving to
            # worker-b, the reaper releasing the dead host's task) needs none
            source_latency(dep.sandbox_url, "none")

            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if all(instance.get_run_by_id(r).status in FINISHED for r in run_ids.values()):
                    break
                time.sleep(1)
            statuses = {t: instance.get_run_by_id(r).status for t, r in run_ids.items()}
            assert all(s == DagsterRunStatus.SUCCESS for s in statuses.values()), f"{statuses}\n{dep.logs()}"
            print(f"\nhosts up in {up:.0f} s; runs {run_ids}; worker-a killed {kill_after:.0f} s after the launch holding "
                  f"tasks {[(r['id'], r['kind'], r['tenant_id']) for r in victim]}; both runs done "
                  f"{time.monotonic() - killed_at:.0f} s later")
        finally:
            sampler.stop.set()
            sampler.join(5)
        assert sampler.error is None, sampler.error

        # work ran on both worker hosts, and the step worker-a was running ran again on worker-b
        assert {"worker-a", "worker-b"} <= sampler.hosts_seen, sampler.hosts_seen
        placements = {t: celery_hosts(instance, r) for t, r in run_ids.items()}
        workers_used = {w for p in placements.values() for _, _, w in p}
        assert workers_used == {"worker-a@worker-a", "worker-b@worker-b"}, workers_used
        moved = [(t, key) for t, p in placements.items() for i, (_, key, w) in enumerate(p)
                 if w.startswith("worker-a") and any(k == key and w2.startswith("worker-b") for _, k, w2 in p[i + 1:])]
        assert moved, f"no step went from worker-a to worker-b: {placements}"
        for row in victim:
            task = db.sql("SELECT status FROM migration_tasks WHERE id = %(id)s", {"id": row["id"]})[0]
            assert task["status"] == "succeeded", (row, task)

        # both tenants reconcile exactly with the source
        for tenant in TENANTS:
            for kind, want in ledger_truth(truth).items():
                entries = ledger(db, tenant, kind)
                assert set(entries) == want, f"{tenant}/{kind}: ledger ids differ from the source's"
            for table in set(TABLE.values()):
                rows = db.sql(f"SELECT source_id FROM crm.{table} WHERE tenant_id = %(t)s", {"t": tenant})
                claimed = sum(len(actions(ledger(db, tenant, k), "created", "matched"))
                              for k, t in TABLE.items() if t == table)
                assert len(rows) == claimed == len({r["source_id"] for r in rows}), f"{tenant}: crm.{table}"
        failed = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE status <> 'succeeded'")[0]["n"]
        assert failed == 0

        # the pool arithmetic of docs/deploy.md: per step slot at most the engine pool (6) + Dagster's
        # storage (NullPool, one per writing thread, 2)
        by_host = {name: sampler.connections.get(h.address, 0) for name, h in dep.top.hosts.items()}
        print(f"most Postgres connections seen per host: {by_host}")
        assert by_host["worker-b"] <= 2 * (6 + 2), by_host

        # the lane held across hosts
        assert sampler.max_runs <= LANE, sampler.max_runs
        assert sampler.max_workers <= LANE, sampler.max_workers

        # a terminate from the UI stops the engine run, though its step runs on a worker host
        source_latency(dep.sandbox_url, LATENCY)  # its run is still working when terminated
        dep.ui.add_partition(STOPPED)
        stopped_run = launch_phases(dep.ui, STOPPED)
        engine_run = None
        deadline = time.monotonic() + 120
        while engine_run is None and time.monotonic() < deadline:
            # the engine run exists once the first phase step, on a worker host, has started it
            rows = db.sql("SELECT id FROM migrations WHERE tenant_id = %(t)s", {"t": STOPPED})
            engine_run = rows[0]["id"] if rows else None
            time.sleep(0.2)
        assert engine_run is not None, dep.logs()
        dep.ui.terminate(stopped_run)
        deadline = time.monotonic() + 120
        while instance.get_run_by_id(stopped_run).status not in FINISHED and time.monotonic() < deadline:
            time.sleep(0.5)
        assert instance.get_run_by_id(stopped_run).status == DagsterRunStatus.CANCELED
        status = db.sql("SELECT status, cancel_requested FROM migrations WHERE id = %(r)s", {"r": engine_run})[0]
        assert status["status"] in ("stopping", "stopped") and status["cancel_requested"], status
        deadline, live, running = time.monotonic() + 60, 1, 1
        while (live or running) and time.monotonic() < deadline:  # no drainer carries on the stopped run
            live = instance.get_runs_count(RunsFilter(tags={"dagster/partition": STOPPED},
                                                      statuses=IN_PROGRESS + [DagsterRunStatus.QUEUED]))
            running = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s "
                             "AND status IN ('running', 'pending')", {"r": engine_run})[0]["n"]
            time.sleep(0.5)
        assert not live and not running, (live, running)
        db.close()


def httpx_truth(base_url: str) -> dict:
    import httpx

    return httpx.get(f"{base_url}/_sandbox/truth", timeout=60).json()


def source_latency(base_url: str, latency: str) -> None:
    """Set the sandbox's latency profile (`none`, `realistic:<factor>`) for the requests to come."""
    import httpx

    httpx.post(f"{base_url}/_sandbox/config", json={"latency": latency}, timeout=30).raise_for_status()
