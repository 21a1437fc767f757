"""A terminate stops the engine run in the Dagster run's own engine database - its `database`
resource as the run's config sets it (`executors.run_database`) - not in DATABASE_URL's: a run
whose resource names another database had its stop flag looked for in the wrong one, the stop
failed (only logged) and the engine run went on.

Real: a real engine run on real Postgres, a real Dagster run (execute_job, the project's
executor), and a real interrupt (`_thread.interrupt_main`, what Dagster's termination sends the run
worker) landing while the second step runs, outside any op's own stop handler.
"""
from __future__ import annotations

import _thread
import threading
import time

import pytest
from dagster import DagsterRunStatus, execute_job, job, op, reconstructable

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.instance import to_url
from migration_pipeline.lane.executors import stopping_in_process_executor
from migration_pipeline.resources import MigrationDatabase
from tests.conftest import _with_dbname

pytestmark = pytest.mark.timeout(180)


@op
def first_then(context):
    """A phase step; the terminate comes just after it returns."""
    threading.Timer(0.3, _thread.interrupt_main).start()
    return 1


@op
def phase_two(context, _after):
    """The next step: waits for the terminate, with no stop handler of its own."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.05)
    raise AssertionError("the terminate never reached the run")


@job(executor_def=stopping_in_process_executor(), resource_defs={"database": MigrationDatabase()})
def terminated_with_its_own_database():
    phase_two(first_then())


def _terminate(db_url: str, run_config: dict, monkeypatch) -> tuple[str, str | None]:
    """(the engine run's status, the Dagster run's STOPPED_ENGINE tag) after a terminate of a run
    whose config is `run_config`, DATABASE_URL naming a database that does not exist."""
    from tests.dagster.support import tmpfs_instance

    monkeypatch.setenv("DATABASE_URL", to_url(_with_dbname(db_url, "not_the_runs_database")))
    with dbmod.Database(db_url, max_size=2) as db:
        run = runs.start_run(db, provider_for("example"), "resourced", options={"page_size": 20})
    with tmpfs_instance() as instance:
        try:
            result = execute_job(reconstructable(terminated_with_its_own_database), instance=instance,
                                 tags={tags.ENGINE_RUN: str(run.id)}, run_config=run_config, raise_on_error=False)
            dagster_run = instance.get_run_by_id(result.run_id)
        except KeyboardInterrupt:  # Dagster re-raised the interrupt to its caller (this test)
            dagster_run = instance.get_runs()[0]
        assert dagster_run.status in (DagsterRunStatus.CANCELED, DagsterRunStatus.FAILURE), dagster_run.status
        stopped_tag = dagster_run.tags.get(tags.STOPPED_ENGINE)
    with dbmod.Database(db_url, max_size=2) as db:
        return runs.get_run(db, run.id).status, stopped_tag


def test_a_terminate_stops_the_engine_run_in_the_runs_own_database(db_url, monkeypatch):
    config = {"resources": {"database": {"config": {"url": to_url(db_url)}}}}
    engine_status, stopped_tag = _terminate(db_url, config, monkeypatch)
    assert engine_status in ("stopping", "stopped"), (
        f"the Dagster run was terminated but its engine run is {engine_status}: the stop flag was looked "
        "for in DATABASE_URL's database, not the run's `database` resource's")
    assert stopped_tag is not None
