"""The database port keeps its statements warm: named queries (and the writers' cached texts asked
with `prepare=True`) are prepared on a connection's first call, not after psycopg's five, and the
pool hands out the connection returned last, so a run's statements stay on a few connections
whose prepared statements and plan caches are already there (engine_core/db.py: the pool cycled
through every connection it had opened, and most calls were parsed and planned anew). A query fed
an array (a page's ids) is left to psycopg's threshold: its plan rests on the array's length.
"""
from __future__ import annotations

from engine_core import db as dbmod


def _prepared(conn: dbmod.Conn) -> list[str]:
    return [r["statement"] for r in conn.sql("SELECT statement FROM pg_prepared_statements")]


def test_a_named_query_is_prepared_on_its_first_call(db_url) -> None:
    with dbmod.Database(db_url, max_size=1) as db, db.connection() as conn:
        assert not any("FROM migrations WHERE id = $1" in s for s in _prepared(conn))
        conn.fetch_one("get_run", {"run_id": -1})
        assert any("FROM migrations WHERE id = $1" in s for s in _prepared(conn))


def test_a_query_fed_an_array_is_left_to_psycopgs_threshold(db_url) -> None:
    # its plan rests on the array's length, which a generic plan cannot see
    with dbmod.Database(db_url, max_size=1) as db, db.connection() as conn:
        conn.fetch_all("ledger_versions", {"tenant_id": "t", "source": "s", "kind": "k", "source_ids": ["1", "2"]})
        assert not any("source_id = ANY($4::text[])" in s for s in _prepared(conn))
        conn.fetch_one("get_run", {"run_id": -1})  # the connection prepares what it should
        assert any("FROM migrations WHERE id = $1" in s for s in _prepared(conn))


def test_an_ad_hoc_statement_is_prepared_when_asked_and_left_to_psycopg_else(db_url) -> None:
    with dbmod.Database(db_url, max_size=1) as db, db.connection() as conn:
        conn.sql("SELECT %(x)s::int AS asked", {"x": 1}, prepare=True)
        conn.sql("SELECT %(x)s::int AS left_alone", {"x": 1})
        statements = " ".join(_prepared(conn))
        assert "asked" in statements and "left_alone" not in statements


def test_the_pool_hands_out_the_connection_returned_last(db_url) -> None:
    with dbmod.Database(db_url, min_size=3, max_size=3) as db:
        db.pool.wait()
        first, second = db.pool.getconn(), db.pool.getconn()
        pids = (first.info.backend_pid, second.info.backend_pid)
        db.pool.putconn(first)
        db.pool.putconn(second)  # returned last: handed out next, then the one before it
        again = [db.pool.getconn() for _ in range(2)]
        assert [c.info.backend_pid for c in again] == [pids[1], pids[0]]
        for c in again:
            db.pool.putconn(c)
