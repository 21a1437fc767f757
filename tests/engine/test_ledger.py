"""Behaviour 7: write_once. The claim goes last in the write's transaction; created/matched rows are
exclusive (a second writer rolls back its write and reports the row as already here); a skipped
row is a placeholder that the next successful write takes over; references resolve in one query."""
from __future__ import annotations

import threading

from engine_core import db as dbmod
from engine_core import ledger, runs
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST


def _insert(tx, sid: str):
    def go() -> ledger.Written:
        row = tx.sql("INSERT INTO example_items (tenant_id, kind, source_id) VALUES ('acme', 'companies', %(s)s) RETURNING id", {"s": sid})
        return ledger.Written("example_items", row[0]["id"])
    return go


def _items(db) -> int:
    return db.sql("SELECT count(*) AS n FROM example_items")[0]["n"]


def test_second_writer_rolls_back_its_write_and_reports_already_here(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, "companies", 1, _insert(tx, "1")) == "imported"
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, "companies", 1, _insert(tx, "1")) == "already_here"
    assert _items(db) == 1


def test_a_write_that_raises_leaves_no_claim(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)

    def broken() -> ledger.Written:
        raise ValueError("bad row")

    with db.transaction() as tx:
        try:
            ledger.write_once(tx, run, "companies", 5, broken)
        except ValueError:
            pass
        assert ledger.write_once(tx, run, "companies", 5, _insert(tx, "5")) == "imported"


def test_concurrent_writers_of_one_row_create_it_once(db_url) -> None:
    database = dbmod.Database(db_url, max_size=12)
    run = runs.start_run(database, provider_for("example"), "acme", settings=FAST)
    results: list[str] = []
    gate = threading.Barrier(10)

    def writer() -> None:
        gate.wait()
        with database.transaction() as tx:
            results.append(ledger.write_once(tx, run, "companies", 42, _insert(tx, "42")))

    threads = [threading.Thread(target=writer) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["already_here"] * 9 + ["imported"]
    assert _items(database) == 1
    database.close()


def test_skip_is_a_placeholder_the_next_write_takes_over(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    with db.transaction() as tx:
        assert ledger.skip(tx, run, "contacts", 9, "not linked to any record") == "skipped"
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, "contacts", 9, _insert(tx, "9")) == "imported"
    row = db.sql("SELECT action, record_id FROM migration_records WHERE source_id = '9'")[0]
    assert row["action"] == "created" and row["record_id"] is not None


def test_a_skip_never_takes_a_created_rows_slot(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    with db.transaction() as tx:
        ledger.write_once(tx, run, "contacts", 9, _insert(tx, "9"))
    with db.transaction() as tx:
        assert ledger.skip(tx, run, "contacts", 9, "not linked to any record") == "already_here"
    assert db.sql("SELECT action FROM migration_records WHERE source_id = '9'")[0]["action"] == "created"


def test_matched_rows_are_exclusive_too(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, "contacts", 3, lambda: ledger.Written("example_items", 77, matched=True)) == "matched"
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, "contacts", 3, _insert(tx, "3")) == "already_here"
    assert _items(db) == 0


def test_references_resolve_through_the_ledger_in_one_query(db, monkeypatch) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    with db.transaction() as tx:
        for i in range(1, 6):
            ledger.write_once(tx, run, "companies", i, _insert(tx, str(i)))
        ledger.skip(tx, run, "contacts", 1, "not linked to any record")
    calls = []
    original = dbmod.Conn.fetch_all
    monkeypatch.setattr(dbmod.Conn, "fetch_all", lambda self, *a, **k: calls.append(a[0]) or original(self, *a, **k))
    with db.connection() as conn:
        found = ledger.resolve(conn, run, [("companies", i) for i in range(1, 9)] + [("contacts", 1)])
    assert calls == ["resolve_references"]
    assert sorted(k[1] for k in found) == ["1", "2", "3", "4", "5"]  # skipped rows resolve to nothing
