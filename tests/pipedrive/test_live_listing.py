"""A run is a snapshot plus a catch-up (issue 9): one test per way a live source moves rows while a
run walks it - span drift, offset shift, archive flip, delete, merge - each against the sandbox's
live account on real Postgres, the change landing at the exact moment that loses the row without
the catch-up (the tasks are run one by one, in the order that hurts).

The changes are the live sandbox's own ops (`pipedrive_sandbox/live.py`) applied to a chosen row
(`change`: the op's row pick pinned), so the account stays exactly what the sandbox serves.
"""
from __future__ import annotations

import random
from typing import Any

from engine_core import runs
from engine_core.providers.pipedrive import inventory
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.worker import Worker
from engine_core.providers.registry import for_run
from pipedrive_sandbox.data import rfc3339
from tests.pipedrive.support import FAST, TOKEN, failed_tasks, sandbox, start

TENANT = "acme"
PRODUCT = {"persons": "crm.contacts", "deals": "crm.deals", "notes": "crm.notes", "activities": "crm.activities",
           "organizations": "crm.companies", "leads": "crm.leads"}


def change(sb: Any, op: str, kind: str, ident: Any) -> dict[str, Any]:
    """Apply the live sandbox's `op` to the row `ident` of `kind` now (a merge merges it into
    another row); returns the change as `/_sandbox/changes` lists it."""
    live = sb.app.state.sandbox.live
    with live.lock:
        target = live.index_of(kind, ident)
        assert target is not None, f"{kind} {ident} is not in the account"
        pick = live._pick
        live._pick = lambda k, rng, ok=None: target if k == kind and (ok is None or ok(target)) else pick(k, rng, ok)
        try:
            seq = live.applied + 1
            ts = live._tick()
            made = getattr(live, f"_op_{op}")(kind, random.Random(seq), ts, seq)
        finally:
            live._pick = pick
        assert made is not None and str(made["id"]) == str(ident), made
        live.applied = seq
        live.version += 1
        out = {"seq": seq, "at": rfc3339(ts), **made}
        live.log.append(out)
        return out


def tasks(db, run_id: int, like: str, status: str = "pending") -> list[dict[str, Any]]:
    return db.sql("SELECT id, cursor_key, cursor FROM migration_tasks WHERE migration_id = %(r)s AND status = %(s)s"
                  " AND cursor_key LIKE %(k)s ORDER BY id", {"r": run_id, "s": status, "k": like})


def execute(db, run_id: int, like: str) -> int:
    """Run the run's pending tasks whose key matches, and their matching successors, in order."""
    worker, n = Worker(db, settings=FAST, providers=for_run), 0
    while True:
        ids = [t["id"] for t in tasks(db, run_id, like)]
        if not ids:
            return n
        for t in ids:
            worker.execute(t)
            n += 1


def finish(db, run_id: int) -> Any:
    Worker(db, settings=FAST, providers=for_run).drain(run_id)
    run = runs.get_run(db, run_id)
    assert run.status == "succeeded", failed_tasks(db, run_id)
    return run


def entry(db, kind: str, sid: Any) -> dict[str, Any] | None:
    rows = db.sql("SELECT action, record_id, record_type, source_version, deleted_at_source FROM migration_records"
                  " WHERE tenant_id = %(t)s AND source = 'pipedrive' AND kind = %(k)s AND source_id = %(s)s",
                  {"t": TENANT, "k": kind, "s": str(sid)})
    return rows[0] if rows else None


def product(db, kind: str, sid: Any) -> list[dict[str, Any]]:
    return db.sql(f"SELECT * FROM {PRODUCT[kind]} WHERE tenant_id = %(t)s AND source = 'pipedrive' AND source_id = %(s)s",
                  {"t": TENANT, "s": str(sid)})


def assert_current(db, sb: Any, kind: str, sid: Any, truth_kind: str | None = None) -> dict[str, Any]:
    """The row is in the product exactly once, at the version the source serves now."""
    row = sb.truth_rows(truth_kind or kind)[str(sid)]
    e = entry(db, kind, sid)
    assert e is not None and e["action"] == "created", f"{kind} {sid} was lost: {e}"
    assert e["source_version"] == row["update_time"], f"{kind} {sid} is stale: {e['source_version']} != {row['update_time']}"
    rows = product(db, kind, sid)
    assert len(rows) == 1 and rows[0]["deleted_at_source"] is None, rows
    return rows[0]


def test_a_row_updated_into_a_span_already_walked_is_not_lost(db, monkeypatch) -> None:
    """Span drift: the last `update_time` span is walked, then a person of the first span is
    updated (its time moves past the snapshot, i.e. out of the first span), then the first span is
    walked: only the catch-up can bring it."""
    from engine_core.providers.pipedrive import stripes

    monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", 0)  # tiny's persons striped, as a large list is
    with sandbox(page_cap=25) as sb:  # a list longer than a page: its discovery stripes it
        run = start(db, sb, TENANT, kinds=["organizations", "persons"])
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=0)
        execute(db, run.id, "persons:discover")
        spans = {t["cursor_key"]: t["cursor"] for t in tasks(db, run.id, "persons:s%")}
        assert len(spans) >= 2 and spans["persons:s0:p0"]["until"], spans
        last = max(spans, key=lambda k: int(k.split(":s")[1].split(":")[0]))
        execute(db, run.id, last.rsplit(":p", 1)[0] + ":%")  # the last span, walked to its end
        first = min(int(i) for i in sb.truth("persons")["ids"]["persons"])  # times grow with ids: span 0
        change(sb, "update", "persons", first)
        finish(db, run.id)
        person = assert_current(db, sb, "persons", first)
        assert person["name"] == sb.truth_rows("persons")[str(first)]["name"]


def test_a_note_deleted_between_two_offset_pages_makes_no_other_note_vanish(db) -> None:
    """Offset shift: pages of 15 notes (a capping server); after the first page is written a note
    on it is deleted, so the second page (offset 15) starts one row later: the note that was at 15
    is on neither. The catch-up's inventory walk finds it, and marks the deleted one."""
    with sandbox(page_cap=15) as sb:
        run = start(db, sb, TENANT, kinds=["organizations", "persons", "deals", "deals_archived", "leads",
                                           "leads_archived", "notes"])
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=2)  # the notes' parents first
        notes = sorted(int(i) for i in sb.truth("notes")["ids"]["notes"])
        assert len(notes) > 30
        execute(db, run.id, "notes:0")
        change(sb, "delete", "notes", notes[3])
        finish(db, run.id)
        skipped = notes[15]
        assert_current(db, sb, "notes", skipped)
        assert entry(db, "notes", notes[3])["deleted_at_source"] is not None
        for sid in notes[:3] + notes[4:]:
            assert entry(db, "notes", sid) is not None, f"note {sid} vanished"


def test_an_inventory_walk_loses_no_row_to_deletions_between_its_pages() -> None:
    """The v1 walk the catch-up and `source_ids` use: deletions before the offset between two pages
    (more than one, fewer than the overlap) move no row out of it."""
    with sandbox(page_cap=15) as sb:
        client = PipedriveClient(sb.base_url, TOKEN)
        notes = sorted(int(i) for i in sb.truth("notes")["ids"]["notes"])
        meter = inventory.Meter(client, {})
        walk = inventory.walk(meter, "notes")
        seen = [next(walk)["id"] for _ in range(15)]
        for sid in notes[2:6]:
            change(sb, "delete", "notes", sid)
        seen += [row["id"] for row in walk]
        assert set(notes) - set(notes[2:6]) <= set(seen), sorted(set(notes) - set(seen))
        assert meter.cost["requests"] >= 3 and meter.cost["tokens"] == 20 * meter.cost["requests"]


def test_a_deal_archived_between_the_two_deal_lists_is_not_lost(db) -> None:
    """Archive flip: the archived deals are walked, then an active deal is archived, then the active
    deals are walked: it is on neither walk. The catch-up writes it, archived."""
    with sandbox() as sb:
        run = start(db, sb, TENANT, kinds=["organizations", "persons", "deals", "deals_archived"])
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=1)
        execute(db, run.id, "deals_archived:%")
        deal = min(int(i) for i in sb.truth("deals")["ids"]["deals"])
        change(sb, "archive", "deals", deal)
        finish(db, run.id)
        row = assert_current(db, sb, "deals", deal, truth_kind="deals_archived")
        assert row["archived"] is True


def test_a_row_deleted_at_the_source_is_marked_by_the_catch_up(db) -> None:
    """Delete: a person written by the run is deleted at the source before the catch-up; the
    catch-up's id listing misses it, a GET answers 404, and ledger and product row are marked
    deleted at the source (never erased)."""
    with sandbox() as sb:
        run = start(db, sb, TENANT, kinds=["organizations", "persons"])
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=1)
        victim = min(int(i) for i in sb.truth("persons")["ids"]["persons"])
        assert entry(db, "persons", victim)["deleted_at_source"] is None
        change(sb, "delete", "persons", victim)
        finish(db, run.id)
        assert entry(db, "persons", victim)["deleted_at_source"] is not None
        rows = product(db, "persons", victim)
        assert len(rows) == 1 and rows[0]["deleted_at_source"] is not None


def test_a_merged_person_resolves_to_the_survivor(db) -> None:
    """Merge: after persons, deals, activities and notes are written, a person with children is
    merged into another: the children (re-pointed at the source, their update times moved) are
    updated in place to link to the survivor's product row; the merged person is marked."""
    with sandbox() as sb:
        kinds = ["organizations", "persons", "deals", "activities", "notes"]
        run = start(db, sb, TENANT, kinds=kinds)
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=len(run.plan) - 2)
        deals = sb.truth_rows("deals")
        parent = next(d["person_id"] for d in deals.values() if d.get("person_id") and not d["person_id"] % 21 == 0
                      and entry(db, "persons", d["person_id"]) is not None)
        merged = change(sb, "merge", "persons", parent)
        survivor = merged["into"]
        assert merged["repointed"].get("deals"), merged
        finish(db, run.id)
        assert entry(db, "persons", parent)["deleted_at_source"] is not None
        contact = product(db, "persons", survivor)[0]["id"]
        for kind, ids in merged["repointed"].items():
            if kind not in PRODUCT or kind not in kinds:
                continue
            for sid in ids:
                row = assert_current(db, sb, kind, sid)
                assert row["contact_id"] == contact, f"{kind} {sid} still points at the merged person"
