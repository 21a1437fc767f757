"""A terminate that lands outside a phase op's body still stops the engine run (issue 10, the
browser flow: "relaunch after terminate once finished engine run #2 instead of resuming #1").

The cause: a terminate raises DagsterExecutionInterruptedError in the run's main thread wherever
it is. The phase op stops the engine run when it lands in the op's drain or its attach/prepare,
but it also lands between two phase steps - in the next step's set-up (its resources), before any
op code runs - or in an op after its drain. The Dagster run then ended CANCELED while the engine
run stayed `running`; the lane poller's drainers finished it, so the relaunch found the tenant's
latest run succeeded and started run #2. `lane.stopping_in_process_executor` catches the
interruption around every step and sets the engine run's stop flag, so the relaunch resumes #1.

Deterministic and real: a real engine run on real Postgres, a real Dagster run (execute_job, the
project's executor), and a real interrupt (`_thread.interrupt_main`, what Dagster's termination
sends the run worker) timed to land while the second step's resource is being built.
"""
from __future__ import annotations

import _thread
import threading
import time

import pytest
from dagster import DagsterRunStatus, execute_job, in_process_executor, job, op, reconstructable, resource

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline.instance import to_url
from migration_pipeline.lane.executors import stopping_in_process_executor

ENGINE_RUN = "migration/run_id"
pytestmark = pytest.mark.timeout(180)


def _terminate_soon() -> None:
    """Dagster's termination of a run worker, timed to land once the step below has returned."""
    threading.Timer(0.3, _thread.interrupt_main).start()


@resource
def slow_resource(_):
    """The next step's set-up: the terminate lands here, before any op code of that step."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.05)


@op(required_resource_keys={"slow"})
def phase_two(context, _after):
    """The next step: Dagster's in-process executor builds the run's resources once, at the run's
    start, so the step can begin before the terminate lands. It waits for it (the terminate is
    0.3 s behind the first step) and has no stop handler of its own: only the executor can stop
    the engine run. Seen on an idle machine: an assertion here ran before the interrupt landed."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise AssertionError("the terminate never reached the run")


@op
def first_then(context):
    """A phase step that closes its phase; the terminate comes just after it returns."""
    _terminate_soon()
    return 1


@job(executor_def=stopping_in_process_executor(), resource_defs={"slow": slow_resource})
def terminated_between_steps():
    phase_two(first_then())


@job(executor_def=in_process_executor, resource_defs={"slow": slow_resource})
def terminated_between_steps_plain():
    phase_two(first_then())


def _terminate_between_steps(db_url: str, monkeypatch, the_job) -> tuple[str, DagsterRunStatus]:
    from tests.dagster.support import tmpfs_instance

    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    with dbmod.Database(db_url, max_size=4) as db:
        run = runs.start_run(db, provider_for("example"), "terminated", options={"page_size": 20})
    with tmpfs_instance() as instance:
        try:
            result = execute_job(reconstructable(the_job), instance=instance, tags={ENGINE_RUN: str(run.id)},
                                 raise_on_error=False)
            status = instance.get_run_by_id(result.run_id).status
        except KeyboardInterrupt:  # Dagster re-raised the interrupt to its caller (this test)
            status = DagsterRunStatus.CANCELED
    with dbmod.Database(db_url, max_size=2) as db:
        return runs.get_run(db, run.id).status, status


def test_a_terminate_between_phase_steps_stops_the_engine_run(db_url, monkeypatch):
    engine_status, dagster_status = _terminate_between_steps(db_url, monkeypatch, terminated_between_steps)
    assert dagster_status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE), dagster_status
    assert engine_status in ("stopping", "stopped"), (
        f"the Dagster run was terminated ({dagster_status.value}) but its engine run is {engine_status}: drainers "
        "would finish it and a relaunch would start a new run instead of resuming it")


def test_the_plain_executor_leaves_the_engine_run_running(db_url, monkeypatch):
    """What the browser flow met (kept as the cause's record): the same terminate with Dagster's own
    in-process executor leaves the engine run running."""
    engine_status, _ = _terminate_between_steps(db_url, monkeypatch, terminated_between_steps_plain)
    assert engine_status == "running"
