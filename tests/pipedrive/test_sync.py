"""Re-sync (issue 9): a run while the account changes at a steady rate, the changes stop, a sync;
then the product is the source's final state - every row exactly once with its final field
values, deleted rows marked, merged ids resolved to the survivor, zero duplicates - and the
sync's cost at the source is measured against the full run's (the sandbox's own stats).
"""
from __future__ import annotations

from typing import Any

import pytest

from engine_core import rollup, row_story, runs
from engine_core.errors import NothingToSync
from engine_core.verify import verify
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.worker import drain_threads
from engine_core.providers.registry import for_run
from migration_pipeline.cli.inspect import since_lines
from tests.pipedrive.support import FAST, TOKEN, UNLIMITED, failed_tasks, live_op, sandbox, start

TENANT = "acme"
# truth kind -> (ledger kind, product table, a field served as the product stores it)
KINDS: dict[str, tuple[str, str, tuple[str, str] | None]] = {
    "organizations": ("organizations", "crm.companies", ("name", "name")),
    "persons": ("persons", "crm.contacts", ("name", "name")),
    "deals": ("deals", "crm.deals", ("title", "title")),
    "deals_archived": ("deals", "crm.deals", ("title", "title")),
    "leads": ("leads", "crm.leads", ("title", "title")),
    "leads_archived": ("leads", "crm.leads", ("title", "title")),
    "activities": ("activities", "crm.activities", ("subject", "subject")),
    "notes": ("notes", "crm.notes", None),
}


def test_sync_without_a_succeeded_run_says_so(db) -> None:
    provider = PipedriveProvider(base_url="http://127.0.0.1:9", token=TOKEN)
    with pytest.raises(NothingToSync, match="'nobody'"):
        runs.start_sync(db, provider, "nobody", settings=FAST)


def _ledger(db, kind: str) -> dict[str, dict[str, Any]]:
    rows = db.sql("SELECT source_id, action, record_id, source_version, deleted_at_source, migration_id FROM migration_records"
                  " WHERE tenant_id = %(t)s AND source = 'pipedrive' AND kind = %(k)s", {"t": TENANT, "k": kind})
    return {r["source_id"]: r for r in rows}


def _product(db, table: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in db.sql(f"SELECT * FROM {table} WHERE tenant_id = %(t)s AND source = 'pipedrive'", {"t": TENANT}):
        out.setdefault(str(r["source_id"]), []).append(r)
    return out


def _changed_by(db, run_id: int, action: str, claimed_by: int, kind: str | None = None) -> list[tuple[str, str]]:
    """(ledger kind, source id) of the entries run `claimed_by` claimed and run `run_id` changed by
    `action` (its history rows)."""
    return [(r["kind"], r["source_id"]) for r in db.sql(
        "SELECT DISTINCT r.kind, r.source_id FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
        " WHERE h.migration_id = %(r)s AND h.action = %(a)s AND r.migration_id = %(c)s"
        " AND (%(k)s::text IS NULL OR r.kind = %(k)s) ORDER BY r.kind, r.source_id",
        {"r": run_id, "a": action, "c": claimed_by, "k": kind})]


def _op_on_held(db, sb: Any, op: str, run_id: int, archived: bool | None = None) -> dict[str, Any]:
    """Apply live `op` until it changes a row run `run_id` claimed and the product holds as the
    source had it (not marked deleted; archived as `archived` says when given): the live stream
    that ran beside the run may have changed its pick after the run's catch-up listed it."""
    for _ in range(20):
        change = live_op(sb, op)
        kind, sid = KINDS[change["kind"]][0], str(change["id"])
        entry = _ledger(db, kind).get(sid)
        if entry is None or (entry["action"], entry["migration_id"], entry["deleted_at_source"]) != ("created", run_id, None):
            continue
        held = db.sql(f"SELECT * FROM {KINDS[change['kind']][1]} WHERE id = %(i)s", {"i": entry["record_id"]})[0]
        if archived is None or held["archived"] is archived:
            return change
    raise AssertionError(f"no {op} of a row the run holds as the source had it")


def _explains(db, sync_id: int, claimed_by: int, kind: str, sid: str, action: str) -> None:
    """`migrate explain` tells the row's claim by `claimed_by`, then `action` by sync run #`sync_id`
    (--json: `history`, `last_run_id`, `deleted_by_run`; the text: a "then ..." line and a "now:" line)."""
    story = row_story.explain(db, TENANT, kind, sid)
    assert story["run_id"] == claimed_by and story["last_run_id"] == sync_id, story
    assert (story["history"][-1]["run_id"], story["history"][-1]["action"]) == (sync_id, action), story
    assert story["deleted_by_run"] == (sync_id if action == "deleted" else None), story
    said = since_lines(kind, story)
    verb = {"updated": "then updated by", "deleted": "then found gone from the source by"}[action]
    assert any(line.startswith(f"{verb} sync run #{sync_id} at ") for line in said), said
    assert said[-1].startswith("now: ") and said[-1].endswith(f"last changed by sync run #{sync_id}"), said


def _cost(sb: Any) -> dict[str, int]:
    stats = sb.stats()
    return {"requests": int(stats["requests_total"]), "tokens": int(stats["tokens_total"])}


def test_a_run_on_a_live_account_then_a_sync_leaves_the_final_state(db) -> None:
    with sandbox(scale="tiny", live_mix="create:3,update:6,delete:1,archive:1,unarchive:0.5,merge:0.5,mail:2") as sb:
        opts = {"base_url": sb.base_url, "burst_limit": UNLIMITED}
        run = start(db, sb, TENANT)
        sb.configure(live_rate=60.0, live_max=120)  # a steady stream of changes while the (short) run walks
        drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
        run = runs.get_run(db, run.id)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        full = _cost(sb)
        sb.live_stop()
        applied = sb.live()["applied"]
        assert applied > 20, f"only {applied} changes landed while the run walked"
        # after the run, the sync's to find: a merge and an unarchive of rows the run holds as the source has them
        merge = _op_on_held(db, sb, "merge", run.id)
        unarchive = _op_on_held(db, sb, "unarchive", run.id, archived=True)
        sb.reset_stats()
        sync = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), TENANT, options=opts, settings=FAST)
        assert sync.mode == "sync" and sync.since == run.snapshot_at
        drain_threads(db, sync.id, width=4, settings=FAST, providers=for_run)
        sync = runs.get_run(db, sync.id)
        assert sync.status == "succeeded", failed_tasks(db, sync.id)
        cost = _cost(sb)
        truth = sb.truth()

        ledgers = {lk: _ledger(db, lk) for lk, _, _ in KINDS.values()}
        for name, (lk, table, fields) in KINDS.items():
            rows = sb.truth_rows(name)
            products = _product(db, table)
            for sid, row in rows.items():
                e = ledgers[lk].get(sid)
                assert e is not None and e["action"] in ("created", "matched"), f"{name} {sid}: {e}"
                assert e["deleted_at_source"] is None, f"{name} {sid} is marked deleted but the source has it"
                if row.get("update_time") and e["action"] == "created":  # a matched row is the product's own: kept
                    assert e["source_version"] == row["update_time"], f"{name} {sid} is stale"
                if e["action"] == "created":
                    mine = products.get(sid, [])
                    assert len(mine) == 1, f"{name} {sid}: {len(mine)} product rows"
                    if fields:
                        assert mine[0][fields[1]] == row[fields[0]], f"{name} {sid}: {fields[0]} is not the final value"
                    if name.startswith(("deals", "leads")):
                        assert mine[0]["archived"] is name.endswith("_archived"), f"{name} {sid}: archived flag"
        for kind, ids in truth["deleted"].items():
            lk = {"deals_archived": "deals", "leads_archived": "leads"}.get(kind, kind)
            for sid in map(str, ids):
                e = ledgers.get(lk, {}).get(sid)
                assert e is None or e["deleted_at_source"] is not None, f"deleted {kind} {sid} is not marked"
        contacts = _product(db, "crm.contacts")
        for kind, merged in truth["merged"].items():
            for old, survivor in merged.items():
                e = ledgers[kind].get(str(old))
                assert e is None or e["deleted_at_source"] is not None, f"merged {kind} {old} is not marked"
                assert str(survivor) in ledgers[kind], f"survivor {kind} {survivor} missing"
        deals = _product(db, "crm.deals")
        for name in ("deals", "deals_archived"):
            for sid, row in sb.truth_rows(name).items():
                person = row.get("person_id")
                if person and str(person) in contacts and ledgers["deals"][sid]["action"] == "created":
                    assert deals[sid][0]["contact_id"] == contacts[str(person)][0]["id"], f"deal {sid} links elsewhere"
        mail = {m for msgs in truth["deals_with_mail"].values() for m in msgs}
        emails = _ledger(db, "emails")
        unwritten = {str(m) for m in mail if emails.get(str(m), {}).get("action") != "created"}
        assert not unwritten, f"mail not in the product: {sorted(unwritten)[:10]}"
        for table in ("crm.companies", "crm.contacts", "crm.deals", "crm.leads", "crm.activities", "crm.notes", "crm.emails"):
            dup = db.sql(f"SELECT source_id, count(*) AS n FROM {table} WHERE tenant_id = %(t)s AND source = 'pipedrive'"
                         " GROUP BY source_id HAVING count(*) > 1", {"t": TENANT})
            assert not dup, f"{table}: duplicates {dup[:5]}"
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST)
        assert proof.passed, [k.as_dict() for k in proof.kinds if k.differences]
        # explain tells what the sync did after the run's claim: the record merged away, the deal or lead unarchived
        gone = (merge["kind"], str(merge["id"]))  # a person or an organization
        _explains(db, sync.id, run.id, *gone, "deleted")
        assert any("merged into another record" in line for line in since_lines(gone[0], row_story.explain(db, TENANT, *gone)))
        back = (KINDS[unarchive["kind"]][0], str(unarchive["id"]))  # a deal or a lead, under its ledger kind
        _explains(db, sync.id, run.id, *back, "updated")
        assert "archived" in row_story.explain(db, TENANT, *back)["history"][-1]["changed"]
        print(f"\nlive changes: {applied}; full run: {full['requests']} requests, {full['tokens']} tokens; "
              f"sync: {cost['requests']} requests, {cost['tokens']} tokens "
              f"({100 * cost['tokens'] / max(1, full['tokens']):.0f}% of the run's tokens)")
        assert cost["tokens"] < full["tokens"]

        # cutover's last step, cheaper: only rows updated since (no id listings, so no deletions)
        sb.configure(live_mix="update:1")
        updated = [c for c in sb.live_step(12) if c["op"] == "update"]
        sb.reset_stats()
        quick = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), TENANT,
                                options={**opts, "detect_deletes": False}, settings=FAST)
        assert quick.since == sync.snapshot_at
        drain_threads(db, quick.id, width=4, settings=FAST, providers=for_run)
        assert runs.get_run(db, quick.id).status == "succeeded", failed_tasks(db, quick.id)
        changed = _cost(sb)
        requests = sb.stats()["requests"]
        assert not requests.get("/v1/deals/{id}/mailMessages"), "mail listed for deals whose mail did not change"
        _explains(db, quick.id, run.id, *_changed_by(db, quick.id, "updated", run.id)[0], "updated")
        for c in updated:
            name = c["kind"]
            rows = sb.truth_rows(name) if name not in ("deals", "leads") else {
                **sb.truth_rows(name), **sb.truth_rows(f"{name}_archived")}
            e = _ledger(db, KINDS[name][0])[str(c["id"]).lower()]
            assert e["action"] == "matched" or e["source_version"] == rows[str(c["id"]).lower()]["update_time"], f"{name} {c['id']} not synced"
        # (on a tiny account every list is one page either way: the saving shows at scale, see bench)
        print(f"sync of {len(updated)} updates without deletions: {changed['requests']} requests, {changed['tokens']} tokens")


def test_matched_rows_whose_source_changed_are_kept_named_by_verify_and_not_retried(db) -> None:
    """The product's own contacts (matched by email) whose source person changed: verify names them
    'kept' (matched, source newer, not overwritten) and still passes; a sync's catch-up does not try
    them again (no matched_kept write attempt, every sync would repeat it); a sync with
    overwrite_matched takes the source's values, after which nothing is kept."""
    with sandbox(scale="tiny", live_mix="update:1") as sb:
        emails = {sid: p["emails"][0]["value"].lower() for sid, p in sb.truth_rows("persons").items()
                  if p.get("emails") and p["emails"][0].get("value")}
        for email in sorted(set(emails.values())):
            db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES (%(t)s, 'Our Own Contact', %(e)s)",
                   {"t": TENANT, "e": email})
        run = start(db, sb, TENANT)
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        assert runs.get_run(db, run.id).status == "succeeded", failed_tasks(db, run.id)
        matched = {sid for sid, e in _ledger(db, "persons").items() if e["action"] == "matched"}
        assert matched
        updated = {str(c["id"]) for c in sb.live_step(60) if c["kind"] == "persons"}
        changed = updated & matched
        assert changed, "no matched person was updated at the source"
        provider = PipedriveProvider(base_url=sb.base_url)
        opts = {"base_url": sb.base_url, "burst_limit": UNLIMITED}

        for written in (len(updated - matched), 0):  # every sync: the kept rows cost no write attempt
            sync = runs.start_sync(db, provider, TENANT, options=opts, settings=FAST)
            drain_threads(db, sync.id, width=2, settings=FAST, providers=for_run)
            assert runs.get_run(db, sync.id).status == "succeeded", failed_tasks(db, sync.id)
            stats = db.sql("SELECT COALESCE(sum((stats->>'matched_kept')::int), 0) AS kept,"
                           " COALESCE(sum((stats->>'seen@persons')::int), 0) AS seen"
                           " FROM migration_tasks WHERE migration_id = %(r)s", {"r": sync.id})[0]
            assert stats == {"kept": 0, "seen": written}, stats
        names = db.sql("SELECT DISTINCT name FROM crm.contacts WHERE tenant_id = %(t)s AND source IS NULL", {"t": TENANT})
        assert [r["name"] for r in names] == ["Our Own Contact"]
        proof = verify(db, provider, TENANT, FAST, kinds=["persons"])
        persons = proof.kinds[0]
        assert proof.passed and persons.stale == [] and set(persons.kept) == changed, proof.lines()
        assert any(line.strip().startswith(f"kept {len(changed)} (matched, source newer, not overwritten: run with "
                                            "overwrite_matched") for line in proof.lines())

        over = runs.start_sync(db, provider, TENANT, options={**opts, "overwrite_matched": True}, settings=FAST)
        drain_threads(db, over.id, width=2, settings=FAST, providers=for_run)
        assert runs.get_run(db, over.id).status == "succeeded", failed_tasks(db, over.id)
        proof = verify(db, provider, TENANT, FAST, kinds=["persons"])
        assert proof.passed and proof.kinds[0].kept == [] and proof.kinds[0].stale == [], proof.kinds[0].as_dict()
        rows = sb.truth_rows("persons")
        for sid in changed:
            record = _ledger(db, "persons")[sid]["record_id"]
            name = db.sql("SELECT name FROM crm.contacts WHERE id = %(i)s", {"i": record})[0]["name"]
            assert name == rows[sid]["name"], f"person {sid}: overwrite_matched takes the source's values"


def test_a_sync_of_changes_only_retakes_skipped_rows_whose_parent_is_here_now(db) -> None:
    """A sync listing only what changed (detect_deletes false) does not list a skipped row that did
    not change; the parent it waited for may be here now (written by a later listing), so the
    catch-up asks the kind's skipped rows by id: the note ends created, linked to its deal, and the
    sync still adds up."""
    with sandbox(scale="tiny") as sb:
        run = start(db, sb, TENANT)
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        assert runs.get_run(db, run.id).status == "succeeded", failed_tasks(db, run.id)
        deal_of = {sid: row.get("deal_id") for sid, row in sb.truth_rows("notes").items()}
        deals = {s for s, e in _ledger(db, "deals").items() if e["action"] == "created"}
        sid, note = next((s, e) for s, e in sorted(_ledger(db, "notes").items())
                         if e["action"] == "created" and str(deal_of.get(s)) in deals)
        # as a run left it when the note's deal was not written yet: a placeholder, no product row
        db.sql("DELETE FROM crm.notes WHERE id = %(i)s", {"i": note["record_id"]})
        db.sql("UPDATE migration_records SET action = 'skipped', record_id = NULL, record_type = NULL,"
               " source_version = NULL, reason = %(why)s WHERE tenant_id = %(t)s AND kind = 'notes' AND source_id = %(s)s",
               {"why": f"not linked to any record: deal {deal_of[sid]} is not here", "t": TENANT, "s": sid})
        sync = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), TENANT,
                               options={"base_url": sb.base_url, "burst_limit": UNLIMITED, "detect_deletes": False},
                               settings=FAST)
        drain_threads(db, sync.id, width=2, settings=FAST, providers=for_run)
        assert runs.get_run(db, sync.id).status == "succeeded", failed_tasks(db, sync.id)
    entry = _ledger(db, "notes")[sid]
    assert entry["action"] == "created", entry
    deal = _ledger(db, "deals")[str(deal_of[sid])]["record_id"]
    assert db.sql("SELECT deal_id FROM crm.notes WHERE id = %(i)s", {"i": entry["record_id"]})[0]["deal_id"] == deal
    report = rollup.rollup(db, sync.id)
    assert report.complete, report.incomplete
