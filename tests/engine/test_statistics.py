"""Statistics of its own: the engine analyzes the tables it grows, whatever the server's
autovacuum does. A table grown past `min_rows + fraction x rows` since its last analyze is analyzed
(pg_stat_user_tables.analyze_count moves) with autovacuum disabled for it; a table that has not
grown that much is not; the check reads the server at most every `check_seconds`; a table another
worker is analyzing (its advisory lock held) is skipped; the barrier's winner analyzes what the
phase grew, after its transaction commits, while a finisher that does not win does not."""
from __future__ import annotations

import time

import psycopg
import pytest

from engine_core import db as dbmod
from engine_core import barrier, runs, statistics
from engine_core.providers.registry import provider_for, for_run
from tests.engine.support import FAST

GROWN = "crm.companies"
STILL = "crm.users"


def _no_autovacuum(db: dbmod.Database) -> None:
    # The guard must not lean on the server: this table's autovacuum never analyzes it.
    for table in (GROWN, STILL):
        db.sql(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


def _insert(db_url: str, table: str, n: int) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        if table == GROWN:
            c.execute("INSERT INTO crm.companies (tenant_id, name) SELECT 't', 'company ' || g FROM generate_series(1, %s) g", (n,))
        else:
            c.execute("INSERT INTO crm.users (tenant_id, name) SELECT 't', 'user ' || g FROM generate_series(1, %s) g", (n,))


def _analyze_count(db: dbmod.Database, table: str) -> int:
    schema, name = table.split(".")
    row = db.sql("SELECT analyze_count + autoanalyze_count AS n FROM pg_stat_user_tables"
                 " WHERE schemaname = %(s)s AND relname = %(r)s", {"s": schema, "r": name})
    return int(row[0]["n"])


def _wait_changed(db: dbmod.Database, table: str, at_least: int) -> None:
    # Backends report their counts to the statistics system within about a second of committing.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for g in statistics.growth(db, [table]):
            if g.changed >= at_least:
                return
        time.sleep(0.2)
    pytest.fail(f"{table}: n_mod_since_analyze never reached {at_least}")


def test_a_grown_table_is_analyzed_and_a_still_one_is_not(db, db_url) -> None:
    _no_autovacuum(db)
    _insert(db_url, STILL, 20)
    _insert(db_url, GROWN, 3000)
    _wait_changed(db, GROWN, 3000)
    _wait_changed(db, STILL, 20)
    before = {t: _analyze_count(db, t) for t in (GROWN, STILL)}

    keeper = statistics.Statistics(db, fraction=0.2, min_rows=1000, check_seconds=0)
    done = keeper.maybe_refresh()

    assert GROWN in done and STILL not in done
    assert _analyze_count(db, GROWN) == before[GROWN] + 1
    assert _analyze_count(db, STILL) == before[STILL]
    assert [g.changed for g in statistics.growth(db, [GROWN])] == [0]
    # grown again, but by less than a fifth of its 3,000 rows: not yet
    _insert(db_url, GROWN, 500)
    _wait_changed(db, GROWN, 500)
    assert keeper.maybe_refresh() == []
    assert _analyze_count(db, GROWN) == before[GROWN] + 1


def test_the_check_reads_the_server_at_most_every_check_seconds(db, db_url) -> None:
    _no_autovacuum(db)
    now = [100.0]
    keeper = statistics.Statistics(db, fraction=0.2, min_rows=1000, check_seconds=10, clock=lambda: now[0])
    assert keeper.maybe_refresh() == []  # nothing grown yet; the next check is due at 110
    _insert(db_url, GROWN, 1500)
    _wait_changed(db, GROWN, 1500)
    now[0] = 105.0
    assert keeper.maybe_refresh() == []
    now[0] = 110.0
    assert keeper.maybe_refresh() == [GROWN]


def test_a_table_another_worker_is_analyzing_is_skipped(db, db_url) -> None:
    _no_autovacuum(db)
    _insert(db_url, GROWN, 1500)
    _wait_changed(db, GROWN, 1500)
    before = _analyze_count(db, GROWN)
    with psycopg.connect(db_url) as other:  # holds the table's analyze lock in an open transaction
        other.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (statistics.ANALYZE_LOCK, GROWN))
        keeper = statistics.Statistics(db, check_seconds=0)
        assert keeper.maybe_refresh() == []
        assert _analyze_count(db, GROWN) == before
        other.rollback()
    assert keeper.maybe_refresh() == [GROWN]
    assert _analyze_count(db, GROWN) == before + 1


def test_the_barrier_winner_analyzes_what_the_phase_grew(db, db_url) -> None:
    _no_autovacuum(db)
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    _insert(db_url, GROWN, 200)  # past the boundary's few rows, far below the growth check's 1,000
    _wait_changed(db, GROWN, 200)
    before = _analyze_count(db, GROWN)

    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id = (SELECT min(id) FROM migration_tasks)")
    assert not barrier.advance_phase(db, run.id, 0, p, FAST)  # a finisher that does not close the phase
    assert _analyze_count(db, GROWN) == before

    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s AND phase = 0", {"r": run.id})
    assert barrier.advance_phase(db, run.id, 0, p, FAST)
    assert _analyze_count(db, GROWN) == before + 1


def test_a_lanes_barrier_winner_claims_on_while_the_boundarys_analyze_runs_beside_it(db, db_url, monkeypatch) -> None:
    """The worker that closes a phase hands the boundary's ANALYZE to the process's
    statistics thread and goes on at once (its lane was busy ~0.1 s a boundary while the next
    phase's walkers waited for a lane); the ANALYZE still happens. Real threads, real Postgres."""
    import threading

    from engine_core.worker import Worker
    from tests.engine.support import make_executions_table

    _no_autovacuum(db)
    make_executions_table(db)
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 1}, settings=FAST)
    _insert(db_url, GROWN, 200)
    _wait_changed(db, GROWN, 200)
    before = _analyze_count(db, GROWN)
    release, started = threading.Event(), threading.Event()
    real = statistics.Statistics.at_boundary

    def held(self):  # the real boundary analyze, held until the test has looked
        started.set()
        release.wait(30)
        return real(self)

    monkeypatch.setattr(statistics.Statistics, "at_boundary", held)
    task = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s AND phase = 0", {"r": run.id})[0]["id"]
    done: list[str] = []
    lane = threading.Thread(target=lambda: done.append(Worker(db, settings=FAST, providers=for_run).execute(task)), daemon=True)
    lane.start()
    lane.join(10)
    try:
        assert done == ["succeeded"], "the lane waited for the boundary's ANALYZE"
        assert started.wait(10), "the boundary's ANALYZE was never started"
        assert runs.get_run(db, run.id).current_phase == 1
        assert _analyze_count(db, GROWN) == before, "not yet: it is held"
    finally:
        release.set()
    deadline = time.monotonic() + 15
    while _analyze_count(db, GROWN) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _analyze_count(db, GROWN) == before + 1


def test_an_analyze_skips_the_jsonb_columns_and_keeps_the_expression_index(db, db_url) -> None:
    # Migration 0018: the product tables' jsonb columns carry no statistics (they were most of an
    # ANALYZE's cost and no query filters on them); the other columns and lower(email)'s index keep theirs.
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("INSERT INTO crm.contacts (tenant_id, name, email, custom_fields, phones)"
                  " SELECT 't', 'contact ' || g, 'c' || g || '@x.example', jsonb_build_object('k', g),"
                  " jsonb_build_array(jsonb_build_object('value', g::text)) FROM generate_series(1, 200) g")
        c.execute("ANALYZE crm.contacts")
        stats = {r[0] for r in c.execute("SELECT attname FROM pg_stats WHERE schemaname = 'crm'"
                                         " AND tablename IN ('contacts', 'contacts_email')").fetchall()}
        jsonb = {r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = 'crm'"
                                         " AND table_name = 'contacts' AND data_type = 'jsonb'").fetchall()}
    assert {"custom_fields", "phones", "emails"} <= jsonb
    assert not stats & jsonb
    assert {"tenant_id", "email", "name", "lower"} <= stats  # `lower`: the expression index's column


def test_an_analyze_of_the_ledger_skips_dangling_and_keeps_its_lookup_columns(db, db_url) -> None:
    # Migration 0025: `dangling` (jsonb) was most of an ANALYZE of migration_records' cost.
    with psycopg.connect(db_url, autocommit=True) as c:
        run = c.execute("INSERT INTO migrations (tenant_id, source, source_account, plan)"
                        " VALUES ('t', 'pipedrive', 'a', '[]')"
                        " RETURNING id").fetchone()[0]
        c.execute("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, action, dangling)"
                  " SELECT %s, 't', 'pipedrive', 'deals', g::text, 'created',"
                  " jsonb_build_array(jsonb_build_object('owed', true, 'parent_id', g::text)) FROM generate_series(1, 200) g",
                  (run,))
        c.execute("ANALYZE migration_records")
        stats = {r[0] for r in c.execute("SELECT attname FROM pg_stats WHERE schemaname = 'public'"
                                         " AND tablename = 'migration_records'").fetchall()}
    assert "dangling" not in stats
    assert {"tenant_id", "source", "kind", "source_id", "action", "migration_id"} <= stats
