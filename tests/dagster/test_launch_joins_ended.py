"""A launch made while the tenant's engine run was live - the UI's "Materialize" of a tenant another
launch is migrating - works on that run even when it has succeeded before the launch's steps
begin: the Dagster run is tagged with it (`migration/run_id`, `migration/joined`), its phases are
materialised as that run closed them, the Dagster run succeeds, and no engine run starts. It was
refused as a new run on a migrated tenant ("not starting a new run: run #N ... already succeeded"),
the Dagster run CANCELED, although the launch had asked for nothing new. A launch made after the run
ended is still refused (test_ui_leftovers).

Real: a real engine run on real Postgres, a Dagster run created (launched) while it is live, the run
drained to its end, then the Dagster run executed as a run worker does (`execute_run`) with the
project's executor.
"""
from __future__ import annotations

import pytest
from dagster import DagsterRunStatus, Definitions
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.execution.api import execute_run

from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline import tags
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.lane.executors import stopping_in_process_executor
from tests.conftest import _with_dbname
from tests.dagster.support import resources, tmpfs_instance
from tests.engine.support import FAST

pytestmark = pytest.mark.timeout(180)
TINY = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def _tenant_job(engine_url: str):
    defs = Definitions(assets=build_phase_assets("example"), resources=resources(engine_url, options=TINY),
                       executor=stopping_in_process_executor())
    return defs.resolve_implicit_global_asset_job_def()


def _runs_of(db, tenant: str) -> list[int]:
    return [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = %(t)s ORDER BY id", {"t": tenant})]


def test_a_launch_made_while_the_run_was_live_reports_it_when_it_ended_before_the_steps(db, engine_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", engine_url)  # the run worker's engine database
    live = runs.start_run(db, provider_for("example"), "followed", options=TINY, settings=FAST)
    job = _tenant_job(engine_url)
    with tmpfs_instance() as instance:
        instance.add_dynamic_partitions("tenants", ["followed"])
        launched = instance.create_run_for_job(job_def=job, tags={tags.PARTITION: "followed"})  # the UI's launch
        drain_threads(db, live.id, width=2, settings=FAST, providers=for_run)  # the run ends meanwhile
        assert runs.get_run(db, live.id).status == "succeeded"

        result = execute_run(InMemoryJob(job), instance.get_run_by_id(launched.run_id), instance)

        run = instance.get_run_by_id(launched.run_id)
        failures = [e.step_failure_data.user_failure_data.description for e in result.all_events
                    if e.event_type_value == "STEP_FAILURE" and e.step_failure_data.user_failure_data]
        assert run.status == DagsterRunStatus.SUCCESS, (run.status, failures)
        assert run.tags.get(tags.ENGINE_RUN) == str(live.id) and run.tags.get(tags.JOINED) == "true", run.tags
        materialised = {e.asset_key.path[-1] for e in result.get_asset_materialization_events()}
        assert materialised == {"phase_1_companies", "phase_2_contacts", "phase_3_deals", "phase_4_activities",
                                "phase_5_notes"}, materialised
        assert _runs_of(db, "followed") == [live.id], "no engine run was started"


def test_the_join_at_launch_reads_the_runs_own_database_resource(db, engine_url, monkeypatch):
    """The launch joins through the run's `database` resource (`executors.run_database`), not through
    DATABASE_URL: here the resource names the engine database and DATABASE_URL another one, where no
    run of the tenant is (the join had read it there, found none, and the launch was refused)."""
    monkeypatch.setenv("DATABASE_URL", to_url(_with_dbname(engine_url, "not_the_runs_database")))
    live = runs.start_run(db, provider_for("example"), "resourced", options=TINY, settings=FAST)
    job = _tenant_job(engine_url)  # its `database` resource: the engine database
    with tmpfs_instance() as instance:
        instance.add_dynamic_partitions("tenants", ["resourced"])
        launched = instance.create_run_for_job(job_def=job, tags={tags.PARTITION: "resourced"})
        drain_threads(db, live.id, width=2, settings=FAST, providers=for_run)
        execute_run(InMemoryJob(job), instance.get_run_by_id(launched.run_id), instance)
        run = instance.get_run_by_id(launched.run_id)
        assert run.status == DagsterRunStatus.SUCCESS, run.status
        assert run.tags.get(tags.ENGINE_RUN) == str(live.id) and run.tags.get(tags.JOINED) == "true", run.tags
        assert _runs_of(db, "resourced") == [live.id]


def test_a_launch_made_after_the_run_ended_is_still_refused(db, engine_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", engine_url)
    done = runs.start_run(db, provider_for("example"), "finished", options=TINY, settings=FAST)
    drain_threads(db, done.id, width=2, settings=FAST, providers=for_run)
    job = _tenant_job(engine_url)
    with tmpfs_instance() as instance:
        instance.add_dynamic_partitions("tenants", ["finished"])
        launched = instance.create_run_for_job(job_def=job, tags={tags.PARTITION: "finished"})
        execute_run(InMemoryJob(job), instance.get_run_by_id(launched.run_id), instance)
        run = instance.get_run_by_id(launched.run_id)
        assert run.status == DagsterRunStatus.CANCELED and tags.ENGINE_RUN not in run.tags, (run.status, run.tags)
        assert _runs_of(db, "finished") == [done.id]
