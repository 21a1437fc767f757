"""Issue 9, changes go through the ledger: the Pipedrive provider against the (live) sandbox, on
real Postgres.

* A row changed at the source (the live account's `update` op: update_time moves, fields change)
  and listed again by a later run is written over its product row in place: the same record id,
  the source's new field values, exactly one product row per source row, the ledger's version the
  row's update_time as served, one `updated` history row with the previous values, outcome
  `updated` counted in the rollup (which still adds up); unchanged rows are already here.
* The kinds the live account does not change (users, pipelines, stages, field definitions) take
  the same path when their source rows change; the same version again is already here.
* A mail message listed again with a newer version is fetched and updated in place; messages held
  at their version cost no body request.
* A contact the product already had (matched) is not overwritten unless `overwrite_matched`.
* Rows deleted at the source (the live `delete` op), marked through `ledger.mark_deleted`, keep
  their product rows with `deleted_at_source` set; a row seen again is restored.
* Two workers writing the same page of changed deals at once make one update per deal.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from engine_core import definitions, ledger, ledger_reads, rollup
from engine_core.context import TaskContext
from engine_core.models import Run, Task
from engine_core.providers.pipedrive import fields, kinds, writers
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.runlog import RunLog
from engine_core.providers.registry import for_run
from tests.pipedrive.support import FAST, TABLE, TOKEN, failed_tasks, migrate, sandbox

TENANT = "acme"
WORKER = "updates-test"
LIVE_KINDS = ("organizations", "persons", "deals", "leads", "activities", "notes")


def _later(text: str, seconds: int = 3600) -> str:
    """A served update time moved later, in the same format (v2 RFC 3339 or v1 'YYYY-MM-DD HH:MM:SS')."""
    v1 = " " in text
    moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T")).replace(tzinfo=timezone.utc)
    moment += timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if v1 else "%Y-%m-%dT%H:%M:%SZ")


def _sight(db, run: Run, task_kind: str, rows: list[dict[str, Any]], client: PipedriveClient, tag: str = "") -> TaskContext:
    """List `rows` as a page of a `task_kind` task of `run`, through the provider's page writer."""
    phase = next(i for i, group in enumerate(run.plan) if task_kind in group)
    row = db.sql(
        "INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
        " VALUES (%(r)s, %(p)s, %(k)s, %(key)s, '{}'::jsonb, 'running', %(w)s, now()) RETURNING *",
        {"r": run.id, "p": phase, "k": task_kind, "key": f"{task_kind}:updates:{tag}:{rows[0]['id']}:{len(rows)}:{id(rows)}",
         "w": WORKER},
    )[0]
    task = Task.from_row(row)
    ctx = TaskContext(db=db, run=run, task=task, worker=WORKER, settings=FAST, log=RunLog(run.id, task.id))
    mapper = kinds.MAPPERS[task_kind]
    writers.write_listed_page(ctx, rows, lambda r: mapper(r, TENANT, fields.FieldBook()), client)
    return ctx


def _records(db, table: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in db.sql(f"SELECT id, source_id FROM crm.{table} WHERE tenant_id = %(t)s AND source = 'pipedrive'", {"t": TENANT}):
        out.setdefault(r["source_id"], []).append(r["id"])
    return out


def _entries(db, kind: str) -> dict[str, dict[str, Any]]:
    rows = db.sql("SELECT * FROM migration_records WHERE tenant_id = %(t)s AND kind = %(k)s", {"t": TENANT, "k": kind})
    return {r["source_id"]: r for r in rows}


def _history(db, run_id: int) -> list[dict[str, Any]]:
    return db.sql("SELECT r.kind, r.source_id, h.* FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                  " WHERE h.migration_id = %(r)s ORDER BY h.id", {"r": run_id})


def _expected(kind: str, row: dict[str, Any]) -> dict[str, Any]:
    """The product columns the live `update` op changes, as the source serves them now."""
    if kind == "organizations":
        return {"name": row["name"]}
    if kind == "persons":
        return {"name": row["name"], "first_name": row["first_name"], "last_name": row["last_name"]}
    if kind == "deals":
        return {"title": row["title"], "value": row["value"], "stage_ref": str(row["stage_id"]) if row["stage_id"] else None}
    if kind == "leads":
        value = row.get("value") or {}
        return {"title": row["title"], "value": value.get("amount")}
    if kind == "activities":
        return {"subject": row["subject"], "note": row.get("note")}
    return {"content": row["content"]}


def _product(db, table: str, record_id: int, columns: list[str]) -> dict[str, Any]:
    row = db.sql(f"SELECT * FROM crm.{table} WHERE id = %(i)s", {"i": record_id})[0]
    out = {c: row[c] for c in columns}
    if "value" in out and out["value"] is not None:
        out["value"] = float(out["value"])
    return out


def _no_duplicates(db) -> None:
    for table in sorted(set(TABLE.values())):
        dup = db.sql(f"SELECT source_id, count(*) AS n FROM crm.{table} WHERE tenant_id = %(t)s AND source = 'pipedrive'"
                     " GROUP BY source_id HAVING count(*) > 1", {"t": TENANT})
        assert dup == [], f"crm.{table} holds a source row twice: {dup[:3]}"


def test_rows_changed_at_the_source_are_updated_in_place_by_the_next_run(db) -> None:
    with sandbox(live_mix="update:1") as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        before = {k: _records(db, TABLE[k]) for k in LIVE_KINDS}
        versions_before = {k: {s: e["source_version"] for s, e in _entries(db, k).items()} for k in LIVE_KINDS}
        changes = sb.live_step(24)
        changed: dict[str, set[str]] = {}
        for c in changes:
            assert c["op"] == "update"
            changed.setdefault(c["kind"], set()).add(str(c["id"]).lower())
        now = {k: {**sb.truth_rows(k), **(sb.truth_rows(f"{k}_archived") if k in ("deals", "leads") else {})}
               for k in changed}
        second = migrate(db, sb, TENANT)
    assert second.status == "succeeded", failed_tasks(db, second.id)
    _no_duplicates(db)
    report = rollup.rollup(db, second.id)
    # the run's numbers still add up with updates: seen = imported + matched + already here + updated +
    # skipped + failed per kind, and the updates counted are the ledger history's
    assert [k.kind for k in report.kinds if k.seen != k.accounted] == [] and report.problems == [], report.incomplete
    history = _history(db, second.id)
    # one update per changed row, counted by whichever task wrote it (a kind's walker or the catch-up)
    assert sum(k.updated for k in report.kinds) == sum(len(v) for v in changed.values())
    for kind, ids in changed.items():
        table = TABLE[kind]
        records = _records(db, table)
        entries = _entries(db, kind)
        for sid in ids:
            source = now[kind][sid]
            assert records[sid] == before[kind][sid], f"{kind} {sid}: the same product row, in place"
            expected = _expected(kind, source)
            assert _product(db, table, records[sid][0], list(expected)) == expected, f"{kind} {sid}"
            assert entries[sid]["source_version"] == source["update_time"], "the ledger keeps the version as served"
            mine = [h for h in history if h["kind"] == kind and h["source_id"] == sid]
            assert [(h["action"], h["version_before"], h["version_after"]) for h in mine] == [
                ("updated", versions_before[kind][sid], source["update_time"])]
            assert mine[0]["before"], "the previous values are kept"
    assert len(history) == sum(len(v) for v in changed.values())
    # the kinds the live account does not change were all already here
    for k in report.kinds:
        if k.kind in ("fields", "users", "pipelines", "stages"):
            assert k.updated == 0 and k.imported == 0 and k.already_here == k.seen - k.skipped - k.failed, k


def test_users_pipelines_stages_and_fields_update_in_place(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        client = PipedriveClient(sb.base_url, TOKEN)
        user = client.get("/v1/users")["data"][0]
        pipeline = client.get("/api/v2/pipelines")["data"][0]
        stage = client.get("/api/v2/stages")["data"][0]
        changed = {
            "users": {**user, "name": "Renamed User", "modified": _later(user["modified"])},
            "pipelines": {**pipeline, "name": "Renamed Pipeline", "update_time": _later(pipeline["update_time"])},
            "stages": {**stage, "name": "Renamed Stage", "update_time": _later(stage["update_time"])},
        }
        for kind, row in changed.items():
            table, sid = TABLE[kind], str(row["id"])
            old = _records(db, table)[sid]
            ctx = _sight(db, run, kind, [row], client, "changed")
            assert (ctx.stats.get("updated"), ctx.stats.get("already_here")) == (1, 0), kind
            assert _records(db, table)[sid] == old
            assert db.sql(f"SELECT name FROM crm.{table} WHERE id = %(i)s", {"i": old[0]})[0]["name"] == row["name"]
            again = _sight(db, run, kind, [row], client, "again")
            assert (again.stats.get("updated"), again.stats.get("already_here")) == (0, 1), kind
        # a field definition renamed at the source: its content hash moves
        stored = db.sql("SELECT entity, field_key, name, field_type, options, subfields, is_custom, position"
                        " FROM crm.custom_field_definitions WHERE tenant_id = %(t)s ORDER BY id LIMIT 1", {"t": TENANT})[0]
        renamed = {**stored, "id": f"{stored['entity']}:{stored['field_key']}", "name": "Renamed Field"}
        task = _sight_task(db, run, "fields")
        result = definitions.write_definitions(task, [renamed])
        assert result.outcomes == {"updated": 1}
        assert definitions.write_definitions(_sight_task(db, run, "fields"), [renamed]).outcomes == {"already_here": 1}
    history = _history(db, run.id)
    assert sorted(h["kind"] for h in history) == ["fields", "pipelines", "stages", "users"]
    assert {h["kind"]: h["before"].get("name") for h in history} == {
        "users": user["name"], "pipelines": pipeline["name"], "stages": stage["name"], "fields": stored["name"]}
    _no_duplicates(db)


def _sight_task(db, run: Run, kind: str) -> TaskContext:
    phase = next(i for i, group in enumerate(run.plan) if kind in group)
    n = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})[0]["n"]
    row = db.sql("INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
                 " VALUES (%(r)s, %(p)s, %(k)s, %(key)s, '{}'::jsonb, 'running', %(w)s, now()) RETURNING *",
                 {"r": run.id, "p": phase, "k": kind, "key": f"{kind}:updates:{n}", "w": WORKER})[0]
    task = Task.from_row(row)
    return TaskContext(db=db, run=run, task=task, worker=WORKER, settings=FAST, log=RunLog(run.id, task.id))


def test_a_mail_message_listed_with_a_newer_version_is_updated_in_place(db) -> None:
    with sandbox(live_mix="mail:1") as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        change = sb.live_step(1)[0]
        assert change["op"] == "mail"
        mid = str(change["id"])
        sb.reset_stats()
        second = migrate(db, sb, TENANT, kinds=["emails"])
        assert second.status == "succeeded", failed_tasks(db, second.id)
        # a body is fetched for the new message alone: the rest are held at their version
        assert sb.stats()["bodies_fetched"] == {mid: 1}
        emails = _records(db, "emails")
        assert len(emails[mid]) == 1
        live = sb.app.state.sandbox.live
        with live.lock:
            deal, data, body = live.mail[int(mid)]
            live.mail[int(mid)] = (deal, {**data, "subject": "Re: a subject edited since",
                                          "update_time": _later(data["update_time"].replace(".000Z", "Z"))}, body)
        sb.reset_stats()
        third = migrate(db, sb, TENANT, kinds=["emails"])
        assert sb.stats()["bodies_fetched"] == {mid: 1}, "the changed message's body alone"
    assert third.status == "succeeded", failed_tasks(db, third.id)
    report = rollup.rollup(db, third.id)
    assert report.complete, report.incomplete
    mail = next(k for k in report.kinds if k.kind == "emails")
    assert (mail.updated, mail.imported) == (1, 0)
    assert _records(db, "emails")[mid] == emails[mid], "the same product row"
    row = db.sql("SELECT subject, body FROM crm.emails WHERE id = %(i)s", {"i": emails[mid][0]})[0]
    assert row["subject"] == "Re: a subject edited since" and row["body"]
    assert [(h["source_id"], h["action"]) for h in _history(db, third.id)] == [(mid, "updated")]
    _no_duplicates(db)


def test_a_matched_contact_is_kept_unless_overwrite_matched(db) -> None:
    with sandbox() as sb:
        persons = sb.truth_rows("persons")
        sid, person = next((s, p) for s, p in persons.items() if p.get("emails") and p["emails"][0].get("value"))
        email = person["emails"][0]["value"]
        own = db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES (%(t)s, 'Our Own Contact', %(e)s) RETURNING id",
                     {"t": TENANT, "e": email.lower()})[0]["id"]
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert _entries(db, "persons")[sid]["action"] == "matched"
        client = PipedriveClient(sb.base_url, TOKEN)
        changed = {**person, "name": "Renamed At The Source", "update_time": _later(person["update_time"])}
        kept = _sight(db, run, "persons", [changed], client, "kept")
        assert (kept.stats.get("already_here"), kept.stats.get("matched_kept"), kept.stats.get("updated")) == (1, 1, 0)
        assert db.sql("SELECT name FROM crm.contacts WHERE id = %(i)s", {"i": own})[0]["name"] == "Our Own Contact"
        overwriting = replace(run, options={**run.options, "overwrite_matched": True})
        over = _sight(db, overwriting, "persons", [changed], client, "over")
        assert over.stats.get("updated") == 1
    row = db.sql("SELECT name, source FROM crm.contacts WHERE id = %(i)s", {"i": own})[0]
    assert row == {"name": "Renamed At The Source", "source": None}, "overwritten, still the product's own row"
    assert [h["before"]["name"] for h in _history(db, run.id)] == ["Our Own Contact"]


def test_rows_deleted_at_the_source_are_soft_deleted_and_restored_when_seen_again(db) -> None:
    with sandbox(live_mix="delete:1") as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        client = PipedriveClient(sb.base_url, TOKEN)
        rows_before = {k: sb.truth_rows(k) for k in ("deals", "notes")}
        sb.live_step(12)
        deleted = {k: [str(i).lower() for i in ids] for k, ids in sb.truth()["deleted"].items() if ids}
        assert deleted
        with db.transaction() as tx:
            for kind, ids in deleted.items():
                assert ledger.mark_deleted(tx, run, kind, ids) == len(ids)
        with db.transaction() as tx:
            assert sum(ledger.mark_deleted(tx, run, kind, ids) for kind, ids in deleted.items()) == 0
        for kind, ids in deleted.items():
            entries, records = _entries(db, kind), _records(db, TABLE[kind])
            index = ledger_reads.ledger_index(db, TENANT, "pipedrive", kind)
            for sid in ids:
                if entries[sid]["action"] != "created":
                    continue
                marks = db.sql(f"SELECT deleted_at_source FROM crm.{TABLE[kind]} WHERE id = ANY(%(i)s)", {"i": records[sid]})
                assert len(marks) == 1 and marks[0]["deleted_at_source"] is not None, "kept, marked: never a hard delete"
                assert entries[sid]["deleted_at_source"] == marks[0]["deleted_at_source"] == index[sid][1]
        report = rollup.rollup(db, run.id)
        by_kind = {k.kind: k.deleted_at_source for k in report.kinds}
        assert {k: by_kind[k] for k in deleted} == {k: len(v) for k, v in deleted.items()}
        # one of them seen again (restored at the source, listed as it was): the mark clears
        kind = next(k for k in ("deals", "notes") if any(s in rows_before[k] for s in deleted.get(k, [])))
        sid = next(s for s in deleted[kind] if s in rows_before[kind])
        ctx = _sight(db, run, kind, [rows_before[kind][sid]], client, "restored")
        assert (ctx.stats.get("updated"), ctx.stats.get("restored")) == (1, 1)
    assert _entries(db, kind)[sid]["deleted_at_source"] is None
    assert db.sql(f"SELECT deleted_at_source FROM crm.{TABLE[kind]} WHERE id = ANY(%(i)s)",
                  {"i": _records(db, TABLE[kind])[sid]}) == [{"deleted_at_source": None}]


def test_two_workers_writing_the_same_changed_deals_at_once_make_one_update_each(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        client = PipedriveClient(sb.base_url, TOKEN)
        deals = list(sb.truth_rows("deals").values())[:25]
        changed = [{**d, "title": f"{d['title']} (edited)", "update_time": _later(d["update_time"])} for d in deals]
        before = _records(db, "deals")
        gate = threading.Barrier(2)
        contexts: list[TaskContext] = []
        errors: list[BaseException] = []

        def worker(tag: str) -> None:
            try:
                gate.wait(10)
                contexts.append(_sight(db, run, "deals", list(changed), client, tag))
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert sum(c.stats.get("updated") for c in contexts) == len(changed)
    assert sum(c.stats.get("already_here") for c in contexts) == len(changed)
    records = _records(db, "deals")
    for d in changed:
        assert records[str(d["id"])] == before[str(d["id"])]
    history = _history(db, run.id)
    assert sorted(h["source_id"] for h in history) == sorted(str(d["id"]) for d in changed), "one update per deal"
    _no_duplicates(db)


def test_a_row_imported_with_a_dangling_parent_is_linked_when_a_newer_version_points_at_one_that_exists(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        sid = next(str(i) for i in truth["dangling"].get("persons", []))
        person = sb.truth_rows("persons")[sid]
        entry = _entries(db, "persons")[sid]
        assert entry["dangling"] and entry["reason"].startswith("imported; ")
        org = next(str(i) for i in truth["ids"]["organizations"])
        moved = {**person, "org_id": int(org), "update_time": _later(person["update_time"])}
        ctx = _sight(db, run, "persons", [moved], PipedriveClient(sb.base_url, TOKEN), "linked")
    assert ctx.stats.get("updated") == 1
    company = _records(db, "companies")[org][0]
    row = db.sql("SELECT company_id, dangling_refs FROM crm.contacts WHERE id = %(i)s", {"i": entry["record_id"]})[0]
    assert row == {"company_id": company, "dangling_refs": None}
    after = _entries(db, "persons")[sid]
    assert (after["dangling"], after["reason"], after["record_id"]) == (None, None, entry["record_id"])


def test_rows_already_here_at_their_version_cost_no_write_attempt(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        deals = list(sb.truth_rows("deals").values())[:25]
        sequence = db.sql("SELECT last_value FROM crm.deals_id_seq")[0]["last_value"]
        ctx = _sight(db, run, "deals", deals, PipedriveClient(sb.base_url, TOKEN), "same")
    assert ctx.stats.get("already_here") == len(deals)
    # the page read the ledger once (ledger.held): no insert was tried and rolled back
    assert db.sql("SELECT last_value FROM crm.deals_id_seq")[0]["last_value"] == sequence


def test_a_sync_after_live_changes_leaves_one_product_row_per_source_row_at_its_final_version(db) -> None:
    from engine_core import runs
    from engine_core.providers.pipedrive.provider import PipedriveProvider
    from engine_core.worker import drain_threads
    from tests.pipedrive.support import UNLIMITED

    with sandbox(live_mix="update:4,delete:1,archive:1,unarchive:1,merge:1") as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        before = {k: _records(db, TABLE[k]) for k in LIVE_KINDS}
        sb.live_step(30)
        truth = sb.truth()
        now = {k: {**sb.truth_rows(k), **(sb.truth_rows(f"{k}_archived") if k in ("deals", "leads") else {})}
               for k in LIVE_KINDS}
        sync = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), TENANT,
                               options={"base_url": sb.base_url, "burst_limit": UNLIMITED}, settings=FAST)
        drain_threads(db, sync.id, width=4, settings=FAST, providers=for_run)
        sync = runs.get_run(db, sync.id)
    assert sync.status == "succeeded", failed_tasks(db, sync.id)
    _no_duplicates(db)
    report = rollup.rollup(db, sync.id)
    assert [k.kind for k in report.kinds if k.seen != k.accounted] == [] and report.problems == [], report.incomplete
    for kind in LIVE_KINDS:
        entries, records = _entries(db, kind), _records(db, TABLE[kind])
        for sid, row in now[kind].items():
            entry = entries.get(sid)
            if entry is None or entry["action"] != "created":
                continue  # a row the source keeps skipped (a dangling hostile row) is not this test's
            assert entry["deleted_at_source"] is None, (kind, sid)
            assert ledger.same_version(entry["source_version"], row["update_time"]), (kind, sid, entry["source_version"], row["update_time"])
            assert len(records[sid]) == 1 and (sid not in before[kind] or records[sid] == before[kind][sid]), (kind, sid)
            expected = _expected(kind, row)
            assert _product(db, TABLE[kind], records[sid][0], list(expected)) == expected, (kind, sid)
        gone = {str(i).lower() for i in truth["deleted"].get(kind, [])} | {str(i) for i in truth["merged"].get(kind, {})}
        for sid in gone:
            if sid in entries and entries[sid]["action"] == "created":
                assert entries[sid]["deleted_at_source"] is not None, (kind, sid)
                marks = db.sql(f"SELECT deleted_at_source FROM crm.{TABLE[kind]} WHERE id = ANY(%(i)s)", {"i": records[sid]})
                assert [m["deleted_at_source"] is not None for m in marks] == [True], (kind, sid)


def test_a_newer_version_whose_parent_is_not_here_is_skipped_not_already_here(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        persons = sb.truth_rows("persons")
        sid, person = next((s, p) for s, p in persons.items() if _entries(db, "persons")[s]["action"] == "created"
                           and s not in {str(i) for i in truth["dangling"].get("persons", [])})
        # an organization the source has but the ledger does not (say its page failed)
        org = next(str(i) for i in truth["ids"]["organizations"] if str(i) != str(person.get("org_id")))
        db.sql("DELETE FROM migration_records WHERE tenant_id = %(t)s AND kind = 'organizations' AND source_id = %(s)s",
               {"t": TENANT, "s": org})
        entry = _entries(db, "persons")[sid]
        moved = {**person, "org_id": int(org), "update_time": _later(person["update_time"])}
        ctx = _sight(db, run, "persons", [moved], PipedriveClient(sb.base_url, TOKEN), "orphan")
    assert (ctx.stats.get("skipped"), ctx.stats.get("update_skipped"), ctx.stats.get("already_here")) == (1, 1, 0)
    after = _entries(db, "persons")[sid]
    assert (after["action"], after["source_version"]) == ("created", entry["source_version"]), "keeps what it has"
