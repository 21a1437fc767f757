"""Issue 25, Deliver 4 (Dagster's fixed cost): a launch's lane threads are carried from one phase
op to the next within a Dagster run whose steps execute one after another in one process
(`lane.carry`, opened by the project's in-process executor), instead of being stopped at each
phase's end and started again by the next op while the engine waits on Dagster's step boundary.

* a run inside the scope has the next phase's tasks started before that phase's Dagster step
  starts (the previous op's threads drain on into it), each phase still materialised once with
  its checks passing, the result reconciling exactly, and no lane thread left once the run has
  ended; the same run outside the scope (Dagster's own in-process executor, the celery path's one
  step per process) starts no phase's task before its step;
* whatever is still carried when the scope closes - normally or by an exception (a failed step,
  a terminate between steps) - is stopped there;
* a `migrate run` (the project's executor, in the command's process) carries them and succeeds.
"""
from __future__ import annotations

import threading

import pytest

from dagster import DagsterEventType

from migration_pipeline.assets.specs import phase_specs
from migration_pipeline.lane import carry
from migration_pipeline.lane.threads import LAUNCH_THREADS_ENV
from tests.dagster.support import materialize_tenant, resources

COUNTS = {"companies": 60, "contacts": 60, "deals": 30, "activities": 20, "notes": 20}
OPTIONS = {"page_size": 10, "row_delay": 0.01, "counts": COUNTS}


def _early_phases(instance, db, result, tenant: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The engine phases whose first task started before their phase op's step did (the event
    log's STEP_START against migration_tasks.started_at, one clock: this machine's)."""
    phase_of = {spec.key.to_python_identifier(): spec.index for spec in phase_specs("example")}
    step_start = {e.step_key: e.timestamp for e in instance.all_logs(result.run_id, of_type=DagsterEventType.STEP_START)}
    first = {r["phase"]: float(r["t"]) for r in db.sql(
        "SELECT t.phase, extract(epoch FROM min(t.started_at)) AS t FROM migration_tasks t"
        " JOIN migrations m ON m.id = t.migration_id WHERE m.tenant_id = %(t)s GROUP BY t.phase", {"t": tenant})}
    return sorted(p for key, at in step_start.items() if (p := phase_of[key]) in first and first[p] < at)


def _lane_threads_alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("launch-lane-") and t.is_alive()]


def _reconciles(db, tenant: str) -> None:  # type: ignore[no-untyped-def]
    created = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = %(t)s AND action = 'created' GROUP BY kind",
        {"t": tenant})}
    target = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM example_items WHERE tenant_id = %(t)s GROUP BY kind", {"t": tenant})}
    assert created == target == COUNTS
    assert db.sql("SELECT status FROM migrations WHERE tenant_id = %(t)s", {"t": tenant})[0]["status"] == "succeeded"


def test_lane_threads_carry_across_the_steps_of_a_run_and_stop_with_it(instance, engine_url, db, monkeypatch):
    monkeypatch.delenv(LAUNCH_THREADS_ENV, raising=False)  # the lane width: 4 threads, 3 extra
    res = resources(engine_url, options=OPTIONS)

    with carry.steps_here():
        result = materialize_tenant(instance, "carried", res)
    assert result.success
    phases = len(result.get_asset_materialization_events())
    assert phases >= 4
    checks = result.get_asset_check_evaluations()
    assert checks and all(c.passed for c in checks), [(c.check_name, c.passed) for c in checks]
    assert len(checks) == len(result.get_asset_materialization_events()) * len({c.check_name for c in checks})
    _reconciles(db, "carried")
    early = _early_phases(instance, db, result, "carried")
    assert early, "no phase started before its step: nothing was carried"
    assert 0 not in early
    assert not _lane_threads_alive(), "lane threads outlived the run"

    result = materialize_tenant(instance, "separate", res)
    assert result.success
    _reconciles(db, "separate")
    assert _early_phases(instance, db, result, "separate") == []
    assert not _lane_threads_alive()


class _Lanes:
    def __init__(self) -> None:
        self.grace, self.stopped = 7.0, []

    def stop(self, grace: float, raise_errors: bool = True) -> None:
        self.stopped.append((grace, raise_errors))


def test_what_is_still_carried_is_stopped_when_the_scope_closes_even_on_an_exception():
    assert not carry.allowed()
    lanes, other = _Lanes(), _Lanes()
    with carry.steps_here():
        assert carry.allowed()
        carry.carry("run-a", lanes)
        with carry.steps_here():  # nested: the outer scope's
            carry.carry("run-b", other)
        assert other.stopped == []
        assert carry.adopt("run-b") is other
    assert lanes.stopped == [(7.0, False)] and other.stopped == []  # adopted: the adopter's to stop
    assert not carry.allowed() and carry.adopt("run-a") is None

    lanes = _Lanes()
    with pytest.raises(KeyboardInterrupt):
        with carry.steps_here():
            carry.carry("run-a", lanes)
            raise KeyboardInterrupt  # a terminate between two steps
    assert lanes.stopped == [(7.0, False)]
    assert not carry.allowed()
