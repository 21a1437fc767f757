"""Stopping a launched Dagster run: cancelled from the queue or terminated, its engine run's stop
flag set, or marked CANCELED when no run worker will ever end it."""
from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from dagster import DagsterInstance, DagsterRunStatus

from migration_pipeline.lane.terminate import stop_engine_run
from migration_pipeline.launch.signals import INTERRUPT_WAIT_SECONDS
from migration_pipeline.launch.statuses import FINISHED

# Who stopped a run when the command that launched it did (its Ctrl-C, a signal, its queue timeout):
# the phase op, interrupted, records it in the engine run's log (`runs.note_stop`) rather than
# "from Dagster", which it says of a terminate from the UI.
STOPPED_BY = "migration/stopped_by"


def stopped_by_launcher(run_id: str) -> str:
    """The `STOPPED_BY` tag's value a launching command sets before it stops the run it launched."""
    return f"by the `migrate` command that launched it (Dagster run {run_id[:8]})"


def run_started_at(instance: DagsterInstance, run_id: str) -> datetime:
    """When the Dagster run started (else was created): who stopped its engine run since then is
    this run's story (`runs.stop_noted`); the epoch when the run is unknown."""
    record = instance.get_run_record_by_id(run_id)
    at = (record.start_time or record.create_timestamp.timestamp()) if record is not None else 0.0
    return datetime.fromtimestamp(at, timezone.utc)


def stop_launched_run(instance: DagsterInstance, run_id: str, echo: Callable[[str], None] = print,
                      wait: float = INTERRUPT_WAIT_SECONDS) -> DagsterRunStatus | None:
    """Stop the Dagster run a command launched, and the engine run it drives: a queued run is
    cancelled from the queue; a started one has its engine run's stop flag set
    (`deploy.stop_engine_run`: every worker of the run, drainers included, stops at its next task
    boundary, keeping its checkpoints) and is terminated through the run launcher, so it ends
    CANCELED as a terminate from the UI does (the one-story rule), and tagged `dagster/max_retries=0`
    so Dagster's run retries never re-execute it. Waits up to `wait` seconds for
    it to finish; returns its status then (None: no such run). Resumable: launching the partition
    again resumes the engine run from its checkpoints."""
    from dagster._core.storage.tags import MAX_RETRIES_TAG

    run = instance.get_run_by_id(run_id)
    if run is None:
        return None
    if run.status not in FINISHED:
        # A stop the user asked for is not retried: a run that then fails (its worker dies with
        # our daemon, or it was still starting) would be re-executed by Dagster's run retries
        # (dagster.yaml), migrating again after the user asked to stop.
        instance.add_run_tags(run_id, {MAX_RETRIES_TAG: "0",
                                       STOPPED_BY: stopped_by_launcher(run_id)})
    deadline = time.monotonic() + wait
    asked = False
    while run is not None and run.status not in FINISHED:
        if run.status != DagsterRunStatus.QUEUED:
            stop_engine_run(instance, run_id)  # idempotent; the tag may appear once the op attaches
        if not asked or run.status == DagsterRunStatus.QUEUED:
            try:
                instance.run_coordinator.cancel_run(run_id)
                asked = True
            except Exception as e:  # noqa: BLE001 - the engine's stop flag is set either way
                echo(f"could not terminate Dagster run {run_id} through its launcher: {e}")
                asked = True
            run = instance.get_run_by_id(run_id)
            if run is not None and run.status in (DagsterRunStatus.STARTING, DagsterRunStatus.CANCELING) \
                    and not worker_started(instance, run_id):
                # asked to stop before its run worker started (whichever daemon launched it: ours or
                # the UI's): the launcher could not reach a worker, the worker that starts next finds
                # the run CANCELING and executes nothing, and Dagster then marked it FAILURE ("marked
                # as failed from outside the execution context"). It is CANCELED
                mark_canceled(instance, run_id, "stopped by the command that launched it before its run worker started; "
                                                "nothing was executed")
                run = instance.get_run_by_id(run_id)
                continue
        if time.monotonic() >= deadline:
            break
        time.sleep(1)
        run = instance.get_run_by_id(run_id)
    stop_engine_run(instance, run_id)
    return run.status if run is not None else None


def worker_started(instance: DagsterInstance, run_id: str) -> bool:
    """Whether a run worker has begun executing the run (its RUN_START event)."""
    from dagster import DagsterEventType

    return bool(instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_START, limit=1).records)


def mark_canceled(instance: DagsterInstance, run_id: str, why: str) -> None:
    """A run left in progress after its daemon (and so its run worker) was stopped: CANCELED, with
    `why`, so Dagster does not show a run as started for ever (the local launcher cannot see a dead
    worker; DAGSTER_NOTES.md trap 7)."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status not in FINISHED:
        instance.report_run_canceling(run, message=why)
        instance.report_run_canceled(run, message=why)
