"""A terminate delivered to an in-process run while Dagster holds interrupts (a step's events, its
start and end, between steps) reaches the next op's body, where the phase op turns it into its
one-line Failure - not the next step's start, where Dagster raised it before any op code ran, and the
step failed with DagsterExecutionInterruptedError's stack trace (test_terminate_shown_as_stop, seen
under load: the terminate came as the first phase closed).

Deterministic and real: a real Dagster run executed by `InProcessRun` with the project's in-process
executor, its terminate what the UI's is (the run marked CANCELING, the watcher's delivery), and the
delivery made to land in Dagster's bookkeeping: a logger that, on the first step's success event,
marks the run CANCELING and waits there until the delivery has landed.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from dagster import (DagsterEventType, DagsterInstance, DagsterRunStatus, Failure, In, Nothing, job,
                     logger, op, reconstructable)
from dagster._core.errors import DagsterExecutionInterruptedError

from migration_pipeline.lane.executors import stopping_in_process_executor
from migration_pipeline.launch.in_process import InProcessRun, mark_starting
from tests.dagster.support import step_succeeded, tmpfs_instance

pytestmark = pytest.mark.timeout(120)

STOPPED = "stopped by a terminate request"
_HERE: dict[str, Any] = {}  # the instance and the InProcessRun, for the logger (the job loads this module by name)


class _TerminateAfterFirstStep(logging.Handler):
    """On the first step's STEP_SUCCESS (Dagster holds interrupts there): the UI's terminate, then a
    wait until the watcher's delivery has landed on this (the main) thread."""

    def emit(self, record: logging.LogRecord) -> None:
        if not step_succeeded(record, "first"):
            return
        instance: DagsterInstance = _HERE["instance"]
        executed: InProcessRun = _HERE["run"]
        instance.report_run_canceling(instance.get_run_by_id(executed.run_id))
        deadline = time.monotonic() + 60
        while executed.landed == 0 and time.monotonic() < deadline:
            time.sleep(0.01)


@logger
def terminate_after_first_step(_init_context):
    log = logging.getLogger("test_launch_terminate_held")
    log.handlers = [_TerminateAfterFirstStep()]
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log


@op
def first() -> None:
    """A phase step that closes its phase."""


@op(ins={"after": In(Nothing)})
def second() -> None:
    """The next phase step: what the phase op does with a terminate in its body (`materialize_phase`)."""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.02)
    except DagsterExecutionInterruptedError:
        raise Failure(description=STOPPED, allow_retries=False) from None
    raise AssertionError("the terminate never reached the op")


@job(executor_def=stopping_in_process_executor(), logger_defs={"terminate": terminate_after_first_step})
def two_phases():
    second(first())


def test_a_terminate_dagster_held_between_steps_ends_the_next_step_in_one_line():
    with tmpfs_instance() as instance:
        run = instance.create_run_for_job(job_def=two_phases, run_config={"loggers": {"terminate": {}}},
                                          job_code_origin=reconstructable(two_phases).get_python_origin())
        mark_starting(instance, run)
        executed = InProcessRun(instance, run.run_id, poll=0.05)
        _HERE.update(instance=instance, run=executed)
        try:
            finished = executed.execute()
        finally:
            _HERE.clear()
        assert executed.landed >= 1  # the delivery did land in Dagster's bookkeeping
        assert finished.status == DagsterRunStatus.CANCELED, finished.status
        events = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(run.run_id).records
                  if r.event_log_entry.dagster_event is not None]
        failures = [e for e in events if e.event_type == DagsterEventType.STEP_FAILURE]
        assert [e.step_key for e in failures] == ["second"], [e.step_key for e in failures]
        error = failures[0].event_specific_data.error
        assert error.cls_name == "Failure", error.to_string()  # not DagsterExecutionInterruptedError
        assert failures[0].event_specific_data.user_failure_data.description == STOPPED


@op
def stops_slowly(context) -> None:
    """A phase step terminated from the UI while it drains, whose stop handling spends a while
    outside the blocks that hold interrupts."""
    try:  # the watcher may deliver while the terminate is still being recorded: inside the try too
        context.instance.report_run_canceling(context.run)  # the UI's terminate
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.02)
    except DagsterExecutionInterruptedError:
        time.sleep(1.0)  # a terminate delivered again lands here, and would replace the Failure below
        raise Failure(description=STOPPED, allow_retries=False) from None
    raise AssertionError("the terminate never reached the op")


@job(executor_def=stopping_in_process_executor())
def one_slow_stop():
    stops_slowly()


def test_a_terminate_that_raised_in_an_op_is_not_delivered_again(monkeypatch):
    """Once a delivery raised in an op, the watcher delivers no other: one landing in the op's stop
    handling outside its blocks that hold interrupts replaced the op's Failure with the interrupt."""
    from migration_pipeline.launch import in_process

    monkeypatch.setattr(in_process, "REDELIVER_SECONDS", 0.1)  # ten chances within the op's stop
    with tmpfs_instance() as instance:
        run = instance.create_run_for_job(job_def=one_slow_stop,
                                          job_code_origin=reconstructable(one_slow_stop).get_python_origin())
        mark_starting(instance, run)
        executed = InProcessRun(instance, run.run_id, poll=0.05)
        finished = executed.execute()
        assert finished.status == DagsterRunStatus.CANCELED, finished.status
        failures = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.STEP_FAILURE).records]
        assert [e.step_key for e in failures] == ["stops_slowly"], [e.step_key for e in failures]
        error = failures[0].event_specific_data.error
        assert error.cls_name == "Failure", error.to_string()  # not DagsterExecutionInterruptedError
        assert executed.landed == 1, executed.landed
