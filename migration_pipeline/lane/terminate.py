"""A terminate stops the engine run, wherever it lands.

Terminating a Dagster run raises `DagsterExecutionInterruptedError` (a BaseException) in the run's
main thread only (DAGSTER_NOTES.md trap 6); worker threads run on. Whatever catches it - the slot's
drain, the phase op, the executor around every step - sets the stop flag of the engine run the
Dagster run is tagged with (`stop_engine_run`), so the engine run stops at its next checkpoint and
relaunching the partition resumes it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from dagster import RunsFilter
from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES

from engine_core import db as dbmod
from engine_core import runs
from engine_core.db import Database
from migration_pipeline import tags

Opener = Callable[[], AbstractContextManager[Database]]


@contextmanager
def hold_interrupts() -> Iterator[None]:
    """A second Ctrl-C / terminate must not cut the stop short.

    Dagster's `capture_interrupts`: an interrupt landing inside is dropped on exit (its flag is
    cleared, not handed to the enclosing handler). So enter it only once the terminate has raised (a
    stop handler) or after the run's last step: a run worker gets ONE SIGINT per terminate, and one
    landing in a hold entered between steps would never reach the next step
    (tests/dagster/test_run_worker_terminate_held.py)."""
    try:
        from dagster._utils.interrupts import capture_interrupts
    except ImportError:  # pragma: no cover - the helper moved
        yield
        return
    with capture_interrupts():
        yield


def stop_on_interrupt(instance, dagster_run_id: str, log=None, database: Opener | None = None) -> int | None:
    """The engine run a terminated Dagster run drives gets its stop flag (`stop_engine_run`, in
    `database`), unless another launch (not a drainer) of the tenant is in flight on it: the engine
    id, or None. Errors are logged, never raised: the termination goes on."""
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
        return stop_engine_run(instance, dagster_run_id, log, database)
    except Exception:  # noqa: BLE001 - the termination matters more
        (log or logging.getLogger(__name__)).exception("could not stop the engine run of %s", dagster_run_id)
        return None


def stop_engine_run(instance: Any, dagster_run_id: str, log: Any = None, database: Opener | None = None) -> int | None:
    """Set the stop flag of the engine run a Dagster run attached to (its `migration/run_id` tag);
    the engine run id, or None when the run never attached. `database` opens the engine database
    that run lives in: within the run, its own `database` resource (`executors.run_database`);
    None, the deployment's (DATABASE_URL, else the embedded server), for a caller outside the run
    (the `migrate` command that launched it). Errors are logged, not raised: the terminate goes on
    either way."""
    run = instance.get_run_by_id(dagster_run_id)
    engine_run = (run.tags.get(tags.ENGINE_RUN, "") if run is not None else "")
    if not engine_run.isdigit():
        return None
    try:
        with (database or _deployment_database)() as db:
            stopped = runs.stop(db, int(engine_run))
        instance.add_run_tags(dagster_run_id, {tags.STOPPED_ENGINE: engine_run})
        if log is not None:
            log.warning(f"terminated: stop requested for {stopped.name}; the steps on the worker hosts stop at "
                        "their next task boundary and keep their checkpoints")
    except Exception as e:  # the terminate must not fail on this
        if log is not None:
            log.error(f"terminated, but the stop flag of engine run {engine_run} could not be set: {e}")
    return int(engine_run)


def _deployment_database() -> Database:
    """One connection to the deployment's engine database (DATABASE_URL, else the embedded server)."""
    return dbmod.connect(max_size=1, apply=False)
