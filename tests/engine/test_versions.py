"""The versioned ledger on real Postgres (engine level, the example provider's table).

`ledger.write_once` records the source version it wrote; a newer version updates the product row
in place (same record id, never a second row) with outcome `updated` and one history row holding
the previous version and values; the same or an older version is `already_here`; a matched row
(the product's own) is not overwritten unless the run option `overwrite_matched` is true;
`mark_deleted` soft-deletes the ledger entry and the product row (never a hard delete) and a row
seen again is restored. Two workers writing the same changed row at once make one update. A whole
run of the example provider with a new version updates every row, and the rollup adds up.
"""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from engine_core import db as dbmod
from engine_core import ledger, ledger_reads, rollup, runs
from engine_core.context import TaskContext
from engine_core.models import Stats, Task
from engine_core.providers.registry import provider_for, for_run
from engine_core.runlog import RunLog
from engine_core.worker import drain_threads
from tests.engine.support import FAST

KIND = "companies"


def _run(db, **options: Any):
    return runs.start_run(db, provider_for("example"), "acme", options=options, settings=FAST)


def _insert(tx, sid: str, name: str):
    def go() -> ledger.Written:
        row = tx.sql("INSERT INTO example_items (tenant_id, kind, source_id, payload) VALUES ('acme', %(k)s, %(s)s,"
                     " jsonb_build_object('name', %(n)s::text)) RETURNING id", {"k": KIND, "s": sid, "n": name})
        return ledger.Written("example_items", row[0]["id"])
    return go


def _update(tx, name: str):
    def go(record_id: int) -> dict[str, Any] | None:
        got = tx.sql("UPDATE example_items n SET payload = jsonb_build_object('name', %(n)s::text) FROM example_items o"
                     " WHERE n.id = %(id)s AND o.id = n.id RETURNING o.payload", {"id": record_id, "n": name})
        return {"payload": got[0]["payload"]} if got else None
    return go


def _write(db, run, sid: str, name: str, version: str | None, events: list[str] | None = None) -> str:
    with db.transaction() as tx:
        return ledger.write_once(tx, run, KIND, sid, _insert(tx, sid, name), version=version,
                                 update=_update(tx, name), on_event=(events.append if events is not None else None))


def _items(db, sid: str) -> list[dict[str, Any]]:
    return db.sql("SELECT id, payload, deleted_at_source FROM example_items WHERE source_id = %(s)s ORDER BY id", {"s": sid})


def _entry(db, sid: str) -> dict[str, Any]:
    return db.sql("SELECT * FROM migration_records WHERE kind = %(k)s AND source_id = %(s)s", {"k": KIND, "s": sid})[0]


def _history(db, sid: str) -> list[dict[str, Any]]:
    return db.sql("SELECT h.* FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                  " WHERE r.kind = %(k)s AND r.source_id = %(s)s ORDER BY h.id", {"k": KIND, "s": sid})


V1, V2, V0 = "2026-03-01T10:00:00Z", "2026-03-02T10:00:00Z", "2026-02-01T10:00:00Z"


def test_a_newer_version_updates_in_place_and_the_same_or_older_is_already_here(db) -> None:
    run = _run(db)
    assert _write(db, run, "7", "Acme", V1) == "imported"
    first = _items(db, "7")
    assert _entry(db, "7")["source_version"] == V1
    assert _write(db, run, "7", "Acme", V1) == "already_here"
    # the same instant in the v1 format is the same version
    assert _write(db, run, "7", "Acme", "2026-03-01 10:00:00") == "already_here"
    assert _write(db, run, "7", "Acme Ltd", V2) == "updated"
    rows = _items(db, "7")
    assert len(rows) == 1 and rows[0]["id"] == first[0]["id"], "one product row, the same record"
    assert rows[0]["payload"] == {"name": "Acme Ltd"}
    entry = _entry(db, "7")
    assert (entry["source_version"], entry["action"], entry["migration_id"]) == (V2, "created", run.id)
    history = _history(db, "7")
    assert [(h["action"], h["version_before"], h["version_after"]) for h in history] == [("updated", V1, V2)]
    assert history[0]["before"] == {"payload": {"name": "Acme"}}, "the previous values are kept"
    # a stale sighting (an older version) never undoes a newer write
    assert _write(db, run, "7", "Acme (stale)", V0) == "already_here"
    assert _items(db, "7")[0]["payload"] == {"name": "Acme Ltd"} and len(_history(db, "7")) == 1


def test_content_hashes_and_entries_from_before_versions(db) -> None:
    run = _run(db)
    a, b = ledger.content_version({"id": 1, "name": "x"}), ledger.content_version({"name": "x", "id": 1})
    assert a == b and a.startswith("sha256:"), "canonical JSON: key order does not matter"
    assert _write(db, run, "8", "Hash", a) == "imported"
    assert _write(db, run, "8", "Hash", a) == "already_here"
    assert _write(db, run, "8", "Hash 2", ledger.content_version({"id": 1, "name": "y"})) == "updated"
    # an entry written before versions (NULL) is brought up to the first versioned sighting
    assert _write(db, run, "9", "Old", None) == "imported"
    assert _entry(db, "9")["source_version"] is None
    assert _write(db, run, "9", "Old", None) == "already_here", "a writer without versions: as before"
    assert _write(db, run, "9", "New", V1) == "updated"
    assert _entry(db, "9")["source_version"] == V1


def test_a_matched_row_is_the_products_own_unless_overwrite_matched(db) -> None:
    own = db.sql("INSERT INTO example_items (tenant_id, kind, source_id, payload) VALUES ('acme', %(k)s, 'product',"
                 " '{\"name\": \"Ours\"}') RETURNING id", {"k": KIND})[0]["id"]
    run = _run(db)

    def write(r, name: str, version: str, events: list[str]) -> str:
        with db.transaction() as tx:
            return ledger.write_once(tx, r, KIND, "11", lambda: ledger.Written("example_items", own, matched=True),
                                     version=version, update=_update(tx, name), on_event=events.append)

    events: list[str] = []
    assert write(run, "Ours", V1, events) == "matched"
    assert write(run, "From the source", V2, events) == "already_here"
    assert events == ["matched_kept"]
    assert db.sql("SELECT payload FROM example_items WHERE id = %(i)s", {"i": own})[0]["payload"] == {"name": "Ours"}
    assert _entry(db, "11")["source_version"] == V1, "kept: a later run with the option still finds it changed"
    assert not _history(db, "11")
    overwriting = replace(run, options={**run.options, "overwrite_matched": True})
    assert write(overwriting, "From the source", V2, []) == "updated"
    assert db.sql("SELECT payload FROM example_items WHERE id = %(i)s", {"i": own})[0]["payload"] == {"name": "From the source"}
    assert [h["before"] for h in _history(db, "11")] == [{"payload": {"name": "Ours"}}]


def test_mark_deleted_soft_deletes_and_a_row_seen_again_is_restored(db) -> None:
    run = _run(db)
    for sid in ("1", "2", "3"):
        assert _write(db, run, sid, f"Row {sid}", V1) == "imported"
    at = datetime(2026, 4, 1, 12, 0, tzinfo=timezone.utc)
    dry = replace(run, dry_run=True)
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, dry, KIND, ["1", "2"], at) == 2
    assert _entry(db, "1")["deleted_at_source"] is None, "a dry run marks nothing"
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, run, KIND, ["1", "2", "404", None], at) == 2
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, run, KIND, ["1"]) == 0, "marked once"
    for sid in ("1", "2"):
        assert _entry(db, sid)["deleted_at_source"] == at
        assert [r["deleted_at_source"] for r in _items(db, sid)] == [at], "the product row stays, marked"
    assert _entry(db, "3")["deleted_at_source"] is None and _items(db, "3")[0]["deleted_at_source"] is None
    assert ledger_reads.ledger_index(db, "acme", "example", KIND)["1"] == (V1, at)
    assert ledger.versions(db, run, KIND, ["1", "3", "404"]) == {"1": V1, "3": V1}
    # seen again: restored (same version), or restored and updated (newer version)
    events: list[str] = []
    assert _write(db, run, "1", "Row 1", V1, events) == "updated"
    assert _write(db, run, "2", "Row 2 again", V2, events) == "updated"
    assert events == ["restored", "restored"]
    for sid in ("1", "2"):
        assert _entry(db, sid)["deleted_at_source"] is None and _items(db, sid)[0]["deleted_at_source"] is None
    assert [(h["action"], h["version_before"], h["version_after"]) for h in _history(db, "2")] == [
        ("deleted", V1, V1), ("restored", V1, V2)]
    assert _items(db, "2")[0]["payload"] == {"name": "Row 2 again"}
    assert ledger_reads.history_counts(db, run.id) == {KIND: {"updated": 0, "deleted": 2, "restored": 2}}


def test_two_workers_writing_the_same_changed_row_at_once_make_one_update(db_url) -> None:
    database = dbmod.Database(db_url, max_size=6)
    try:
        run = _run(database)
        assert _write(database, run, "5", "Before", V1) == "imported"
        inside = threading.Event()
        outcomes: list[str] = []
        errors: list[BaseException] = []

        def first() -> None:
            try:
                with database.transaction() as tx:
                    update = _update(tx, "After")

                    def slow_update(record_id: int) -> dict[str, Any] | None:
                        inside.set()
                        # hold the entry until the second writer is waiting on it (a real overlap)
                        deadline = time.monotonic() + 10
                        while time.monotonic() < deadline and not _someone_waits(database):
                            time.sleep(0.02)
                        return update(record_id)

                    outcomes.append(ledger.write_once(tx, run, KIND, "5", _insert(tx, "5", "After"), version=V2,
                                                      update=slow_update))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        def second() -> None:
            try:
                inside.wait(10)
                outcomes.append(_write(database, run, "5", "After", V2))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sorted(outcomes) == ["already_here", "updated"]
        assert len(_items(database, "5")) == 1
        assert [h["action"] for h in _history(database, "5")] == ["updated"], "one update, one history row"
    finally:
        database.close()


def _someone_waits(database: dbmod.Database) -> bool:
    rows = database.sql("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'")
    return rows[0]["n"] > 0


def test_a_run_with_a_new_version_updates_every_row_and_adds_up(db) -> None:
    counts = {"companies": 30, "contacts": 30, "deals": 20, "activities": 10, "notes": 10}
    first = _run(db, counts=counts, version="v1", page_size=25)
    drain_threads(db, first.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, first.id).status == "succeeded"
    before = {r["source_id"]: r["id"] for r in db.sql("SELECT id, kind || ':' || source_id AS source_id FROM example_items")}
    second = _run(db, counts=counts, version="v2", page_size=25)
    drain_threads(db, second.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, second.id).status == "succeeded"
    after = {r["source_id"]: r["id"] for r in db.sql("SELECT id, kind || ':' || source_id AS source_id FROM example_items")}
    assert after == before, "every row updated in place: same records, none added"
    assert db.sql("SELECT count(*) AS n FROM example_items WHERE payload->>'name' NOT LIKE '%% v2'")[0]["n"] == 0
    report = rollup.rollup(db, second.id)
    assert report.complete, report.incomplete
    by_kind = {k.kind: k for k in report.kinds}
    for kind, n in counts.items():
        k = by_kind[kind]
        assert (k.seen, k.updated, k.imported, k.already_here) == (n, n, 0, 0), kind
    # a third run of the same version: everything already here
    third = _run(db, counts=counts, version="v2", page_size=25)
    drain_threads(db, third.id, width=2, settings=FAST, providers=for_run)
    report = rollup.rollup(db, third.id)
    assert report.complete and all(k.already_here == k.seen and k.updated == 0 for k in report.kinds)
    # deleted at the source, counted for the run that found it, outside the rows seen
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, runs.get_run(db, third.id), "deals", ["1", "2", "3"]) == 3
    report = rollup.rollup(db, third.id)
    deals = next(k for k in report.kinds if k.kind == "deals")
    assert (deals.deleted_at_source, deals.seen, deals.accounted) == (3, 20, 20) and report.complete


def test_the_rollup_names_updates_the_history_does_not_hold(db) -> None:
    run = _run(db, counts={"companies": 5}, version="v1")
    drain_threads(db, run.id, width=1, settings=FAST, providers=for_run)
    db.sql("UPDATE migration_tasks SET stats = stats || '{\"updated\": 1, \"seen\": 6}'::jsonb"
           " WHERE id = (SELECT min(id) FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'companies')",
           {"r": run.id})
    report = rollup.rollup(db, run.id)
    assert any("1 updated in the task stats but 0 updates in the ledger's history" in p for p in report.incomplete)


def test_a_placeholder_deleted_at_the_source_and_then_written_is_no_longer_deleted(db) -> None:
    run = _run(db)
    with db.transaction() as tx:
        assert ledger.skip(tx, run, KIND, "21", "not linked to any record") == "skipped"
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, run, KIND, ["21"]) == 1
    assert _entry(db, "21")["deleted_at_source"] is not None
    # the placeholder takeover path is unchanged: a real write claims the placeholder, and it is here
    assert _write(db, run, "21", "Arrived", V1) == "imported"
    entry = _entry(db, "21")
    assert (entry["action"], entry["source_version"], entry["deleted_at_source"]) == ("created", V1, None)
    assert len(_items(db, "21")) == 1


def test_a_task_run_again_by_a_retry_counts_the_rows_it_updated_as_updated(db) -> None:
    counts = {"companies": 12, "contacts": 0, "deals": 0, "activities": 0, "notes": 0}
    first = _run(db, counts=counts, version="v1")
    drain_threads(db, first.id, width=1, settings=FAST, providers=for_run)
    second = _run(db, counts=counts, version="v2")
    drain_threads(db, second.id, width=1, settings=FAST, providers=for_run)
    assert rollup.rollup(db, second.id).problems == []
    # a retry re-arms a task that already ran, with fresh counts (`revisit`): the same page again
    task_row = db.sql("UPDATE migration_tasks SET status = 'running', locked_by = 'retry-test', locked_at = now(),"
                      " processed_offset = 0, stats = '{\"revisit\": 1}'::jsonb"
                      " WHERE id = (SELECT min(id) FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'companies')"
                      " RETURNING *", {"r": second.id})[0]
    run = runs.get_run(db, second.id)
    task = Task.from_row(task_row)
    ctx = TaskContext(db=db, run=run, task=task, worker="retry-test", settings=FAST, log=RunLog(run.id, task.id),
                      stats=Stats(dict(task.stats)))
    provider_for("example", run).run_task(ctx)
    assert (ctx.stats.get("updated"), ctx.stats.get("already_here")) == (12, 0)
    assert rollup.rollup(db, second.id).problems == [], "the fresh counts agree with the history"


def test_versions_compare_as_instants_across_the_apis_formats() -> None:
    assert ledger.same_version("2026-03-01T10:00:00Z", "2026-03-01 10:00:00")
    assert ledger.same_version("2026-03-01T10:00:00.000Z", "2026-03-01T10:00:00Z")
    assert not ledger.same_version("2026-03-01T10:00:01Z", "2026-03-01 10:00:00")
    assert ledger.same_version("sha256:ab", "sha256:ab") and not ledger.same_version("sha256:ab", "sha256:cd")
    assert not ledger.same_version(None, "2026-03-01T10:00:00Z") and ledger.same_version(None, None)
    assert ledger.newer("2026-03-01 10:00:01", "2026-03-01T10:00:00.000Z")
    assert not ledger.newer("2026-03-01 10:00:00", "2026-03-01T10:00:00.000Z")
    assert not ledger.newer(None, "x") and ledger.newer("x", None)


def test_a_restore_without_a_new_version_keeps_the_rows_dangling_references(db) -> None:
    run = _run(db)
    refs = [{"field": "org_id", "parent_kind": "organizations", "parent_id": "42"}]
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, KIND, "31", _insert(tx, "31", "Dangling"), version=V1, update=_update(tx, "x"),
                                 dangling=refs, reason="imported; org_id 42 does not exist at the source") == "imported"
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, run, KIND, ["31"]) == 1
    with db.transaction() as tx:
        assert ledger.write_once(tx, run, KIND, "31", _insert(tx, "31", "Dangling"), version=V1, update=_update(tx, "x"),
                                 dangling=refs, reason="imported; org_id 42 does not exist at the source") == "updated"
    entry = _entry(db, "31")
    assert (entry["deleted_at_source"], entry["dangling"], entry["reason"]) == (
        None, refs, "imported; org_id 42 does not exist at the source")
