"""Dagster's own instance: storage on the engine's Postgres server, and the DAGSTER_HOME the CLI uses.

One place derives Dagster's storage URL from the engine's database settings: SQLAlchemy 2.1 must
be told `postgresql+psycopg2://` (with a bare `postgresql://` it picks psycopg 3 and dagster-postgres
fails on every event write, dagster-io/dagster#33958), while the engine keeps plain psycopg 3 URLs.

Storage is per engine database: the engine database `acme` gets Dagster's storage in the database
`acme_dagster` on the same server (created when missing), so two engine databases on one server
never share a run queue, a lane or a daemon heartbeat. When that database may not be created,
Dagster's tables go into the engine's own database (their names do not collide with the engine's).
`MIGRATE_DAGSTER_STORAGE_URL` overrides the derivation.

The instance template is `dagster.yaml` at the repository root (beside `workspace.yaml`); the
commands render it into DAGSTER_HOME with the lane width filled in.
"""
from __future__ import annotations

import logging
import os
import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import yaml
from psycopg import conninfo

from engine_core import db as dbmod
from engine_core.config import Settings, migrate_home
from engine_core.errors import ConfigError, DatabaseUnavailable
from migration_pipeline.alembic_later import storage_modules

log = logging.getLogger(__name__)

STORAGE_URL_ENV = "MIGRATE_DAGSTER_STORAGE_URL"  # dagster.yaml reads the storage URL from here
# Dagster's switch for handing a batch of events to the event log storage at once (0, its default:
# one `store_event` each). Only a run's planned events come in batches (ended by a marker: the size
# is a ceiling, nothing waits for it), stored in one transaction (`storage.PooledPostgresEventLogStorage.
# store_event_batch`). Set for every Dagster process of the project (`dagster_env`, `get_instance`).
EVENT_BATCH_ENV = "DAGSTER_EVENT_BATCH_SIZE"
EVENT_BATCH_SIZE = "10000"
STORAGE_SUFFIX = "_dagster"  # Dagster's storage database = the engine database's name + this
MAX_IDENTIFIER = 63  # Postgres truncates longer database names (NAMEDATALEN - 1 bytes)
# The instance template: the repository root, beside workspace.yaml (the project runs from its clone).
INSTANCE_TEMPLATE = Path(__file__).resolve().parents[1] / "dagster.yaml"


def url_params(url_or_dsn: str) -> dict[str, str]:
    """Connection parameters of a postgresql:// URL or a key=value DSN (the test fixtures' form)."""
    return {k: str(v) for k, v in conninfo.conninfo_to_dict(url_or_dsn).items() if v is not None}


def to_url(url_or_dsn: str, *, scheme: str = "postgresql", dbname: str | None = None) -> str:
    """A URL for the same server; a unix-socket host goes in the query string, as libpq reads it."""
    p = url_params(url_or_dsn)
    if dbname is not None:
        p["dbname"] = dbname
    user = quote(p.pop("user", ""), safe="")
    password = p.pop("password", None)
    userinfo = user + (":" + quote(password, safe="") if password else "")
    host = p.pop("host", "")
    port = p.pop("port", "")
    netloc = ""
    query: dict[str, str] = {}
    if host.startswith("/") or "," in host:
        query["host"] = host
        if port:
            query["port"] = port
    else:
        netloc = host + (f":{port}" if port else "")
    database = quote(p.pop("dbname", ""), safe="")
    query.update(p)  # sslmode and friends ride along
    at = f"{userinfo}@" if userinfo else ""
    return f"{scheme}://{at}{netloc}/{database}" + (f"?{urlencode(query)}" if query else "")


def storage_database_name(engine_database: str) -> str:
    """`<engine database>_dagster`, shortened with a stable hash when longer than Postgres allows."""
    name = engine_database + STORAGE_SUFFIX
    if len(name.encode()) <= MAX_IDENTIFIER:
        return name
    digest = hashlib.sha256(engine_database.encode()).hexdigest()[:8]
    head = engine_database.encode()[: MAX_IDENTIFIER - len(STORAGE_SUFFIX) - 9].decode(errors="ignore")
    return f"{head}_{digest}{STORAGE_SUFFIX}"


def storage_url_for(engine_url: str) -> str:
    """Dagster's storage URL for an engine database URL: same server, the database
    `<engine database>_dagster` (created when missing), else the engine's database itself.

    Raises DatabaseUnavailable (naming DATABASE_URL) when the server cannot be reached."""
    engine_db = url_params(engine_url).get("dbname") or url_params(engine_url).get("user") or "postgres"
    name = storage_database_name(engine_db)
    if not _ensure_database(engine_url, name):
        log.warning("cannot create database %r; Dagster's storage shares the engine's database %r", name, engine_db)
        name = engine_db
    return to_url(engine_url, scheme="postgresql+psycopg2", dbname=name)


def _ensure_database(engine_url: str, name: str) -> bool:
    """True when `name` exists or was created; False when we may not create it."""
    try:
        with psycopg.connect(engine_url, autocommit=True, **dbmod.connect_kwargs(engine_url)) as c:
            if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return True
            c.execute(f'CREATE DATABASE "{name}"')
            return True
    except psycopg.errors.DuplicateDatabase:
        return True
    except psycopg.OperationalError as e:
        raise DatabaseUnavailable(dbmod.unreachable_message(engine_url, e)) from None
    except psycopg.Error:
        return False


def dagster_storage_url(env: dict[str, str] | None = None) -> str:
    """MIGRATE_DAGSTER_STORAGE_URL when set, else derived from DATABASE_URL / the embedded server."""
    env = dict(os.environ if env is None else env)
    given = env.get(STORAGE_URL_ENV, "").strip()
    if given:
        return given if given.startswith("postgresql+psycopg2://") else to_url(given, scheme="postgresql+psycopg2")
    return storage_url_for(dbmod.database_url(env))


def instance_config(lane_width: int | None = None) -> dict[str, Any]:
    """The instance template (`dagster.yaml` at the repository root), with the lane limit set to
    the engine's lane width. Raises ConfigError when the template is missing."""
    try:
        text = INSTANCE_TEMPLATE.read_text()
    except FileNotFoundError:
        raise ConfigError(f"the Dagster instance template {INSTANCE_TEMPLATE} is missing (run from the "
                          f"project's clone, installed with `pip install -e .`)") from None
    config = yaml.safe_load(text)
    width = lane_width or Settings.from_env().lane_width
    for limit in config["concurrency"]["runs"]["tag_concurrency_limits"]:
        if limit["key"] == "dagster/partition" and "value" not in limit:
            limit["limit"] = width
    return config


def dagster_home(env: dict[str, str] | None = None) -> Path:
    """DAGSTER_HOME when set, else MIGRATE_HOME/dagster: the instance the UI and the CLI share."""
    env = dict(os.environ if env is None else env)
    given = env.get("DAGSTER_HOME", "").strip()
    return Path(given).expanduser().resolve() if given else migrate_home(env) / "dagster"


def prepare_home(home: Path | None = None, *, lane_width: int | None = None) -> Path:
    """Write DAGSTER_HOME/dagster.yaml (storage through the env var, never a password on disk)."""
    home = (home or dagster_home()).resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    text = yaml.safe_dump(instance_config(lane_width), sort_keys=False)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return home


def dagster_env(home: Path | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every Dagster process of this project runs with (webserver, daemon, runs)."""
    env = dict(os.environ if env is None else env)
    home = prepare_home(home or dagster_home(env))
    env["DAGSTER_HOME"] = str(home)
    env[STORAGE_URL_ENV] = dagster_storage_url(env)
    env.setdefault("MIGRATE_HOME", str(migrate_home(env)))
    env.setdefault(EVENT_BATCH_ENV, EVENT_BATCH_SIZE)
    return env


def get_instance(home: Path | None = None):  # -> DagsterInstance
    """The project's Dagster instance, the one `migrate ui` shows."""
    from dagster import DagsterInstance

    env = dagster_env(home)
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    os.environ[STORAGE_URL_ENV] = env[STORAGE_URL_ENV]
    os.environ.setdefault("MIGRATE_HOME", env["MIGRATE_HOME"])
    os.environ.setdefault(EVENT_BATCH_ENV, env[EVENT_BATCH_ENV])
    storage_modules()
    return DagsterInstance.get()


def open_instance(env: dict[str, str]):  # -> DagsterInstance
    """The instance of a `dagster_env(...)` environment (its storage variable exported here too)."""
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    os.environ[STORAGE_URL_ENV] = env[STORAGE_URL_ENV]
    os.environ.setdefault(EVENT_BATCH_ENV, env.get(EVENT_BATCH_ENV, EVENT_BATCH_SIZE))
    storage_modules()
    return DagsterInstance.from_config(env["DAGSTER_HOME"])
