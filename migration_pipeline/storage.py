"""Dagster's Postgres storages, holding one connection open per process instead of none.

dagster-postgres builds its run, event log and schedule storages on SQLAlchemy's NullPool ("to
prevent accumulating connections per DagsterInstance"): every storage call opens a new Postgres
connection and closes it. A `migrate run` of a small account made about 600 of them in its run
worker alone (every event of 16 steps, every run-tag read and write of the lane bookkeeping), ~3 s
of its wall time at 5 ms each and more on a loaded machine - plus the daemon's and the command's
polls (measured with cProfile: `psycopg2._connect`, 605 calls, 2.9 s of a 15.6 s run).

These subclasses are the same storages on a small pool: `pool_size=1` (one connection kept open per
process and URL, shared by the three storages: `_shared_engine`), overflow connections for
concurrent threads (the daemon's, the webserver's) closed when they are returned, as before; a
connection the server dropped (a restart, `pg_terminate_backend`) is replaced at checkout rather
than failing a call (`_replace_dropped`: a look at its socket, and a round trip only for one idle
longer than PING_IDLE_SECONDS). `dispose()` (DagsterInstance.dispose) closes the kept connection, so a
disposed instance holds nothing open (a test's DROP DATABASE is not blocked). The webserver's own
`optimize_for_webserver` replaces the engine with its pool, as it does for dagster-postgres.

Their connections commit asynchronously (`synchronous_commit=off`, ASYNC_COMMIT): Dagster's
storages commit every event on its own (its row, then its asset or check index rows), and waiting
for each commit's WAL flush was half of an event's cost on a busy machine (18.7 ms against 10 ms
per asset materialisation stored, load 6; ~150 events per small `migrate run`). What it
risks: a Postgres crash (not a process's) may lose the Dagster events and run updates of the
last fraction of a second before it (at most 3 x wal_writer_delay); the database stays
consistent, nothing is half-written, and a run the crash interrupted is left for run monitoring
and `migrate run`'s dead-process check as any run the crash killed. Commits are visible to other
sessions at once, as before. The engine's own connections (checkpoints, the ledger) are not these:
they keep synchronous commits.

dagster.yaml names them in its `run_storage:` / `event_log_storage:` / `schedule_storage:` blocks
(Dagster's per-storage configuration; `storage: postgres:` cannot name a class); every Dagster
process of the project (CLI, daemon, code server, run workers, webserver) imports this module
from the installed project.
"""
from __future__ import annotations

import select
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.exc import DisconnectionError

from migration_pipeline.alembic_later import storage_modules

# Dagster's SQL storage modules first, with alembic deferred (`alembic_later`): the event log
# imports below reach them, and imported from there they import alembic, mako and pygments at once
# (~0.1 CPU-s of each `migrate run`, whose launch imports this module through the definitions).
storage_modules()

from dagster._core.events import ASSET_EVENTS, DagsterEventType
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.base import AssetRecordsFilter
from dagster._core.storage.event_log.migration import ASSET_KEY_INDEX_COLS
from dagster._core.storage.event_log.schema import AssetCheckExecutionsTable, SqlEventLogStorageTable
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster._serdes import serialize_value
from dagster_postgres.event_log.event_log import CHANNEL_NAME
from dagster_postgres.run_storage import PostgresRunStorage
from dagster_postgres.schedule_storage import PostgresScheduleStorage
from dagster_postgres.utils import create_pg_engine, get_token_provider_from_config, pg_url_from_config

# SQLAlchemy's QueuePool settings of every storage engine here (the webserver's are its own). No
# `pool_pre_ping`: its round trip on every checkout was ~10% of a phase step's Dagster machinery
# under py-spy; `_replace_dropped` does its job without one (see there).
POOL: dict[str, Any] = {"pool_size": 1, "max_overflow": 20, "pool_recycle": 3600}
# Dagster's writes commit without waiting for the WAL flush (see the module docstring).
ASYNC_COMMIT = "-c synchronous_commit=off"
PING_IDLE_SECONDS = 5.0  # a connection back in the pool longer than this is pinged at checkout
_RETURNED = "migrate_returned_at"  # connection record info: when it was last returned (monotonic)


def _planned_types() -> tuple[Any, ...]:
    """The event types `PooledPostgresEventLogStorage.store_event_batch` stores in one transaction."""
    return (DagsterEventType.ASSET_MATERIALIZATION_PLANNED, DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED)


def _socket_says_dropped(dbapi_connection: Any) -> bool:
    """Whether an idle connection's socket has something to read or hung up. An idle Postgres
    connection is sent nothing unasked (this project never LISTENs on the storage's connections):
    a server that terminated the backend (`pg_terminate_backend`, a shutdown, a restart) sends its
    FATAL message and closes the socket, which is then readable. Unknown (no socket): True, so the
    caller pings."""
    if getattr(dbapi_connection, "closed", 0):
        return True
    try:
        fd = dbapi_connection.fileno()
    except Exception:  # noqa: BLE001 - a driver without a socket to look at: ping it
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


def _replace_dropped(engine: Any) -> None:
    """Pessimistic disconnect handling (SQLAlchemy's "custom pre-ping" recipe: a checkout event
    raising DisconnectionError makes the pool replace the connection and check out again), cheaper
    than `pool_pre_ping`: a connection is pinged (a `SELECT 1` round trip) only when its socket
    says the server hung up or sent something, or when it sat in the pool longer than
    PING_IDLE_SECONDS; otherwise it is handed out as is. A connection that fails the ping is
    replaced, not handed out."""
    dialect = engine.dialect  # not the engine: no cycle keeping a dropped storage's engine alive

    @event.listens_for(engine, "checkin")
    def returned(dbapi_connection: Any, record: Any) -> None:
        record.info[_RETURNED] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        returned_at = record.info.get(_RETURNED)
        if returned_at is None:  # new: just connected
            return
        if time.monotonic() - returned_at <= PING_IDLE_SECONDS and not _socket_says_dropped(dbapi_connection):
            return
        try:
            alive = dialect.do_ping(dbapi_connection)
        except Exception as e:  # noqa: BLE001 - any failure: a new connection instead
            raise DisconnectionError(f"storage connection dropped: {e}") from e
        if not alive:
            raise DisconnectionError("storage connection dropped")

# One engine per process and URL while any storage uses it (weak: a storage that is garbage
# collected takes its engine, and the connection it kept, with it once no other storage holds it).
_ENGINES: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def _shared_engine(url: str, token_provider: Any, options: str | None) -> Any:
    """The pooled engine for `url` in this process (token providers get an engine of their own)."""
    key = f"{url}\x00{options or ''}"
    engine = _ENGINES.get(key) if token_provider is None else None
    if engine is None:
        kwargs: dict[str, Any] = {"isolation_level": "AUTOCOMMIT", **POOL}
        kwargs["connect_args"] = {"options": f"{options} {ASYNC_COMMIT}" if options else ASYNC_COMMIT}
        engine = create_pg_engine(url, token_provider, **kwargs)
        _replace_dropped(engine)
        if token_provider is None:
            _ENGINES[key] = engine
    return engine


def _pool(storage: Any) -> None:
    """Swap the storage's NullPool engine (used once, by its own table check) for the shared pool."""
    unpooled = storage._engine
    storage._engine = _shared_engine(storage.postgres_url, getattr(storage, "_token_provider", None),
                                     unpooled.url.query.get("options"))
    unpooled.dispose()


def _config(config_value: Any) -> dict[str, Any]:
    return {"postgres_url": pg_url_from_config(config_value),
            "should_autocreate_tables": config_value.get("should_autocreate_tables", True),
            "token_provider": get_token_provider_from_config(config_value)}


class _Pooled:
    """What each pooled storage adds to its dagster-postgres class (see the module docstring): the
    shared engine swapped in after the class's own set-up, and closed again by `dispose`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _pool(self)

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: ANN001, ANN206 - Dagster's signature
        """Build the storage from dagster.yaml's config block (Dagster's ConfigurableClass hook)."""
        return cls(inst_data=inst_data, **_config(config_value))

    def dispose(self) -> None:
        """Dispose of the storage, then of its shared engine."""
        super().dispose()
        self._engine.dispose()


class _KeptSchema:
    """Schema answers remembered once true: a table or column Dagster's migrations added does not go
    away, so a True answer is kept for the storage's life; a False one is asked again (a migration
    may add it meanwhile), as before. dagster-postgres keeps its index checks the same way
    (`_index_migration_cache`)."""

    def _kept(self, name: str, ask: Any) -> bool:
        kept = self.__dict__.setdefault("_schema_seen", set())
        if name in kept:
            return True
        if ask():
            kept.add(name)
            return True
        return False


class PooledPostgresRunStorage(_Pooled, _KeptSchema, PostgresRunStorage):
    """PostgresRunStorage with a kept connection (see the module docstring), whose schema checks
    remember a column once they have seen it.

    Dagster's SqlRunStorage asks `has_run_stats_index_cols` on every run read (`get_run_records`,
    under `get_run_by_id` and `get_runs`) and `has_backfill_id_column` on every run written: each a
    SQLAlchemy column reflection (a catalog query plus its Python). A small `migrate run`, whose
    watcher reads its run every 0.25 s, spent ~0.44 s of CPU in them (py-spy). A column
    `dagster instance migrate` added does not go away, so a True answer is kept for the storage's
    life (`_KeptSchema`)."""

    def has_run_stats_index_cols(self) -> bool:
        """Dagster's answer, kept once True (`_KeptSchema`)."""
        return self._kept("run_stats_index_cols", super().has_run_stats_index_cols)

    def has_backfill_id_column(self) -> bool:
        """Dagster's answer, kept once True (`_KeptSchema`)."""
        return self._kept("backfill_id_column", super().has_backfill_id_column)

    def has_bulk_actions_selector_cols(self) -> bool:
        """Dagster's answer, kept once True (`_KeptSchema`)."""
        return self._kept("bulk_actions_selector_cols", super().has_bulk_actions_selector_cols)


_steps = threading.local()  # `steps_here`: this thread executes a run's steps
LATEST_SECONDS = 1.0  # how long a step's answer to "the latest materialisation of a partition" is reused


@contextmanager
def steps_here() -> Iterator[None]:
    """While inside, this thread executes a Dagster run's steps (the project's in-process
    executor): the event log storages here reuse a step's answer to "the latest materialisation of
    this asset partition" for its next checks (`_KeptLatest`). Nested scopes share the outer one."""
    outer = getattr(_steps, "on", False)
    _steps.on = True
    try:
        yield
    finally:
        _steps.on = outer


class _KeptLatest:
    """A step's check evaluations ask the same question once per check: Dagster resolves each
    AssetCheckResult's target materialisation with `fetch_materializations(asset key and the step's
    partition, limit 1)` - four identical lookups (two queries each) after a phase's
    materialisation, 36 a small run. On a thread executing steps (`steps_here`) the answer is kept
    and reused for the same question until this storage stores an asset event or deletes or wipes
    anything, or for LATEST_SECONDS at most: the step's checks all name the materialisation the
    first one found. Elsewhere (the webserver, the daemon, other threads) every lookup is asked."""

    def _latest_key(self, records_filter: Any, limit: int, cursor: Any, ascending: bool) -> Any:
        if not getattr(_steps, "on", False) or limit != 1 or cursor is not None or ascending:
            return None
        f = records_filter
        if not isinstance(f, AssetRecordsFilter) or f.asset_key is None or len(f.asset_partitions or ()) != 1:
            return None
        if any(v is not None for v in (f.after_timestamp, f.before_timestamp, f.after_storage_id,
                                        f.before_storage_id, f.storage_ids)):
            return None
        return (f.asset_key, f.asset_partitions[0])

    def fetch_materializations(self, records_filter: Any, limit: int, cursor: str | None = None,
                               ascending: bool = False) -> Any:
        """Dagster's answer; on a thread executing steps, a kept one for the same partition's latest
        materialisation (see the class docstring)."""
        key = self._latest_key(records_filter, limit, cursor, ascending)
        kept = self.__dict__.setdefault("_latest", {})
        hit = kept.get(key) if key is not None else None
        if hit is not None and time.monotonic() - hit[0] < LATEST_SECONDS:
            return hit[1]
        result = super().fetch_materializations(records_filter, limit, cursor=cursor, ascending=ascending)
        if key is not None:
            kept[key] = (time.monotonic(), result)
        return result

    def has_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> bool:
        """Dagster's answer; on a thread executing steps, a True one kept for LATEST_SECONDS
        (Dagster asks twice in a row for each partitioned output and input of a step, the key
        range's start and end: 34 queries a small run), forgotten when this storage deletes a
        partition."""
        if not getattr(_steps, "on", False):
            return super().has_dynamic_partition(partitions_def_name, partition_key)
        kept = self.__dict__.setdefault("_partitions", {})
        key = ("partition", partitions_def_name, partition_key)
        hit = kept.get(key)
        if hit is not None and time.monotonic() - hit[0] < LATEST_SECONDS:
            return True
        found = super().has_dynamic_partition(partitions_def_name, partition_key)
        if found:
            kept[key] = (time.monotonic(), True)
        return found

    def delete_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> None:
        """Dagster's; the kept answers forgotten."""
        self.__dict__.get("_partitions", {}).clear()
        self._forget_latest()
        super().delete_dynamic_partition(partitions_def_name, partition_key)

    def _forget_latest(self) -> None:
        self.__dict__.get("_latest", {}).clear()

    def store_event(self, event: Any) -> None:
        """Dagster's; an asset event forgets the kept answers first."""
        if event.is_dagster_event and event.dagster_event_type in ASSET_EVENTS:
            self._forget_latest()
        super().store_event(event)

    def delete_events(self, run_id: str) -> None:
        """Dagster's; the kept answers forgotten."""
        self._forget_latest()
        super().delete_events(run_id)

    def wipe_asset(self, asset_key: Any) -> None:
        """Dagster's; the kept answers forgotten."""
        self._forget_latest()
        super().wipe_asset(asset_key)

    def wipe_asset_partitions(self, asset_key: Any, partition_keys: Sequence[str]) -> None:
        """Dagster's; the kept answers forgotten."""
        self._forget_latest()
        super().wipe_asset_partitions(asset_key, partition_keys)

    def wipe(self) -> None:
        """Dagster's; the kept answers forgotten."""
        self.__dict__.get("_partitions", {}).clear()
        self._forget_latest()
        super().wipe()


class PooledPostgresEventLogStorage(_Pooled, _KeptSchema, _KeptLatest, PostgresEventLogStorage):
    """PostgresEventLogStorage with a kept connection (see the module docstring), whose schema
    checks remember a table or column once they have seen it (`_KeptSchema`).

    Dagster's SqlEventLogStorage asks `has_table` on every asset event it stores (asset_event_tags)
    and every asset check event (asset_check_executions), each a catalog query, and
    `has_asset_key_col` (a SQLAlchemy column reflection of asset_keys) on every asset record read:
    every phase step reads its upstream phase's records for data versions. In a small `migrate run`
    they were ~0.3 s of the steps under py-spy at load 7."""

    def has_table(self, table_name: str) -> bool:
        """Dagster's answer for `table_name`, kept once True (`_KeptSchema`)."""
        return self._kept(f"table {table_name}", lambda: super(PooledPostgresEventLogStorage, self).has_table(table_name))

    def has_asset_key_col(self, column_name: str) -> bool:
        """Dagster's answer for asset_keys' `column_name`, kept once True (`_KeptSchema`)."""
        return self._kept(f"asset_keys.{column_name}",
                          lambda: super(PooledPostgresEventLogStorage, self).has_asset_key_col(column_name))

    def store_event_batch(self, events: Sequence[Any]) -> None:
        """Store a run's planned events (asset materialisations and checks planned: what Dagster
        hands over in one batch when it creates a run, `instance.EVENT_BATCH_ENV`) in one transaction: one
        multi-row insert into event_logs, one round trip for their notifications, the asset keys'
        rows as `store_event` writes them, one multi-row insert into asset_check_executions. The
        same rows as storing them one by one (`store_event`: an insert and a NOTIFY per event, then
        its index rows - ~135 statements for a small run's 45 planned events, ~0.1 s of every
        launch); other batches as dagster-postgres stores them. Raises what the database raises,
        having written nothing (Dagster then stores the events one by one)."""
        self._forget_latest()
        if not events or not self.supports_asset_checks or not all(
                e.is_dagster_event and e.dagster_event_type in _planned_types() for e in events):
            super().store_event_batch(events)
            return
        self.has_secondary_index(ASSET_KEY_INDEX_COLS)  # asked (and kept) before the transaction holds the connection
        with self.index_transaction() as conn:
            rows = conn.execute(self.prepare_insert_event_batch(events).returning(
                SqlEventLogStorageTable.c.run_id, SqlEventLogStorageTable.c.id)).fetchall()
            conn.execute(text("SELECT pg_notify(:channel, n) FROM unnest(CAST(:ns AS text[])) AS n"),
                         {"channel": CHANNEL_NAME, "ns": [f"{run_id}_{event_id}" for run_id, event_id in rows]})
            stored = [(e, int(event_id)) for e, (_, event_id) in zip(events, rows, strict=True)]
            assets = [(e, i) for e, i in stored if e.dagster_event_type in ASSET_EVENTS and e.dagster_event.asset_key]
            self._store_asset_event_tags(conn, [e for e, _ in assets], [i for _, i in assets])
            for e, i in assets:
                self._store_asset_event(conn, e, i)
            checks = [self._planned_check_row(e, i) for e, i in stored if e.dagster_event_type not in ASSET_EVENTS]
            if checks:
                conn.execute(AssetCheckExecutionsTable.insert().values([row for rs in checks for row in rs]))

    def _planned_check_row(self, event: Any, event_id: int) -> list[dict[str, Any]]:
        """asset_check_executions' rows of a planned check event, as Dagster's
        `_store_asset_check_evaluation_planned` writes them (one per partition of its subset)."""
        planned = event.dagster_event.event_specific_data
        keys = planned.partitions_subset.get_partition_keys() if planned.partitions_subset else [None]
        return [dict(asset_key=planned.asset_key.to_string(), check_name=planned.check_name, partition=key,
                     run_id=event.run_id, execution_status=AssetCheckExecutionRecordStatus.PLANNED.value,
                     evaluation_event=serialize_value(event), evaluation_event_timestamp=self._event_insert_timestamp(event),
                     evaluation_event_storage_id=event_id) for key in keys]


class PooledPostgresScheduleStorage(_Pooled, PostgresScheduleStorage):
    """PostgresScheduleStorage with a kept connection (see the module docstring)."""
