"""Dagster's own instance: storage on the engine's Postgres server, and the DAGSTER_HOME the CLI uses.

One place derives Dagster's storage URL from the engine's database settings (trap 1 in
DAGSTER_NOTES.md: SQLAlchemy 2.1 must be told `postgresql+psycopg2://`, the engine keeps plain
psycopg 3 URLs). Dagster gets its own database (`dagster`) on the same server when it may create
one, else it shares the engine's database (its table names do not collide with the engine's).
"""
from __future__ import annotations

import logging
import os
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
import yaml
from psycopg import conninfo

from engine_core import db as dbmod
from engine_core.config import Settings, migrate_home

log = logging.getLogger(__name__)

STORAGE_URL_ENV = "MIGRATE_DAGSTER_STORAGE_URL"  # dagster.yaml reads the storage URL from here
DAGSTER_DATABASE = "dagster"


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


def storage_url_for(engine_url: str) -> str:
    """Dagster's storage URL for an engine database URL: same server, the `dagster` database."""
    name = DAGSTER_DATABASE
    if not _ensure_database(engine_url, name):
        name = url_params(engine_url).get("dbname", "postgres")
        log.warning("cannot create database %r; Dagster's storage shares the engine's database %r", DAGSTER_DATABASE, name)
    return to_url(engine_url, scheme="postgresql+psycopg2", dbname=name)


def _ensure_database(engine_url: str, name: str) -> bool:
    try:
        with psycopg.connect(engine_url, autocommit=True) as c:
            if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return True
            c.execute(f'CREATE DATABASE "{name}"')
            return True
    except psycopg.errors.DuplicateDatabase:
        return True
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
    """The packaged dagster.yaml, with the lane limit set to the engine's lane width."""
    text = resources.files("migration_pipeline").joinpath("dagster.yaml").read_text()
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
    return env


def get_instance(home: Path | None = None):  # -> DagsterInstance
    """The project's Dagster instance, the one `migrate ui` shows."""
    from dagster import DagsterInstance

    env = dagster_env(home)
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    os.environ[STORAGE_URL_ENV] = env[STORAGE_URL_ENV]
    os.environ.setdefault("MIGRATE_HOME", env["MIGRATE_HOME"])
    return DagsterInstance.get()
