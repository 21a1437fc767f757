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


def _kept_backend(instance) -> int:
    """The server process of the storage's kept connection (pool_size 1: the one a call checks out)."""
    with instance.run_storage._engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()


def test_a_kept_connection_the_server_dropped_is_replaced_not_failed(db_url, tmp_path, monkeypatch):
    """`pg_terminate_backend` of the storage's kept connection (what a server restart does to it):
    the next storage call, a moment later, gets a new connection instead of failing."""
    import psycopg
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        run = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED)
        for _ in range(2):
            pid = _kept_backend(instance)
            with psycopg.connect(db_url, autocommit=True) as admin:
                # waits (up to 5 s) until the backend is gone: its socket is closed by then
                assert admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]
            assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED
            assert _kept_backend(instance) != pid
    finally:
        instance.dispose()


def test_a_connection_used_a_moment_ago_is_not_pinged_at_checkout(db_url, tmp_path, monkeypatch):
    """No `SELECT 1` round trip per checkout (`pool_pre_ping` made one for every storage call: ~10%
    of a phase step's Dagster machinery, issue 11): a connection back in the pool for less than
    PING_IDLE_SECONDS whose socket is quiet is handed out as is; one idle longer is pinged."""
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from migration_pipeline import storage

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        run = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED)
        dialect = instance.run_storage._engine.dialect
        pings = []
        do_ping = dialect.do_ping
        monkeypatch.setattr(dialect, "do_ping", lambda conn: pings.append(1) or do_ping(conn))
        for _ in range(20):
            assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED
        assert pings == [], f"{len(pings)} pings for 20 run reads"
        monkeypatch.setattr(storage, "PING_IDLE_SECONDS", 0.0)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED
        assert pings, "a connection idle longer than PING_IDLE_SECONDS was not pinged"
    finally:
        instance.dispose()


def test_asset_events_and_reads_ask_the_event_log_schema_once_not_per_event(db_url, tmp_path, monkeypatch):
    """Dagster's event log storage asks whether asset_event_tags exists on every asset event it
    stores (a catalog query) and reflects asset_keys' columns on every asset record read; kept once
    true (`_KeptSchema`), 20 materialisations and reads ask each table and column at most once."""
    from dagster import AssetKey, AssetMaterialization
    from dagster._core.storage.event_log import sql_event_log

    from migration_pipeline.storage import PooledPostgresEventLogStorage

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        storage = instance.event_log_storage
        assert isinstance(storage, PooledPostgresEventLogStorage)  # dagster.yaml names it
        tables, reflections = [], []
        dialect = storage._engine.dialect
        has_table = dialect.has_table
        monkeypatch.setattr(dialect, "has_table", lambda conn, name, *a, **k: tables.append(name) or has_table(conn, name, *a, **k))
        inspect = sql_event_log.db.inspect
        monkeypatch.setattr(sql_event_log.db, "inspect", lambda *a, **k: reflections.append(1) or inspect(*a, **k))
        key = AssetKey(["schema_probe"])
        for i in range(20):
            instance.report_runless_asset_event(AssetMaterialization(key, tags={"n": str(i)}))
            assert instance.get_asset_records([key])[0].asset_entry.last_materialization is not None
        assert len(tables) == len(set(tables)), f"has_table asked {len(tables)} times: {sorted(set(tables))}"
        # one per column asked (cached_status_data, last_materialization_timestamp), not one per read
        assert len(reflections) <= 2, f"{len(reflections)} asset_keys reflections for 20 reads"
    finally:
        instance.dispose()


def test_dagster_storage_commits_asynchronously_the_engine_does_not(db_url, tmp_path, monkeypatch, db):
    """The storages' connections run with synchronous_commit off (each event's commit waited for its
    WAL flush: half an event's cost on a busy machine, issue 11); the engine's keep the server's."""
    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        for storage in (instance.run_storage, instance.event_log_storage, instance.schedule_storage):
            with storage._engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
        assert db.sql("SHOW synchronous_commit")[0]["synchronous_commit"] == "on"
    finally:
        instance.dispose()
