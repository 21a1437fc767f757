"""Shared fixtures: real Postgres, a template database with the schema, a fresh database per test.

The server is the embedded one under MIGRATE_HOME by default, or DATABASE_URL when set.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo

from engine_core import db as dbmod

TEMPLATE = f"migrate_template_{os.getpid()}"


def _with_dbname(url: str, name: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    return conninfo.make_conninfo(**params)


@pytest.fixture(scope="session")
def server_url() -> str:
    """A URL to the server's maintenance database."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if not url:
        url = dbmod.embedded_url(database="postgres")
    return _with_dbname(url, "postgres")


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{TEMPLATE}"')
    url = _with_dbname(server_url, TEMPLATE)
    dbmod.apply_schema(url)
    yield TEMPLATE
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture
def db_url(server_url: str, template_db: str) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    yield _with_dbname(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db(db_url: str) -> Iterator[dbmod.Database]:
    database = dbmod.Database(db_url, max_size=20)
    yield database
    database.close()
