"""A phase op hands its lane threads to the next phase op of the same Dagster run (issue 11,
"Dagster costs little": each phase boundary of a small `migrate run` had ~0.3 s without engine work
- the op's close, its materialisation, its checks step, the next op's start; `assets.phases.LaunchLanes`).

Real `migrate run` commands (the run executed in the command's process by the project's in-process
executor, as a user runs it) on the `example` source and a real Postgres:

* the next phase's tasks start before the Dagster step of that phase starts (the threads the op
  before it handed over claim them as soon as the engine's barrier seeds them), and the run ends
  exactly as before: every row once, no task left running, the Dagster run SUCCESS with every phase
  materialised;

and a Dagster run under the project's executor (`execute_job`, as a run worker executes it):

* a run that materialises one phase only drains nothing beyond it: threads run ahead only into a
  phase that has a step in the run;
* threads still handed over when the run's steps end (the next step failed, or never came) are
  stopped by the executor; other executors never hand over (nobody would stop them).

A launch alone in the lane keeps every free slot when its demand dips at a phase's end (its
threads were gone when the next phase's tasks came); with another tenant in the lane the shares
apply. And a phase's ledger checks read one snapshot: the engine goes on writing (the next phases, the
catch-up's rows of earlier kinds) while they run, and a claim committed between two of their
statements must not make a correct phase fail.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterEventType, execute_job, in_process_executor, job, op, reconstructable

from migration_pipeline import lane
from migration_pipeline.instance import open_instance, to_url
from migration_pipeline.lane import stopping_in_process_executor
from migration_pipeline.launch import new_run_config
from tests.dagster.support import example_env

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")
COUNTS = {"companies": 160, "contacts": 160, "deals": 160, "activities": 160, "notes": 160}
# 4 stripes of 20-row pages a kind (8 tasks a phase), each row a little slow: the threads are busy
OPTIONS = {"page_size": 20, "counts": COUNTS, "row_delay": 0.002}


def _migrate_run(env: dict[str, str], tenant: str, *extra: str) -> dict:
    out = subprocess.run([MIGRATE, "run", "--tenant", tenant, "--json", "--options", json.dumps(OPTIONS),
                          "--timeout", "240", *extra], env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return json.loads(out.stdout)


def _step_starts(env: dict[str, str], run_id: str) -> dict[str, float]:
    """Each phase step's STEP_START time (epoch seconds), by the phase's kind."""
    instance = open_instance(env)
    try:
        records = instance.get_records_for_run(run_id, of_type=DagsterEventType.STEP_START).records
        return {r.event_log_entry.step_key.split("_", 4)[-1]: r.event_log_entry.timestamp for r in records
                if not r.event_log_entry.step_key.endswith("_checks")}
    finally:
        instance.dispose()


def _first_task_starts(db_url: str, engine_run: int) -> dict[str, float]:
    with psycopg.connect(db_url) as c:
        return {kind: float(t) for kind, t in c.execute(
            "SELECT kind, extract(epoch FROM min(started_at)) FROM migration_tasks WHERE migration_id = %s"
            " GROUP BY kind", (engine_run,)).fetchall()}


def test_the_next_phase_starts_under_the_threads_handed_over_before_its_step_and_the_run_is_exact(db_url, tmp_path):
    env = example_env(db_url, tmp_path)
    result = _migrate_run(env, "ahead")
    assert result["dagster_status"] == "SUCCESS" and result["engine"]["status"] == "succeeded", result
    with psycopg.connect(db_url) as c:
        (engine_run,), = c.execute("SELECT id FROM migrations WHERE tenant_id = 'ahead'").fetchall()
    steps = _step_starts(env, result["dagster_run_id"])
    first = _first_task_starts(db_url, engine_run)
    assert set(steps) == set(COUNTS), steps
    later = ["contacts", "deals", "activities", "notes"]
    ahead = [kind for kind in later if first[kind] < steps[kind]]
    # without the hand-over no task of a phase can start before its step: nothing else drains here
    # (no daemon, no drainer runs); with it, the threads are idle at the barrier and claim at once
    assert len(ahead) >= 3, {kind: round(first[kind] - steps[kind], 3) for kind in later}
    with psycopg.connect(db_url) as c:
        assert c.execute("SELECT count(*) FROM migration_tasks WHERE status <> 'succeeded'").fetchone()[0] == 0
        per_kind = dict(c.execute("SELECT kind, count(*) FROM migration_records WHERE tenant_id = 'ahead'"
                                  " GROUP BY kind").fetchall())
    assert per_kind == COUNTS
    instance = open_instance(env)
    try:
        materialized = instance.get_records_for_run(result["dagster_run_id"],
                                                    of_type=DagsterEventType.ASSET_MATERIALIZATION).records
        assert len(materialized) == len(COUNTS)
    finally:
        instance.dispose()


def tenant_job():
    """The project's tenant job on the `example` source, with the project's executor."""
    from migration_pipeline.definitions import build_definitions

    return build_definitions("example").resolve_job_def("migrate_tenant")


def test_threads_run_ahead_only_into_a_phase_with_a_step_in_the_run(db_url, instance, monkeypatch):
    from migration_pipeline.assets.phases import phase_specs

    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    instance.add_dynamic_partitions("tenants", ["one"])
    first = phase_specs("example")[0]
    result = execute_job(reconstructable(tenant_job), instance, run_config=new_run_config(options=OPTIONS),
                         tags={"dagster/partition": "one"}, asset_selection=[first.key])
    assert result.success
    with psycopg.connect(db_url) as c:
        started = dict(c.execute("SELECT kind, count(*) FILTER (WHERE started_at IS NOT NULL)"
                                 " FROM migration_tasks GROUP BY kind").fetchall())
        open_tasks = c.execute("SELECT count(*) FROM migration_tasks WHERE kind = 'companies'"
                               " AND status <> 'succeeded'").fetchone()[0]
        phase = c.execute("SELECT current_phase FROM migrations WHERE tenant_id = 'one'").fetchone()[0]
    assert phase == 1 and started["companies"] and not open_tasks, (phase, started, open_tasks)
    assert started.get("contacts", 0) == 0, f"a thread drained a phase with no step in the run: {started}"
    assert lane.take_over(result.run_id) is None and not lane.may_hand_over(result.run_id)


STOPPED: list[str] = []


class _Lanes:
    """Stands for an op's lane threads: records that it was stopped."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def stop(self, grace, raise_errors=True):  # noqa: ANN001 - LaunchLanes.stop's signature
        STOPPED.append(self.run_id)


@op
def hands_over(context):
    assert lane.may_hand_over(context.run_id)
    assert lane.hand_over(context.run_id, _Lanes(context.run_id))


@op
def fails_before_taking_over(_after):
    raise RuntimeError("this step never takes the threads over")


@job(executor_def=stopping_in_process_executor())
def handing_job():
    fails_before_taking_over(hands_over())


@op
def may_not_hand_over(context):
    assert not lane.may_hand_over(context.run_id)
    assert not lane.hand_over(context.run_id, _Lanes(context.run_id))


@job(executor_def=in_process_executor)
def other_executor_job():
    may_not_hand_over()


def test_threads_still_handed_over_when_the_steps_end_are_stopped_by_the_executor(instance):
    STOPPED.clear()
    result = execute_job(reconstructable(handing_job), instance, raise_on_error=False)
    assert not result.success
    assert STOPPED == [result.run_id], "the handed-over threads outlived the run"
    assert lane.take_over(result.run_id) is None and not lane.may_hand_over(result.run_id)
    other = execute_job(reconstructable(other_executor_job), instance, raise_on_error=False)
    assert other.success, "another executor's run let a phase op hand its threads over"


def test_the_ledger_checks_read_one_snapshot_while_the_engine_writes(db, db_url, monkeypatch):
    from engine_core import runs
    from engine_core.providers.base import provider_for
    from engine_core.worker import drain_threads
    from migration_pipeline.assets import checks
    from migration_pipeline.assets.phases import phase_specs

    run = runs.start_run(db, provider_for("example"), "snap", options={"counts": {"companies": 30}, "page_size": 10},
                         kinds=["companies"])
    drain_threads(db, run.id, width=2)
    spec = phase_specs("example")[0]
    everything = {checks.LEDGER_MATCHES_TARGET, checks.NO_DUPLICATE_CLAIMS, checks.KINDS_ADD_UP}
    assert all(r.passed for r in checks.evaluate_ledger_checks(db, "snap", spec, everything))

    real_table, written = checks._table, []

    def table_then_a_write(db_, record_type):
        """Between the claims' count and the rows' count: a row and its claim committed elsewhere,
        as a lane thread of a later phase (or the catch-up) commits them."""
        if not written:
            with psycopg.connect(db_url, autocommit=True) as c:
                with c.transaction():
                    (row_id,), = c.execute("INSERT INTO example_items (tenant_id, kind, source_id) VALUES"
                                           " ('snap', 'companies', 'late') RETURNING id").fetchall()
                    c.execute("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id,"
                              " record_type, record_id, action) VALUES (%s, 'snap', 'example', 'companies',"
                              " 'late', 'example_items', %s, 'created')", (run.id, row_id))
            written.append(row_id)
        return real_table(db_, record_type)

    monkeypatch.setattr(checks, "_table", table_then_a_write)
    results = {r.check_name: r for r in checks.evaluate_ledger_checks(db, "snap", spec, {checks.LEDGER_MATCHES_TARGET})}
    assert written, "the write did not land between the check's statements"
    result = results[checks.LEDGER_MATCHES_TARGET]
    assert result.passed, result.metadata
    assert result.metadata["companies/ledger_created"].value == 30 == result.metadata["companies/target_rows"].value


def test_a_launch_alone_in_the_lane_keeps_its_threads_through_a_dip_in_demand():
    from engine_core.fairness import fair_shares
    from migration_pipeline.fair_lane import LanePicture, TenantSlots

    def picture(tenants: dict[str, TenantSlots]) -> LanePicture:
        return LanePicture(4, tenants, fair_shares({t: s.demand for t, s in tenants.items()}, 4))

    # one task left at the end of a phase: demand 1, while the launch holds 4 slots
    alone = {"a": TenantSlots("a", in_progress=["run-a"], held={"run-a": 4}, threads={"run-a": 4}, demand=1)}
    assert picture(alone).slots_for("a", "run-a", 4) == 1  # the share alone would send 3 threads away
    assert picture(alone).launch_slots("a", "run-a", 4) == 4
    # another tenant waiting: the shares apply again (its launch holds no slot yet)
    both = {**alone, "b": TenantSlots("b", in_progress=["run-b"], held={"run-b": 0}, threads={"run-b": 4}, demand=1)}
    assert picture(both).launch_slots("a", "run-a", 4) == picture(both).slots_for("a", "run-a", 4) == 1
    # alone, but a drainer of its own holds a slot: never a slot another run holds
    drained = {"a": TenantSlots("a", in_progress=["run-a", "drainer"], held={"run-a": 2, "drainer": 1},
                                threads={"run-a": 4}, demand=1)}
    assert picture(drained).launch_slots("a", "run-a", 4) == 3
