"""Dagster's Postgres storages as the project configures them (migration_pipeline/storage.py, named
in dagster.yaml): the run storage's schema checks are not repeated on every run read."""
from __future__ import annotations

from migration_pipeline.storage import PooledPostgresRunStorage
from tests.dagster.support import example_instance


def test_run_reads_reflect_the_runs_table_once_not_per_read(db_url, tmp_path, monkeypatch):
    from dagster import DagsterRunStatus
    from dagster._core.storage.runs import sql_run_storage
    from dagster._core.test_utils import create_run_for_test

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        assert isinstance(instance.run_storage, PooledPostgresRunStorage)  # dagster.yaml names it
        run = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED)
        reflections = []
        inspect = sql_run_storage.db.inspect
        monkeypatch.setattr(sql_run_storage.db, "inspect", lambda *a, **k: reflections.append(1) or inspect(*a, **k))
        for _ in range(20):  # what `migrate run`'s watcher does every 0.25 s
            assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED
        assert len(reflections) <= 1, f"{len(reflections)} column reflections for 20 run reads"
    finally:
        instance.dispose()
