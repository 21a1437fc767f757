"""A step ending its own Dagster run CANCELING (its engine run was stopped from elsewhere or paused
by the engine), told apart from a terminate: the run is tagged `tags.CANCELED_BY_STEP` first, so
the watcher of a run executed in the `migrate` process (`launch.in_process.InProcessRun`) delivers
no interrupt for it. Without the tag, the watcher took that CANCELING for the UI's Terminate and
could interrupt the step between the status write and its Failure: the step then ended "stopped
by a terminate request", the engine run's log said "stopped from Dagster", and a pause of a failing
source was reported as an operator's stop (exit 3, not `output.SOURCE_FAILED`)."""
from __future__ import annotations

from typing import Any, NoReturn

from dagster import Failure

from migration_pipeline import tags


def canceled_by_step(run: Any) -> bool:
    """Whether the Dagster run `run` (a DagsterRun) was set CANCELING by one of its own steps
    (`cancel_this_run`): its CANCELED_BY_STEP tag names the run itself (a re-execution keeps its
    parent's tags, which name the parent)."""
    return run is not None and run.tags.get(tags.CANCELED_BY_STEP) == run.run_id


def cancel_this_run(context: Any, message: str) -> NoReturn:
    """End this Dagster run CANCELED, as a terminate from the UI does: the engine run was stopped
    from elsewhere (`migrate stop`, another launch's terminate) or paused by the engine, so Dagster
    tells the same story (a stop made the run FAILURE from the CLI, CANCELED from the UI). The run
    is tagged CANCELED_BY_STEP, then marked CANCELING (what Dagster's own terminate does), and the
    step ends with a one-line `Failure` (`message`): a run with a failed step that is CANCELING ends
    CANCELED (dagster/_core/execution/api.py, `job_execution_iterator`), and the step's event says
    why without an interrupt's stack trace."""
    context.log.warning(message)
    failure = Failure(description=message, allow_retries=False)
    context.instance.add_run_tags(context.run_id, {tags.CANCELED_BY_STEP: context.run_id})
    context.instance.report_run_canceling(context.run, message=message)
    raise failure
