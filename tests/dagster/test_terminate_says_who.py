"""Who stopped a run is in the engine run's log, so `migrate status` says it (its grouped reasons):
a terminate from Dagster (the UI's Terminate) says "stopped from Dagster (Dagster run <id prefix>
terminated)"; a stop by the command that launched the run (`launch.stop.stop_launched_run` tags the
run `migration/stopped_by`) says that instead. The stop flag alone says only that a stop was asked."""
from __future__ import annotations

import _thread
import threading
import time

import pytest
from dagster import DagsterRunStatus, RunsFilter
from dagster._core.test_utils import create_run_for_test

from engine_core import rollup as rollups
from engine_core import runs
from migration_pipeline.cli import output
from migration_pipeline.launch.stop import STOPPED_BY, run_started_at, stop_launched_run
from tests.dagster.support import materialize_tenant, resources
from tests.dagster.test_ui_leftovers import TINY, _runs_of, _terminate_while_draining

pytestmark = pytest.mark.timeout(180)
SLOW = {"page_size": 20, "counts": {**TINY["counts"], "contacts": 70}, "row_delay": 0.05}


def _terminated(instance, engine_url, db, tenant: str, tagged: str | None = None):
    done = threading.Event()
    if tagged is not None:  # as stop_launched_run tags the run before it terminates it
        def tag_then_terminate(*args):  # type: ignore[no-untyped-def]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not done.is_set():
                started = instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.STARTED]))
                if started:
                    instance.add_run_tags(started[0].run_id, {STOPPED_BY: tagged})
                    break
                time.sleep(0.05)
            _terminate_while_draining(*args)
        target = tag_then_terminate
    else:
        target = _terminate_while_draining
    terminator = threading.Thread(target=target, args=(instance, db, tenant, "contacts", done))
    terminator.start()
    try:
        result = materialize_tenant(instance, tenant, resources(engine_url, options=SLOW))
    finally:
        done.set()
        terminator.join()
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    (run_id,) = _runs_of(db, tenant)
    assert runs.get_run(db, run_id).status in ("stopping", "stopped")
    return result.run_id, [g for g in rollups.rollup(db, run_id).reasons if g["kind"] == "run"]


def test_a_terminate_from_dagster_is_said_in_the_engine_runs_reasons(instance, engine_url, db):
    dagster_run, said = _terminated(instance, engine_url, db, "halted")
    assert [(g["action"], g["example"]) for g in said] == \
        [("info", f"stopped from Dagster (Dagster run {dagster_run[:8]} terminated)")], said


def test_a_stop_by_the_launching_command_is_said_as_such(instance, engine_url, db):
    by = "by the `migrate` command that launched it (Dagster run abcd1234)"
    _, said = _terminated(instance, engine_url, db, "ctrlc", tagged=by)
    assert [g["example"] for g in said] == [f"stopped {by}"], said


def test_the_launching_command_tags_the_run_it_stops(instance):
    run = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTING)
    stop_launched_run(instance, run.run_id, echo=lambda _: None, wait=0)
    assert instance.get_run_by_id(run.run_id).tags[STOPPED_BY] == \
        f"by the `migrate` command that launched it (Dagster run {run.run_id[:8]})"


def _migrate_stop_then_terminate(instance, db, tenant: str, kind: str, done: threading.Event) -> None:
    """`migrate stop` (its note, the engine run's stop flag), then - while the drain still runs -
    the run CANCELING and its main thread interrupted: what an in-process run's watcher does once
    the phase op marks the run CANCELING for that stop (`phases.cancel_this_run`), landing in the
    drain before the op's own Failure."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        if db.sql("SELECT 1 FROM migration_records r JOIN migrations m ON m.id = r.migration_id"
                  " WHERE m.tenant_id = %(t)s AND r.kind = %(k)s LIMIT 1", {"t": tenant, "k": kind}):
            (engine,) = _runs_of(db, tenant)
            runs.note_stop(db, engine, output.MIGRATE_STOP)  # as cli/control.py's `stop` does
            runs.stop(db, engine)
            (dagster_run,) = instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.STARTED]))
            instance.report_run_canceling(dagster_run)
            _thread.interrupt_main()
            return
        time.sleep(0.05)


def test_a_terminate_after_migrate_stop_is_that_stop_said_once(instance, engine_url, db):
    done = threading.Event()
    terminator = threading.Thread(target=_migrate_stop_then_terminate, args=(instance, db, "stopcmd", "contacts", done))
    terminator.start()
    try:
        result = materialize_tenant(instance, "stopcmd", resources(engine_url, options=SLOW))
    finally:
        done.set()
        terminator.join()
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    (run_id,) = _runs_of(db, "stopcmd")
    said = [g["example"] for g in rollups.rollup(db, run_id).reasons if g["kind"] == "run"]
    assert said == ["stopped by `migrate stop`"], said
    # the launching command's closing line: `migrate stop`, whatever the interrupted step said
    messages = tuple(e.step_failure_data.error.message if e.step_failure_data.error else
                     e.step_failure_data.user_failure_data.description
                     for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    noted = runs.stop_noted(db, run_id, run_started_at(instance, result.run_id))
    assert output.stopped_by(step_messages=messages, noted=noted) == "`migrate stop` from elsewhere", (messages, noted)
