"""Who stopped a run is in the engine run's log, so `migrate status` says it (its grouped reasons):
a terminate from Dagster (the UI's Terminate) says "stopped from Dagster (Dagster run <id prefix>
terminated)"; a stop by the command that launched the run (`launch.stop.stop_launched_run` tags the
run `migration/stopped_by`) says that instead. The stop flag alone says only that a stop was asked."""
from __future__ import annotations

import threading
import time

import pytest
from dagster import DagsterRunStatus, RunsFilter
from dagster._core.test_utils import create_run_for_test

from engine_core import rollup as rollups
from engine_core import runs
from migration_pipeline.launch.stop import STOPPED_BY, stop_launched_run
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
