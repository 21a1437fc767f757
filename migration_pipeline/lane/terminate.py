"""A terminate stops the engine run, wherever it lands.

Terminating a Dagster run raises `DagsterExecutionInterruptedError` (a BaseException) in the run's
main thread only (DAGSTER_NOTES.md trap 6); worker threads run on. Whatever catches it - the slot's
drain, the phase op, the executor around every step - sets the stop flag of the engine run the
Dagster run is tagged with (`stop_engine_run`), so the engine run stops at its next checkpoint and
relaunching the partition resumes it.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster import RunsFilter
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from engine_core import db as dbmod
from engine_core import runs
from migration_pipeline import tags


@contextmanager
def hold_interrupts() -> Iterator[None]:
    """A second Ctrl-C / terminate must not cut the stop short."""
    try:
        from dagster._utils.interrupts import capture_interrupts
    except ImportError:  # pragma: no cover - the helper moved
        yield
        return
    with capture_interrupts():
        yield


def stop_on_interrupt(instance, dagster_run_id: str, log=None) -> int | None:
    """The engine run a terminated Dagster run drives gets its stop flag (`stop_engine_run`),
    unless another launch (not a drainer) of the tenant is in flight on it: the engine id, or None.
    Errors are logged, never raised: the termination goes on."""
    try:
        run = instance.get_run_by_id(dagster_run_id)
        engine = run.tags.get(tags.ENGINE_RUN, "") if run is not None else ""
        if not engine.isdigit():
            return None
        others = [r for r in instance.get_runs(filters=RunsFilter(tags={tags.ENGINE_RUN: engine},
                                                                  statuses=list(IN_PROGRESS_RUN_STATUSES)))
                  if r.run_id != dagster_run_id and r.tags.get(tags.ROLE) != tags.DRAINER]
        if others:
            return None
        return stop_engine_run(instance, dagster_run_id, log)
    except Exception:  # noqa: BLE001 - the termination matters more
        (log or logging.getLogger(__name__)).exception("could not stop the engine run of %s", dagster_run_id)
        return None


def stop_engine_run(instance: Any, dagster_run_id: str, log: Any = None) -> int | None:
    """Set the stop flag of the engine run a Dagster run attached to (its `migration/run_id` tag);
    the engine run id, or None when the run never attached. Errors are logged, not raised: the
    terminate goes on either way."""
    run = instance.get_run_by_id(dagster_run_id)
    engine_run = (run.tags.get(tags.ENGINE_RUN, "") if run is not None else "")
    if not engine_run.isdigit():
        return None
    try:
        db = dbmod.connect(max_size=1, apply=False)
        try:
            stopped = runs.stop(db, int(engine_run))
        finally:
            db.close()
        instance.add_run_tags(dagster_run_id, {tags.STOPPED_ENGINE: engine_run})
        if log is not None:
            log.warning(f"terminated: stop requested for {stopped.name}; the steps on the worker hosts stop at "
                        "their next task boundary and keep their checkpoints")
    except Exception as e:  # the terminate must not fail on this
        if log is not None:
            log.error(f"terminated, but the stop flag of engine run {engine_run} could not be set: {e}")
    return int(engine_run)
