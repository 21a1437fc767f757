"""Numbered migrations apply idempotently under an advisory lock: processes starting together on an
empty database all succeed and each version is applied once."""
from __future__ import annotations

import multiprocessing as mp
import uuid

import psycopg

from engine_core import db as dbmod
from tests.conftest import _with_dbname


def _apply(url: str, out: "mp.Queue") -> None:
    out.put(dbmod.apply_schema(url))


def test_processes_starting_together_apply_each_migration_once(server_url) -> None:
    name = f"test_schema_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = _with_dbname(server_url, name)
    try:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_apply, args=(url, q)) for _ in range(4)]
        for p in procs:
            p.start()
        applied = [q.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        versions = [v for v, _, _ in dbmod.migration_files()]
        assert sorted(v for a in applied for v in a) == versions, "each version applied by exactly one process"
        assert dbmod.apply_schema(url) == []  # idempotent
        with psycopg.connect(url) as c:
            rows = c.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        assert [r[0] for r in rows] == versions
    finally:
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
