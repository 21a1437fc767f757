"""The real thing: `dagster dev` (webserver, daemon with the QueuedRunCoordinator and the sensors,
Postgres storage) driven through the UI's own GraphQL calls.

* the webserver lists the phase assets and the tenant partitions;
* two tenants - one through the tenant job, one through `__ASSET_JOB` as the asset graph's
  Materialize does, launched while the first fills the lane - both finish exactly, drainer runs
  join them, the number of migration runs in progress never exceeds the lane's 4 (sampled from the
  instance throughout), and the lane is shared: the second starts while the first's phase is still
  open and they hold two slots each;
* terminating a run mid-phase stops the engine run within seconds, leaves no task running, and
  launching the partition again finishes with an exact reconciliation;
* a run whose phase closed with failed tasks fails; after the cause is removed, "re-execute from
  failure" - or a backfill of the failed partition - is the engine's retry and writes only what
  had not been written;
* `migrate run` launches a tenant on the same instance (the UI's daemon runs it) and exits
  non-zero when the run fails.

The last four run side by side, their tenants at once on one stack (one test, each failure named
by its scenario): the suite pays for the slowest. The stack's backfill daemon passes every second,
not Dagster's fixed 30 s: see BACKFILL_LOOP_SECONDS in conftest.py.
"""
from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, RunsFilter

from migration_pipeline import tags
from tests.dagster.support import side_by_side

pytestmark = pytest.mark.timeout(420)

PHASE_PATHS = [["example", p] for p in
               ("phase_1_companies", "phase_2_contacts", "phase_3_deals", "phase_4_activities", "phase_5_notes")]
IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}


def _new_run_config(options: dict) -> dict:
    return {"resources": {"new_run": {"config": {"options_json": json.dumps(options)}}}}


def _wait_run(stack, run_id: str, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = stack.instance.get_run_by_id(run_id)
        if run and run.status in FINISHED:
            return run
        time.sleep(0.5)
    raise TimeoutError(f"Dagster run {run_id} did not finish; see {stack.log}")


def _wait_tenant_quiet(stack, tenant: str, timeout: float = 60.0) -> None:
    """Until no Dagster run of the tenant (drainers included) is queued or in progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not stack.instance.get_runs_count(RunsFilter(tags={tags.PARTITION: tenant},
                                                        statuses=[DagsterRunStatus.QUEUED, *IN_PROGRESS])):
            return
        time.sleep(0.5)
    raise TimeoutError(f"runs of {tenant} still in flight")


def _reconcile(stack, tenant: str, counts: dict[str, int]) -> None:
    target = {r["kind"]: r["n"] for r in stack.db.sql(
        "SELECT kind, count(*) AS n FROM example_items WHERE tenant_id = %(t)s GROUP BY kind", {"t": tenant})}
    ledger = {r["kind"]: r["n"] for r in stack.db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = %(t)s AND action = 'created' GROUP BY kind",
        {"t": tenant})}
    distinct = {r["kind"]: r["n"] for r in stack.db.sql(
        "SELECT kind, count(DISTINCT source_id) AS n FROM example_items WHERE tenant_id = %(t)s GROUP BY kind",
        {"t": tenant})}
    assert target == counts, f"{tenant}: target rows {target} != source rows {counts}"
    assert ledger == counts and distinct == counts


def test_the_webserver_lists_phase_assets_and_tenant_partitions(stack):
    stack.ui.add_partition("listed-tenant")
    nodes = stack.ui.phase_assets()
    assert sorted(n["assetKey"]["path"] for n in nodes) == PHASE_PATHS
    for n in nodes:
        assert n["isPartitioned"]
        assert n["partitionDefinition"]["type"] == "DYNAMIC"
        assert n["partitionDefinition"]["dimensionTypes"][0]["dynamicPartitionsDefinitionName"] == "tenants"
    assert "listed-tenant" in stack.ui.partition_keys(PHASE_PATHS[0])


def _in_progress_by_tenant(stack) -> dict[str, int]:
    found: dict[str, int] = {}
    for record in stack.instance.get_run_records(RunsFilter(statuses=IN_PROGRESS)):
        tenant = record.dagster_run.tags.get(tags.PARTITION, "")
        found[tenant] = found.get(tenant, 0) + 1
    return found


def _open_tasks_of_first_phase(stack, tenant: str) -> int | None:
    rows = stack.db.sql(
        "SELECT count(*) FILTER (WHERE t.phase = 0 AND t.status IN ('pending', 'running')) AS n FROM migrations m"
        " LEFT JOIN migration_tasks t ON t.migration_id = m.id WHERE m.tenant_id = %(t)s GROUP BY m.id", {"t": tenant})
    return rows[0]["n"] if rows else None


def test_two_tenants_through_two_launch_paths_share_the_lane_of_four(stack):
    # "lane-a" has a long first phase (60 pages of 2 s) and fills the lane with its own launch and
    # three drainers; then "lane-b" is launched as the asset graph does. The limit holds (never more
    # than 4 in progress, runs queued while full), and the lane is shared: b's first phase starts
    # while a's is still open (a's youngest drainers give way at a task boundary), and a and b
    # hold two slots each while both have work.
    small = {"contacts": 40, "deals": 20, "activities": 20, "notes": 20}
    counts_a = {"companies": 1200, **small}
    counts_b = {"companies": 800, **small}
    samples: list[dict[str, int]] = []
    queued_while_full: list[int] = []
    a_open_when_b_started: list[int | None] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            by_tenant = _in_progress_by_tenant(stack)
            samples.append(by_tenant)
            if sum(by_tenant.values()) >= 4:
                queued_while_full.append(stack.instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.QUEUED])))
            if not a_open_when_b_started and _open_tasks_of_first_phase(stack, "lane-b") is not None:
                a_open_when_b_started.append(_open_tasks_of_first_phase(stack, "lane-a"))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stack.ui.add_partition("lane-a")
        stack.ui.add_partition("lane-b")
        job_run = stack.ui.launch("migrate_tenant", "lane-a", run_config=_new_run_config(
            {"page_size": 20, "row_delay": 0.1, "counts": counts_a}))
        deadline = time.monotonic() + 90
        while _in_progress_by_tenant(stack).get("lane-a", 0) < 4:
            assert time.monotonic() < deadline, "lane-a never filled the lane"
            time.sleep(0.2)
        graph_run = stack.ui.launch("__ASSET_JOB", "lane-b", asset_paths=PHASE_PATHS, run_config=_new_run_config(
            {"page_size": 20, "row_delay": 0.05, "counts": counts_b}))
        a = _wait_run(stack, job_run, timeout=180)
        b = _wait_run(stack, graph_run, timeout=180)
        _wait_tenant_quiet(stack, "lane-a")
        _wait_tenant_quiet(stack, "lane-b")
    finally:
        stop.set()
        sampler.join(5)

    assert a.status == DagsterRunStatus.SUCCESS and b.status == DagsterRunStatus.SUCCESS, stack.log
    assert b.job_name == "__ASSET_JOB"  # the asset graph's path drops job tags, but not the partition:
    assert b.tags[tags.PARTITION] == "lane-b"  # the lane limit is keyed on it
    _reconcile(stack, "lane-a", counts_a)
    _reconcile(stack, "lane-b", counts_b)

    drainers = stack.instance.get_runs(RunsFilter(job_name="drain_tenant", tags={tags.ROLE: tags.DRAINER}))
    assert {d.tags[tags.PARTITION] for d in drainers} == {"lane-a", "lane-b"}, "the lane poller widened both"
    totals = [sum(s.values()) for s in samples]
    assert max(totals) <= 4, f"in-progress migration runs peaked at {max(totals)}"
    assert any(queued_while_full), "the lane was full with runs waiting: the limit held"
    # fairness: b did not wait for a's phase to end, and the lane was split two and two
    assert a_open_when_b_started and a_open_when_b_started[0], f"lane-b started only after lane-a's first phase: {a_open_when_b_started}"
    assert any(s.get("lane-a", 0) == 2 and s.get("lane-b", 0) == 2 for s in samples), samples[::10]


def terminating_a_run_stops_the_engine_and_relaunching_finishes_exactly(stack):
    counts = {"companies": 60, "contacts": 300, "deals": 60, "activities": 40, "notes": 40}
    options = {"page_size": 20, "row_delay": 0.02, "counts": counts}
    stack.ui.add_partition("stop-me")
    first = stack.ui.launch("migrate_tenant", "stop-me", run_config=_new_run_config(options))

    # wait until the contacts phase is under way
    deadline = time.monotonic() + 90
    engine_run = None
    while time.monotonic() < deadline:
        rows = stack.db.sql(
            "SELECT m.id, m.current_phase, count(t.id) FILTER (WHERE t.phase = 1 AND t.status = 'succeeded') AS done"
            " FROM migrations m LEFT JOIN migration_tasks t ON t.migration_id = m.id"
            " WHERE m.tenant_id = 'stop-me' GROUP BY m.id")
        if rows and rows[0]["current_phase"] == 1 and rows[0]["done"] >= 2:
            engine_run = rows[0]["id"]
            break
        time.sleep(0.2)
    assert engine_run is not None, "the contacts phase never started"

    stack.ui.terminate(first)
    terminated_at = time.monotonic()
    assert _wait_run(stack, first, timeout=60).status == DagsterRunStatus.CANCELED
    while time.monotonic() - terminated_at < 30:
        status = stack.db.sql("SELECT status FROM migrations WHERE id = %(r)s", {"r": engine_run})[0]["status"]
        running = stack.db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'",
                               {"r": engine_run})[0]["n"]
        if status == "stopped" and running == 0:
            break
        time.sleep(0.5)
    stopped_after = time.monotonic() - terminated_at
    assert status == "stopped" and running == 0, f"engine run {status} with {running} running task(s)"
    assert stopped_after < 20, f"the stop took {stopped_after:.1f}s"
    left = {r["status"] for r in stack.db.sql(
        "SELECT DISTINCT status FROM migration_tasks WHERE migration_id = %(r)s", {"r": engine_run})}
    assert left <= {"succeeded", "cancelled", "pending"} and "cancelled" in left
    _wait_tenant_quiet(stack, "stop-me")

    again = stack.ui.launch("migrate_tenant", "stop-me")  # no options: joining the stopped run resumes it
    assert _wait_run(stack, again, timeout=150).status == DagsterRunStatus.SUCCESS, stack.log
    assert stack.instance.get_run_by_id(again).tags[tags.ENGINE_RUN] == str(engine_run)
    assert stack.db.sql("SELECT status FROM migrations WHERE tenant_id = 'stop-me'") == [{"status": "succeeded"}]
    _wait_tenant_quiet(stack, "stop-me")
    _reconcile(stack, "stop-me", counts)


def reexecution_from_failure_retries(stack):
    counts = {"companies": 40, "contacts": 60, "deals": 40, "activities": 20, "notes": 20}
    options = {"page_size": 20, "counts": counts, "fail_pages": {"deals": [20]}}
    stack.ui.add_partition("retry-me")
    first = stack.ui.launch("__ASSET_JOB", "retry-me", asset_paths=PHASE_PATHS, run_config=_new_run_config(options))
    failed = _wait_run(stack, first)
    assert failed.status == DagsterRunStatus.FAILURE
    engine_run = int(failed.tags[tags.ENGINE_RUN])
    _wait_tenant_quiet(stack, "retry-me")
    written_before = stack.db.sql("SELECT max(id) AS id FROM migration_records")[0]["id"]

    # the page is fixed at the source, then "Re-execute from failure" on the run page
    stack.db.sql("UPDATE migrations SET options = options - 'fail_pages' WHERE id = %(r)s", {"r": engine_run})
    retried = stack.ui.reexecute_from_failure(first)
    assert _wait_run(stack, retried).status == DagsterRunStatus.SUCCESS, stack.log
    assert stack.instance.get_run_by_id(retried).tags[tags.ENGINE_RUN] == str(engine_run)
    assert stack.db.sql("SELECT id, status FROM migrations WHERE tenant_id = 'retry-me'") == [
        {"id": engine_run, "status": "succeeded"}]
    _wait_tenant_quiet(stack, "retry-me")

    # the retry wrote the failed page; what was written before kept its first write
    new_rows = {(r["kind"], r["sid"]) for r in stack.db.sql(
        "SELECT kind, source_id::int AS sid FROM migration_records WHERE id > %(w)s AND action = 'created'"
        " AND tenant_id = 'retry-me'", {"w": written_before})}
    assert {("deals", i) for i in range(21, 41)} <= new_rows
    assert not {k for k, _ in new_rows} & {"companies", "contacts"}
    # No duplicates. Rows whose parent was on the failed page, if their own phase ran before the
    # retry (drainers carry the engine run on past a failed phase), stay skipped placeholders for a
    # later run, as the engine decides.
    target = {r["kind"]: r["n"] for r in stack.db.sql(
        "SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items"
        " WHERE tenant_id = 'retry-me' GROUP BY kind HAVING count(*) = count(DISTINCT source_id)")}
    skipped = {r["kind"]: r["n"] for r in stack.db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = 'retry-me' AND action = 'skipped'"
        " GROUP BY kind")}
    for kind, n in counts.items():
        assert target.get(kind, 0) + skipped.get(kind, 0) == n, (kind, target, skipped)
    assert target["deals"] == 40 and target["companies"] == 40 and target["contacts"] == 60


def a_backfill_of_the_failed_partition_retries_the_engine_run(stack):
    # The asset graph's other way to rerun: select the failed tenant partition and launch a backfill
    # of every phase. The backfill daemon's run joins the failed engine run, which is the engine's
    # retry: the failed page is written, nothing written before is written again.
    counts = {"companies": 40, "contacts": 40, "deals": 40, "activities": 20, "notes": 20}
    options = {"page_size": 20, "counts": counts, "fail_pages": {"deals": [0]}}
    stack.ui.add_partition("backfill-me")
    first = stack.ui.launch("__ASSET_JOB", "backfill-me", asset_paths=PHASE_PATHS, run_config=_new_run_config(options))
    failed = _wait_run(stack, first)
    assert failed.status == DagsterRunStatus.FAILURE
    engine_run = int(failed.tags[tags.ENGINE_RUN])
    _wait_tenant_quiet(stack, "backfill-me")
    written_before = stack.db.sql("SELECT max(id) AS id FROM migration_records")[0]["id"]
    firsts = stack.db.sql("SELECT kind, source_id, id FROM migration_records WHERE tenant_id = 'backfill-me'")

    stack.db.sql("UPDATE migrations SET options = options - 'fail_pages' WHERE id = %(r)s", {"r": engine_run})
    backfill = stack.ui.backfill(["backfill-me"], PHASE_PATHS)
    deadline = time.monotonic() + 150
    while (status := stack.ui.backfill_status(backfill)) not in {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED",
                                                                 "FAILED", "CANCELED"}:
        assert time.monotonic() < deadline, f"backfill {backfill} still {status}; see {stack.log}"
        time.sleep(1)
    assert status in {"COMPLETED", "COMPLETED_SUCCESS"}, (status, stack.log)
    backfill_runs = stack.instance.get_runs(RunsFilter(tags={"dagster/backfill": backfill}))
    assert backfill_runs and all(r.status == DagsterRunStatus.SUCCESS for r in backfill_runs)
    assert all(r.tags[tags.PARTITION] == "backfill-me" for r in backfill_runs), "backfill runs count in the lane"
    assert {r.tags[tags.ENGINE_RUN] for r in backfill_runs} == {str(engine_run)}
    assert stack.db.sql("SELECT id, status FROM migrations WHERE tenant_id = 'backfill-me'") == [
        {"id": engine_run, "status": "succeeded"}]
    _wait_tenant_quiet(stack, "backfill-me")

    new_rows = {(r["kind"], r["sid"]) for r in stack.db.sql(
        "SELECT kind, source_id::int AS sid FROM migration_records WHERE id > %(w)s AND action = 'created'"
        " AND tenant_id = 'backfill-me'", {"w": written_before})}
    assert {("deals", i) for i in range(1, 21)} <= new_rows, "the failed page was written by the retry"
    assert not {k for k, _ in new_rows} & {"companies", "contacts"}
    still = {(r["kind"], r["source_id"]): r["id"] for r in stack.db.sql(
        "SELECT kind, source_id, id FROM migration_records WHERE tenant_id = 'backfill-me'")}
    assert all(still.get((r["kind"], r["source_id"])) == r["id"] for r in firsts if r["kind"] in ("companies", "contacts"))
    target = stack.db.sql("SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items"
                          " WHERE tenant_id = 'backfill-me' GROUP BY kind")
    assert all(r["n"] == r["d"] for r in target), target
    assert {r["kind"]: r["n"] for r in target}["deals"] == 40


def migrate_run_launches_on_the_instance_the_ui_shows(stack):
    counts = {"companies": 30, "contacts": 30, "deals": 20, "activities": 20, "notes": 20}
    migrate = str(Path(sys.executable).parent / "migrate")

    def cli(tenant: str, options: dict) -> subprocess.Popen:
        return subprocess.Popen([migrate, "run", "--tenant", tenant, "--options", json.dumps(options), "--json"],
                                env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # two tenants at once: one that succeeds, one whose notes page fails
    good = cli("from-cli", {"page_size": 20, "counts": counts})
    failing = cli("from-cli-failing", {"page_size": 20, "counts": counts, "fail_pages": {"notes": [0]}})
    ok_out, ok_err = good.communicate(timeout=300)  # generous: it shares the lane with the other scenarios
    bad_out, _ = failing.communicate(timeout=300)

    assert good.returncode == 0, ok_out[-2000:] + ok_err[-3000:]
    payload = json.loads(ok_out)
    assert payload["dagster_status"] == "SUCCESS"
    assert [p["status"] for p in payload["phases"]] == ["materialized"] * 5
    assert payload["phases"][1]["metadata"]["imported"] == 30
    run = stack.instance.get_run_by_id(payload["dagster_run_id"])
    assert run.job_name == "migrate_tenant" and run.tags[tags.PARTITION] == "from-cli"
    assert "from-cli" in stack.ui.partition_keys(PHASE_PATHS[0])  # the UI sees the CLI's tenant
    _wait_tenant_quiet(stack, "from-cli")
    _reconcile(stack, "from-cli", counts)

    assert failing.returncode == 1
    payload = json.loads(bad_out)
    assert payload["dagster_status"] == "FAILURE"
    assert payload["phases"][-1]["status"] == "failed" and "injected failure" in payload["phases"][-1]["message"]
    _wait_tenant_quiet(stack, "from-cli-failing")


def test_terminate_retries_from_the_run_page_and_a_backfill_and_migrate_run_side_by_side(stack):
    # Four tenants' scenarios at once on the one stack (each reads only its own tenant's rows): a
    # run terminated mid-phase and launched again, a failed run re-executed from failure, a failed
    # partition backfilled (the backfill daemon passes every BACKFILL_LOOP_SECONDS here), and
    # `migrate run` launching two tenants from the shell. Side by side they cost the slowest one's
    # time, not the sum (the terminate scenario had been a test of its own, ~67 s after the others'
    # ~70 s); each failure names its scenario.
    scenarios = {f.__name__: f for f in (terminating_a_run_stops_the_engine_and_relaunching_finishes_exactly,
                                         reexecution_from_failure_retries,
                                         a_backfill_of_the_failed_partition_retries_the_engine_run,
                                         migrate_run_launches_on_the_instance_the_ui_shows)}
    side_by_side({name: functools.partial(f, stack) for name, f in scenarios.items()}, timeout=400,
                 where=f"; see {stack.log}")
