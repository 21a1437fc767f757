"""A terminate reaching a daemon-launched run worker while its interrupts are held is not lost.

What a Terminate does to a run the daemon launched: DefaultRunLauncher marks the run CANCELING and
asks the code server to cancel it; the server sets the run's termination event, and the run
worker's termination thread (`dagster._grpc.impl._run_in_subprocess`) sends its own process ONE
SIGINT. Outside user code the worker holds it (`capture_interrupts`: a flag) and raises it on
entering the next user code; the project's executor (`stopping_in_process_executor`) catches it
there and sets the engine run's stop flag. A nested `capture_interrupts` - the project's
`lane.terminate.hold_interrupts` - clears that flag on exit, so a held delivery would be lost if
one were entered on the way: the project enters its holds only after the interrupt has raised
(the stop handlers) or after the run's last step, never between steps.

Deterministic and real: the run executes in a separate process started exactly as the code server
starts a run worker (`start_run_in_subprocess`, spawned), with the project's executor and a real
engine run; the terminate is the launcher's (run marked CANCELING) and the code server's (the
termination event set, so Dagster's own thread sends the real SIGINT). The worker says over a FIFO
when its first step's success is being recorded (interrupts held) and stays there until the SIGINT
has been held, so the delivery lands in the hold every time.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import select
import time

import pytest
from dagster import (DagsterEventType, DagsterRunStatus, In, Nothing, job, logger, op,
                     reconstructable)

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.lane.executors import stopping_in_process_executor
from tests.dagster.support import step_succeeded, tmpfs_instance

pytestmark = pytest.mark.timeout(180)

FIFO_ENV = "MIGRATE_TEST_HELD_FIFO"  # the worker says "held" on it (read in the worker process)
GUARD_SECONDS = 60.0  # failure guards only: nothing waits for time to pass


class _AtFirstStepSuccess(logging.Handler):
    """In the run worker, on the first step's STEP_SUCCESS (Dagster holds interrupts there): one
    byte to the FIFO, then a stay until the SIGINT has been held."""

    def emit(self, record: logging.LogRecord) -> None:
        from dagster._utils import interrupts

        if not step_succeeded(record, "first"):
            return
        with open(os.environ[FIFO_ENV], "wb", buffering=0) as fifo:
            fifo.write(b"h")
        deadline = time.monotonic() + GUARD_SECONDS
        while not interrupts.check_captured_interrupt() and time.monotonic() < deadline:
            time.sleep(0.01)


@logger
def held_at_first_step(_init_context):
    log = logging.getLogger("test_run_worker_terminate_held")
    log.handlers = [_AtFirstStepSuccess()]
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log


@op
def first() -> None:
    """A phase step that closes its phase; the terminate comes while its success is recorded."""


@op(ins={"after": In(Nothing)})
def second() -> None:
    """The next phase step: its body runs only if the held terminate was lost."""


@job(executor_def=stopping_in_process_executor(), logger_defs={"held": held_at_first_step})
def two_phases():
    second(first())


def _remote_origin():
    from dagster._core.remote_origin import (RegisteredCodeLocationOrigin, RemoteJobOrigin,
                                             RemoteRepositoryOrigin)

    return RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("tests"), "__repository__"),
                           "two_phases")


def _wait_for_byte(fd: int) -> bytes:
    ready, _, _ = select.select([fd], [], [], GUARD_SECONDS)
    assert ready, "the run worker never reached its first step's success"
    return os.read(fd, 1)


def test_a_terminate_held_by_the_run_worker_stops_the_engine_run(db_url, engine_url, monkeypatch, tmp_path):
    from dagster._core.events import DagsterEvent
    from dagster._grpc.impl import start_run_in_subprocess
    from dagster._grpc.types import ExecuteExternalJobArgs
    from dagster_shared.serdes import serialize_value

    fifo = tmp_path / "held"
    os.mkfifo(fifo)
    monkeypatch.setenv(FIFO_ENV, str(fifo))
    monkeypatch.setenv("DATABASE_URL", engine_url)  # the executor's stop reaches the deployment's database
    with dbmod.Database(db_url, max_size=2) as db:
        engine_run = runs.start_run(db, provider_for("example"), "held", options={"page_size": 20})
    recon = reconstructable(two_phases)
    with tmpfs_instance() as instance:
        run = instance.create_run_for_job(job_def=two_phases, run_config={"loggers": {"held": {}}},
                                          tags={tags.ENGINE_RUN: str(engine_run.id)},
                                          job_code_origin=recon.get_python_origin(),
                                          remote_job_origin=_remote_origin())
        instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value,
                                                   job_name=run.job_name), run_id=run.run_id)
        args = serialize_value(ExecuteExternalJobArgs(job_origin=_remote_origin(), run_id=run.run_id,
                                                      instance_ref=instance.get_ref()))
        ctx = multiprocessing.get_context("spawn")  # as the code server starts run workers
        queue, termination = ctx.Queue(), ctx.Event()
        worker = ctx.Process(target=start_run_in_subprocess, args=[args, recon, queue, termination])
        worker.start()
        try:
            fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            try:
                assert _wait_for_byte(fd) == b"h"
            finally:
                os.close(fd)
            instance.report_run_canceling(instance.get_run_by_id(run.run_id))  # the launcher's terminate
            termination.set()  # the code server's cancel_execution: the worker sends itself SIGINT
            worker.join(GUARD_SECONDS * 2)
            assert worker.exitcode is not None, "the run worker did not end"
        finally:
            if worker.is_alive():
                worker.kill()
                worker.join()
        finished = instance.get_run_by_id(run.run_id)
        succeeded = [r.event_log_entry.dagster_event.step_key for r in instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.STEP_SUCCESS).records]
        failed = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.STEP_FAILURE).records]
    with dbmod.Database(db_url, max_size=2) as db:
        engine_status = runs.get_run(db, engine_run.id).status
    assert succeeded == ["first"], f"the held terminate was lost: steps {succeeded} succeeded"
    assert finished.status == DagsterRunStatus.CANCELED, finished.status
    # raised on entering the next step's user code, before its body (no op handler turns it into a line)
    assert [(e.step_key, e.event_specific_data.error.cls_name) for e in failed] == [
        ("second", "DagsterExecutionInterruptedError")], [e.step_key for e in failed]
    assert engine_status in ("stopping", "stopped"), (
        f"the Dagster run was terminated but its engine run is {engine_status}: the held SIGINT never stopped it")
