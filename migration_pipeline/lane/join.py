"""A launch works on the engine run it joined when it was launched, even when that run ends before
the launch's steps begin.

The engine's policy (`runs.attach`) joins the tenant's live run when a run's first phase op asks.
A launch made while the tenant's run was live - the UI's "Materialize" of a tenant another launch
is migrating - can reach that op only after the run has succeeded (it waited in the run queue, its
run worker was slow to start); the op then meets a migrated tenant and refuses a new full run
(`runs.AlreadyMigrated`: the Dagster run CANCELED, "not starting a new run: run #N ... already
succeeded"), although the launch asked for nothing new. `migrate run` tags its Dagster run with
the run it joins as it places it (`cli.launching.joining_tags`); `join_at_launch` does the same for
any launch, from the executor, before the steps: the engine run that had started and not yet ended
when the Dagster run was created (its creation in Dagster's run storage is the launch's moment).
The phase ops then attach to it (`runs.attach`'s tagged run): the steps report its phases as it
closed them and the Dagster run ends as a join of a finished run does - succeeded with it.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from engine_core import runs
from engine_core.db import Database
from engine_core.errors import RunNotFound
from engine_core.models import Run
from migration_pipeline import tags


def joined_at(run: Run, launched: datetime) -> bool:
    """Whether `run` was live at `launched` (both timezone-aware): started then, not yet ended."""
    if run.started_at is None or run.started_at > launched:
        return False
    return run.finished_at is None or run.finished_at > launched


def join_at_launch(instance: Any, dagster_run_id: str, database: Callable[[], AbstractContextManager[Database]],
                   log: Any = None) -> int | None:
    """Tag the Dagster run with the engine run it joined at its launch (`tags.ENGINE_RUN`,
    `tags.SOURCE`, `tags.JOINED`) and return that run's id, when the Dagster run is a tenant's
    launch (`dagster/partition`) not yet attached to an engine run, neither a drainer, a sync nor a
    launch asking for a new run, and the tenant's latest run was live when it was created
    (`joined_at`) and is live or succeeded now (a failed or stopped one is the op's rerun either
    way). Else None, nothing written. `database` opens the run's own engine database - its
    `database` resource, which its steps use (`executors.run_database`) - only when the launch may
    join. Never raises: on any error the phase ops decide as before."""
    try:
        record = instance.get_run_record_by_id(dagster_run_id)
        if record is None:
            return None
        run_tags = record.dagster_run.tags
        tenant = run_tags.get(tags.PARTITION, "")
        if (not tenant or run_tags.get(tags.ENGINE_RUN) or run_tags.get(tags.ROLE) == tags.DRAINER
                or run_tags.get(tags.MODE) == tags.SYNC
                or run_tags.get(tags.NEW_RUN, "").strip().lower() in ("true", "yes", "1")):
            return None
        with database() as db:
            try:
                run = runs.latest_run(db, tenant)
            except RunNotFound:
                return None
        if run.status in ("failed", "stopped") or not joined_at(run, record.create_timestamp):
            return None
        instance.add_run_tags(dagster_run_id, {tags.ENGINE_RUN: str(run.id), tags.SOURCE: run.source,
                                               tags.JOINED: "true"})
        if log is not None:
            log.info(f"this launch joins {run.name}, live when it was launched"
                     + ("" if not run.terminal else f"; it has since {run.status}: the steps report its phases "
                                                     "as it closed them"))
        return run.id
    except Exception as e:  # noqa: BLE001 - the phase ops' own attach still decides
        if log is not None:
            log.warning(f"could not read which engine run this launch joined: {type(e).__name__}: {e}")
        return None
