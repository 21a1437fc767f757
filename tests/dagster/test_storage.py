"""Dagster's Postgres storages as the project configures them (migration_pipeline/storage.py, named
in dagster.yaml): the run storage's schema checks are not repeated on every run read."""
from __future__ import annotations

from migration_pipeline.storage import PooledPostgresRunStorage
from tests.dagster.support import example_instance, planned_rows


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


def test_a_runs_planned_events_are_stored_in_one_transaction_as_one_by_one(db_url, tmp_path, monkeypatch):
    """A run's planned materialisations and checks (what Dagster writes when it creates a run) go to
    the storage as one batch (`instance.EVENT_BATCH_ENV`), stored by `store_event_batch` in one
    transaction: the same rows as storing them one by one (Dagster's default), and one
    `store_event_batch` call instead of a `store_event` per event."""
    from dagster import (AssetCheckResult, AssetCheckSpec, AssetKey, DynamicPartitionsDefinition, Output, asset,
                         define_asset_job, Definitions)

    from migration_pipeline.instance import EVENT_BATCH_ENV

    tenants = DynamicPartitionsDefinition(name="probe_tenants")

    @asset(key=AssetKey(["probe", "one"]), partitions_def=tenants,
           check_specs=[AssetCheckSpec("rows", asset=AssetKey(["probe", "one"])),
                        AssetCheckSpec("ledger", asset=AssetKey(["probe", "one"]))])
    def one():
        yield Output(1)
        yield AssetCheckResult(check_name="rows", passed=True)
        yield AssetCheckResult(check_name="ledger", passed=True)

    @asset(key=AssetKey(["probe", "two"]), partitions_def=tenants, deps=[one],
           check_specs=[AssetCheckSpec("rows", asset=AssetKey(["probe", "two"]))])
    def two():
        yield Output(2)
        yield AssetCheckResult(check_name="rows", passed=True)

    job = Definitions(assets=[one, two], jobs=[define_asset_job("probe_job", partitions_def=tenants)]
                      ).resolve_job_def("probe_job")
    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        instance.add_dynamic_partitions("probe_tenants", ["acme"])
        storage = type(instance.event_log_storage)
        calls = {"batch": 0, "one": 0}
        batch, single = storage.store_event_batch, storage.store_event
        monkeypatch.setattr(storage, "store_event_batch", lambda s, es: calls.__setitem__("batch", calls["batch"] + 1) or batch(s, es))
        monkeypatch.setattr(storage, "store_event", lambda s, e: calls.__setitem__("one", calls["one"] + 1) or single(s, e))
        rows = {}
        for size in ("0", "10000"):
            monkeypatch.setenv(EVENT_BATCH_ENV, size)
            calls.update(batch=0, one=0)
            run = instance.create_run_for_job(job, tags={"dagster/partition": "acme"})
            rows[size] = planned_rows(instance, run.run_id)
            assert calls == ({"batch": 0, "one": 5} if size == "0" else {"batch": 1, "one": 0}), (size, calls)
        assert len(rows["0"]["events"]) == 5 and len(rows["0"]["checks"]) == 3 and len(rows["0"]["asset_keys"]) == 2
        assert rows["10000"] == rows["0"]
    finally:
        instance.dispose()


def test_opening_the_instance_does_not_import_alembic_a_new_database_still_gets_stamped(db_url, tmp_path, monkeypatch):
    """`migrate run` opens the instance without importing alembic (`alembic_later`: ~0.08 s of every
    launch); alembic is imported when a storage needs it - here a new database's tables stamped
    with Dagster's schema revision, then `upgrade` (what `dagster instance migrate` runs)."""
    import subprocess
    import sys

    instance, env = example_instance(db_url, tmp_path, monkeypatch)  # a new storage: created and stamped
    try:
        assert instance.event_log_storage.alembic_version()[0] is not None
        instance.upgrade()
    finally:
        instance.dispose()
    probe = ("import sys\nfrom migration_pipeline.instance import open_instance\nimport os\n"
             "i = open_instance(dict(os.environ))\ni.get_runs(limit=1)\nprint('alembic' in sys.modules)\ni.dispose()")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_a_steps_checks_ask_for_the_latest_materialisation_once_and_a_new_one_is_seen(db_url, tmp_path, monkeypatch):
    """On a thread executing a run's steps (`storage.steps_here`), the same "latest materialisation
    of this partition" lookup (what each AssetCheckResult's target resolution asks) is asked of the
    database once, until an asset event is stored: then the new materialisation is what the next
    lookup answers. Outside steps every lookup is asked."""
    from dagster import AssetKey, AssetMaterialization
    from dagster._core.storage.event_log.base import AssetRecordsFilter
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    from migration_pipeline import storage

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        key = AssetKey(["probe", "latest"])
        instance.add_dynamic_partitions("tenants", ["acme"])
        asked = []
        ask = SqlEventLogStorage._get_event_records_result
        monkeypatch.setattr(SqlEventLogStorage, "_get_event_records_result",
                            lambda self, *a, **k: asked.append(1) or ask(self, *a, **k))

        def latest():
            records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=["acme"]),
                                                      limit=1).records
            return records[0].storage_id if records else None

        def materialise():
            instance.report_runless_asset_event(AssetMaterialization(key, partition="acme"))
            return latest()

        first = materialise()
        asked.clear()
        assert [latest() for _ in range(4)] == [first] * 4 and len(asked) == 4  # outside steps: asked each time
        with storage.steps_here():
            asked.clear()
            assert [latest() for _ in range(4)] == [first] * 4
            assert len(asked) == 1, f"{len(asked)} lookups for 4 identical questions in a step"
            second = materialise()  # an asset event stored here: the kept answer is forgotten
            assert second != first and latest() == second
            monkeypatch.setattr(storage, "LATEST_SECONDS", 0.0)
            asked.clear()
            latest()
            assert len(asked) == 1  # kept no longer than LATEST_SECONDS
    finally:
        instance.dispose()


def test_a_steps_partition_lookups_are_asked_once_and_a_deleted_partition_is_seen(db_url, tmp_path, monkeypatch):
    """On a thread executing steps, Dagster's repeated "does this tenant partition exist" (twice
    per partitioned input and output: a key range's start and end) is asked once while the answer
    is yes; the partition deleted here, the next answer is no. Outside steps every one is asked."""
    from dagster._core.storage.event_log.sql_event_log import SqlEventLogStorage

    from migration_pipeline import storage

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        instance.add_dynamic_partitions("tenants", ["acme"])
        asked = []
        ask = SqlEventLogStorage.has_dynamic_partition
        monkeypatch.setattr(SqlEventLogStorage, "has_dynamic_partition",
                            lambda self, *a: asked.append(1) or ask(self, *a))
        assert all(instance.has_dynamic_partition("tenants", "acme") for _ in range(4)) and len(asked) == 4
        with storage.steps_here():
            asked.clear()
            assert all(instance.has_dynamic_partition("tenants", "acme") for _ in range(4)) and len(asked) == 1
            assert not instance.has_dynamic_partition("tenants", "other")
            instance.delete_dynamic_partition("tenants", "acme")
            assert not instance.has_dynamic_partition("tenants", "acme")
    finally:
        instance.dispose()
