"""Dagster's automatic retry of a dead tenant run does not execute once the tenant was taken in hand
since: its engine run stopped, succeeded (or failed) since, a later engine run, or a run of the
tenant launched by hand (a sensor's drainer does not count); a stop its parent's own interruption
made is resumed by the retry, unless the tenant was resumed by hand since. The retry reaches the instance's run
launcher (`MigrationRunLauncher.launch_run`, through `instance.launch_run` as the run queue launches
it) and ends CANCELED with the reason, unexecuted. With nothing done since, the retry is launched
(the control: run retries resume a dead run from its checkpoints)."""
from __future__ import annotations

import pytest
from dagster import DagsterRunStatus
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.storage.tags import RETRY_NUMBER_TAG, WILL_RETRY_TAG
from dagster._core.test_utils import create_run_for_test

from engine_core import db as dbmod
from engine_core import runs
from engine_core.config import Settings
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline import tags
from migration_pipeline.instance import to_url
from migration_pipeline.lane.terminate import stop_engine_run
from migration_pipeline.launcher import retry_superseded
from tests.dagster.support import tmpfs_instance

SMALL = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}
OVERRIDES = {"run_retries": {"enabled": True, "max_retries": 1},
             "run_launcher": {"module": "migration_pipeline.launcher", "class": "MigrationRunLauncher"}}


def _dead_run_and_its_retry(instance, tenant: str, engine_id: int, source: str = "example"):
    """A tenant run that attached engine run `engine_id` and failed, and the retry Dagster's daemon
    creates for it (`create_reexecuted_run`: parent, root and `dagster/retry_number`)."""
    run_tags = {tags.PARTITION: tenant, tags.ENGINE_RUN: str(engine_id), tags.SOURCE: source}
    parent = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED, tags=run_tags)
    instance.report_run_failed(parent, message="the run worker died")
    assert instance.get_run_by_id(parent.run_id).tags.get(WILL_RETRY_TAG) == "true"  # Dagster will retry it
    retry = create_run_for_test(instance, job_name="migrate_tenant", tags={**run_tags, RETRY_NUMBER_TAG: "1"},
                                parent_run_id=parent.run_id, root_run_id=parent.run_id)
    return parent, retry


@pytest.mark.parametrize("by_hand", ["stopped", "succeeded", "relaunched"])
def test_a_retry_does_not_execute_after_the_tenant_was_taken_in_hand(db_url, by_hand, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))  # the launcher reads the engine database as the daemon does
    with tmpfs_instance(overrides=OVERRIDES) as instance, dbmod.Database(db_url, max_size=6) as db:
        engine = runs.start_run(db, provider_for("example"), "t1", options=SMALL)
        parent, retry = _dead_run_and_its_retry(instance, "t1", engine.id)
        assert retry_superseded(instance, db, instance.get_run_by_id(retry.run_id)) is None  # the control
        if by_hand == "stopped":
            runs.stop(db, engine.id, Settings.from_env())
        elif by_hand == "succeeded":
            drain_threads(db, engine.id, width=2, providers=for_run)
        else:  # a `migrate run --tenant t1` (or the UI) attached it again
            create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.SUCCESS,
                                tags={tags.PARTITION: "t1", tags.ENGINE_RUN: str(engine.id)})
        why = retry_superseded(instance, db, instance.get_run_by_id(retry.run_id))
        assert why, by_hand
        before = runs.get_run(db, engine.id).status
        instance.launch_run(retry.run_id, workspace=None)  # the run queue's call; no code server is needed
        ended = instance.get_run_by_id(retry.run_id)
        assert ended.status == DagsterRunStatus.CANCELED
        messages = [e.message for e in instance.all_logs(retry.run_id) if e.message]
        assert any(m.startswith("not re-executed: ") and why in m for m in messages), messages
        assert runs.get_run(db, engine.id).status == before  # the engine run is left as it was


def test_a_drainer_or_another_tenant_is_not_a_hand_on_the_tenant(db_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    with tmpfs_instance(overrides=OVERRIDES) as instance, dbmod.Database(db_url, max_size=6) as db:
        engine = runs.start_run(db, provider_for("example"), "t2", options=SMALL)
        parent, retry = _dead_run_and_its_retry(instance, "t2", engine.id)
        create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                            tags={tags.PARTITION: "t2", tags.ROLE: tags.DRAINER})
        create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                            tags={tags.PARTITION: "other"})
        assert retry_superseded(instance, db, instance.get_run_by_id(retry.run_id)) is None
        with pytest.raises(DagsterInvariantViolationError, match="requires a workspace"):
            instance.launch_run(retry.run_id, workspace=None)  # handed on to Dagster's own launch
        # a run that is no automatic retry (a manual "Re-execute") is never held back
        manual = create_run_for_test(instance, job_name="migrate_tenant", parent_run_id=parent.run_id,
                                     root_run_id=parent.run_id, tags={tags.PARTITION: "t2"})
        runs.stop(db, engine.id, Settings.from_env())
        assert retry_superseded(instance, db, instance.get_run_by_id(manual.run_id)) is None


def test_a_retry_resumes_the_stop_its_parents_own_interruption_made_not_a_later_resume(db_url, monkeypatch):
    # `make ui` stopped while a run was going: its run worker was interrupted, the executor set the
    # engine run's stop flag and tagged the run; the next daemon's retry resumes it - unless the
    # tenant was resumed by hand meanwhile
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    with tmpfs_instance(overrides=OVERRIDES) as instance, dbmod.Database(db_url, max_size=6) as db:
        engine = runs.start_run(db, provider_for("example"), "t3", options=SMALL)
        parent, retry = _dead_run_and_its_retry(instance, "t3", engine.id)
        assert stop_engine_run(instance, parent.run_id) == engine.id  # what the interrupted worker does
        assert instance.get_run_by_id(parent.run_id).tags[tags.STOPPED_ENGINE] == str(engine.id)
        assert runs.get_run(db, engine.id).status in ("stopping", "stopped")
        assert retry_superseded(instance, db, instance.get_run_by_id(retry.run_id)) is None
        runs.stop_until_settled(db, engine.id, Settings.from_env())
        runs.resume(db, engine.id, provider_for("example"))  # `migrate resume t3` by hand
        why = retry_superseded(instance, db, instance.get_run_by_id(retry.run_id))
        assert why and "was resumed since" in why, why
