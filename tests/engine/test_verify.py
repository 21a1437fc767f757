"""verify ("a proof from the source"): the source's ids per kind against the ledger and the
product's rows.

* The rules, pure: a skipped/failed placeholder is accounted for (not missing); a row marked deleted
  that the source lists again is missing; a live claim gone at the source is extra; two product
  rows for one source row are duplicated; a ledger version other than the source's is stale, a
  ledger row without a version is not compared.
* On a tiny sandbox account migrated for real: a clean tenant passes with zero differences and its
  cost is exactly what the sandbox charged (requests and tokens); then each difference is made -
  a product row deleted (missing), a row deleted at the source and not marked (extra, through the
  live sandbox), a product row duplicated (duplicated), a row changed at the source (stale, through
  the live sandbox) - and verify names each one.
"""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from engine_core.errors import ConfigError, RunNotFound
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core import runs
from engine_core.rows import WAITS_FOR_WALK
from engine_core.verify import KindResult, VerifyResult, compare, listing_kinds, unfinished_run_line, verify
from tests.pipedrive.support import FAST, IDENTITY, LEDGER_KIND, UNLIMITED, migrate, sandbox

TOKEN = "sandbox-tok-7f3a9c1e55b2d840"
NOW = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _entry(action: str = "created", version: str | None = "v1", deleted: datetime | None = None, record_id: int = 1,
           record_type: str = "crm.notes") -> dict:
    return {"action": action, "record_type": record_type, "record_id": record_id, "version": version, "deleted": deleted}


def test_the_rules_of_each_difference():
    at_source = {"1": "v1", "2": "v2", "3": "v1", "4": "v1", "5": None, "6": "v1", "10": "2026-11-30T10:00:00Z"}
    ledger = {
        "1": _entry(record_id=11),                        # here, same version: fine
        "2": _entry(record_id=12),                        # the source has v2: stale
        "3": _entry("skipped", version=None, record_id=0),  # a placeholder with its reason: unwritten
        "4": _entry(record_id=14, deleted=NOW),           # marked deleted, listed again: missing
        "5": _entry(record_id=15),                        # the listing has no version: not compared
        "6": _entry(record_id=16, version=None),          # written before versions: not compared
        "7": _entry(record_id=17),                        # gone at the source, not marked: extra
        "8": _entry(record_id=18, deleted=NOW),           # gone and marked: fine
        "9": _entry("matched", record_id=500),            # a live matched claim gone at the source: extra
        "10": _entry(version="2026-11-30 10:00:00", record_id=19),  # the same instant in v1's format: not stale
    }
    product = {"1": [True], "2": [True], "4": [False], "5": [True], "6": [True, True], "7": [True], "8": [False],
               "10": [True]}
    result = compare("notes", ["notes"], at_source, ledger, product, {"crm.notes": {11, 12, 15, 16, 17, 19}})
    assert result.missing == ["4"]
    assert result.stale == ["2"]
    assert result.duplicated == ["6"]
    assert result.extra == ["7", "9"]
    assert (result.source, result.unwritten, result.deleted_marked, result.unversioned) == (7, 1, 2, 1)
    assert result.unwritten_ids == ["3"] and result.as_dict()["unwritten_ids"] == ["3"]
    assert result.product == 6  # 1, 2, 5, 6, 7, 10 have a live product row


def test_a_matched_row_lives_through_its_record_not_a_source_id():
    # a contact the product already had carries no source id: its claim's record proves it
    result = compare("persons", ["persons"], {"42": "v"}, {"42": _entry("matched", "v", record_id=7,
                                                                        record_type="crm.contacts")},
                     {}, {"crm.contacts": {7}})
    assert result.differences == 0 and result.product == 1
    gone = compare("persons", ["persons"], {"42": "v"}, {"42": _entry("matched", "v", record_id=7,
                                                                      record_type="crm.contacts")}, {}, {})
    assert gone.missing == ["42"]


def test_a_kind_the_source_cannot_list_is_shown_but_proves_nothing():
    unlisted = KindResult("fields", ("fields",), checked=False, note="not listed")
    assert not VerifyResult("acme", "pipedrive", [unlisted]).passed
    both = VerifyResult("acme", "pipedrive", [unlisted, KindResult("notes", ("notes",), source=3, ledger=3, product=3)])
    assert both.passed
    assert both.lines()[0] == "fields: not checked (not listed)"


def test_kinds_fold_into_ledger_identities_and_unknown_kinds_are_one_line():
    provider = PipedriveProvider(base_url="http://127.0.0.1:1", token="t")
    kinds = listing_kinds(provider, ["deals", "notes"])
    assert kinds == {"deals": ["deals", "deals_archived"], "notes": ["notes"]}
    assert listing_kinds(provider, ["leads_archived"]) == {"leads": ["leads", "leads_archived"]}
    with pytest.raises(ConfigError, match="kinds: contacts not in the pipedrive plan"):
        listing_kinds(provider, ["contacts"])


def test_an_unknown_tenant_is_one_line(db):
    with pytest.raises(RunNotFound, match="tenant 'nobody' has no migration run"):
        verify(db, PipedriveProvider(base_url="http://127.0.0.1:1", token="t"), "nobody", FAST)


def _ledger_kind(truth_kind: str) -> str:
    kind = LEDGER_KIND.get(truth_kind, truth_kind)
    return IDENTITY.get(kind, kind)


def _by_kind(result) -> dict:
    return {k.kind: k for k in result.kinds}


def _one_change(sb, op: str) -> dict:
    sb.configure(live_mix=f"{op}:1")
    changes = [c for c in sb.live_step(1) if c["op"] == op]
    assert len(changes) == 1, changes
    return changes[0]


def test_a_clean_tenant_passes_then_each_difference_is_named(db):
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded"
        provider = PipedriveProvider(base_url=sb.base_url, token=TOKEN)
        sb.reset_stats()
        clean = verify(db, provider, "acme", FAST)
        charged = sb.stats()
        assert clean.passed, "\n".join(clean.lines())
        assert clean.differences == 0
        # refreshed by every run, not listed; the opt-in kinds no run of the tenant took are left out
        assert [k.kind for k in clean.kinds if not k.checked and not k.note.startswith("left out")] == ["fields"]
        # why, in a user's words: it had said "not checked (the pipedrive provider has no id listing for 'fields')"
        (fields_line,) = [ln for ln in clean.lines() if ln.startswith("fields: ")]
        assert "every run and sync reads the source's whole field lists again" in fields_line, fields_line
        assert {"persons", "deals", "leads", "notes", "emails"} <= set(_by_kind(clean))
        # the cost beside the result is what the source charged for the listings
        assert (clean.requests, clean.tokens) == (charged["requests_total"], charged["tokens_total"])
        assert clean.tokens > 0
        assert "tokens" in clean.lines()[-1] and "PASSED" in clean.lines()[-1]

        # missing: a product row deleted behind the ledger's back
        gone = db.sql("SELECT r.source_id, r.record_id FROM migration_records r WHERE r.tenant_id = 'acme'"
                      " AND r.kind = 'activities' AND r.action = 'created' ORDER BY r.record_id LIMIT 1")[0]
        db.sql("DELETE FROM crm.activities WHERE id = %(id)s RETURNING id", {"id": gone["record_id"]})
        # duplicated: a second product row for one source row
        twin = db.sql("INSERT INTO crm.notes (tenant_id, content, source, source_id)"
                      " SELECT tenant_id, content, source, source_id FROM crm.notes WHERE tenant_id = 'acme'"
                      " AND source_id IS NOT NULL ORDER BY id LIMIT 1 RETURNING source_id")[0]["source_id"]
        # extra: a row deleted at the source, not marked; stale: a row changed at the source
        deleted = _one_change(sb, "delete")
        updated = _one_change(sb, "update")
        # a latest run that stopped short: said first, as the reason for what is missing
        db.sql("UPDATE migrations SET status = 'stopped' WHERE id = %(r)s RETURNING 1", {"r": run.id})
        found = verify(db, provider, "acme", FAST)

    kinds = _by_kind(found)
    assert not found.passed
    assert kinds["activities"].missing == [gone["source_id"]]
    assert kinds["notes"].duplicated == [twin]
    assert str(deleted["id"]).lower() in kinds[_ledger_kind(deleted["kind"])].extra
    assert str(updated["id"]).lower() in kinds[_ledger_kind(updated["kind"])].stale
    named = {(k.kind, d, sid) for k in found.kinds for d in ("missing", "extra", "duplicated", "stale")
             for sid in getattr(k, d)}
    made = {("activities", "missing", gone["source_id"]), ("notes", "duplicated", twin),
            (_ledger_kind(deleted["kind"]), "extra", str(deleted["id"]).lower()),
            (_ledger_kind(updated["kind"]), "stale", str(updated["id"]).lower())}
    assert made <= named
    # nothing else, but what a delete takes with it at the source (a deleted deal's mail)
    assert {n for n in named - made if n[0] != "emails"} == set(), named - made
    text = "\n".join(found.lines())
    assert "missing 1: " + gone["source_id"] in text and "FAILED" in text
    assert found.lines()[0] == f"run #{run.id} stopped before it finished; `migrate run --tenant acme` resumes it"
    assert found.as_dict()["unfinished"] == found.lines()[0]
    assert clean.unfinished is None and not clean.lines()[0].startswith("run #")


def test_an_unfinished_latest_run_is_named_with_the_rows_waiting_for_its_catch_up(db):
    """A fresh user's verify after a run stopped before its catch-up said only "FAILED: 332
    difference(s)": the line names the run, the rows its catch-up would settle, what resumes it."""
    (r,) = db.sql("INSERT INTO migrations (tenant_id, source, source_account, status, plan)"
                  " VALUES ('halt', 'pipedrive', 'acct', 'stopped', %(p)s::jsonb) RETURNING id",
                  {"p": '[["persons"], ["catchup"]]'})
    db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, action, reason)"
           " SELECT %(r)s, 'halt', 'pipedrive', 'persons', g::text, 'skipped', %(w)s FROM generate_series(1, 2) g"
           " RETURNING 1", {"r": r["id"], "w": f"organization 3 is not here, {WAITS_FOR_WALK}"})
    run = runs.latest_run(db, "halt", "pipedrive")
    assert unfinished_run_line(db, run) == (f"run #{r['id']} stopped before it finished (2 rows wait for its catch-up); "
                                            "`migrate run --tenant halt` resumes it")
    db.sql("UPDATE migrations SET status = 'running' WHERE id = %(r)s RETURNING 1", {"r": r["id"]})
    assert unfinished_run_line(db, runs.latest_run(db, "halt", "pipedrive")).startswith(f"run #{r['id']} is still running, not finished (2 rows")
    db.sql("UPDATE migrations SET status = 'succeeded' WHERE id = %(r)s RETURNING 1", {"r": r["id"]})
    assert unfinished_run_line(db, runs.latest_run(db, "halt", "pipedrive")) is None


def test_a_matched_row_whose_source_is_newer_is_kept_not_stale():
    # the product's own contact, not overwritten without overwrite_matched: named, not a difference
    ledger = {"42": _entry("matched", "2026-11-30T10:00:00Z", record_id=7, record_type="crm.contacts"),
              "43": _entry("created", "2026-11-30T10:00:00Z", record_id=8, record_type="crm.contacts")}
    at_source = {"42": "2026-11-30T11:00:00Z", "43": "2026-11-30T11:00:00Z"}
    result = compare("persons", ["persons"], at_source, ledger, {"43": [True]}, {"crm.contacts": {7, 8}})
    assert result.kept == ["42"] and result.stale == ["43"] and result.differences == 1
    assert result.as_dict()["kept"] == ["42"]
    lines = VerifyResult("acme", "pipedrive", [result]).lines()
    assert "  kept 1 (matched, source newer, not overwritten: run with overwrite_matched to take them): 42" in lines
    # a matched row the source serves OLDER than the ledger's is no choice of the user's: stale
    older = compare("persons", ["persons"], {"42": "2026-11-30T09:00:00Z"}, ledger, {}, {"crm.contacts": {7, 8}})
    assert older.stale == ["42"] and older.kept == []
