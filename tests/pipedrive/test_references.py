"""References to parents deleted at the source (issue 8, item 5), over the sandbox on real Postgres.

Pipedrive keeps a child's `org_id` (`person_id`, `deal_id`, `lead_id`) after the parent was
permanently deleted; the sandbox's purged ids answer 404. Pinned here:
* every row whose parent does not exist at the source is imported with that link empty, and the
  dangling reference is kept on the product row (`dangling_refs`) and on its ledger entry
  (`dangling`); `ledger_reads.dangling_counts` per kind equals the sandbox's `truth["dangling"]` exactly,
  and `explain` says "imported; org_id 42 does not exist at the source";
* the dependents of such rows (a deal on a person whose organization was deleted, the activities,
  notes and emails of a deal whose person was deleted) are imported and linked;
* a full run asks the source about none of them: its walks leave them to the catch-up, whose whole
  walk proves them gone (`walk_proof`); its phases count them `waiting` (not skipped), the catch-up
  counts them imported under their kind, and nothing waits for the catch-up after the run - the
  rollup names a placeholder that still does, and one deleted at the source says so (runs
  that still ask - a dry run, a sync - ask once per distinct missing parent: test_probe_batch);
* a parent that exists at the source but failed stays a placeholder: its children are skipped
  "not linked", never imported with an empty link;
* a run that does not import the parent kind, of a tenant no run of which did, leaves its rows
  placeholders and asks nothing (one that an earlier run imported is asked: test_earlier_kinds).
"""
from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import parse_qs

import pytest

from engine_core import ledger, ledger_reads, rollup, row_story
from engine_core.providers.pipedrive import walk_proof
from engine_core.providers.pipedrive.kinds import KINDS
from engine_core.providers.pipedrive.record_lists import FAMILIES
from engine_core.providers.pipedrive.writers import DANGLING, NOT_LINKED, NOT_WRITTEN
from engine_core.rows import GONE_BEFORE_WALK, WAITS_FOR_WALK
from migration_pipeline.cli.tables import outcome_counts
from tests.pipedrive.support import actions, failed_tasks, migrate, sandbox

TENANT = "acme"
# truth name of a parent kind -> the ledger kind that holds it, and the source ids that exist
PARENT_TRUTH = {"organizations": ("organizations",), "persons": ("persons",), "deals": ("deals", "deals_archived"),
                "leads": ("leads", "leads_archived")}
COLUMN = {"org_id": "company_id", "organization_id": "company_id", "person_id": "contact_id", "deal_id": "deal_id",
          "lead_id": "lead_id"}
TABLE = {"persons": "contacts", "deals": "deals", "leads": "leads", "activities": "activities", "notes": "notes"}
SINGLE = ("/api/v2/organizations/{id}", "/api/v2/persons/{id}", "/api/v2/deals/{id}", "/v1/leads/{id}")
# the lists a missing parent is asked of first, many at a time (`kinds.BATCH_PATHS`)
BATCHED = {"/api/v2/organizations": "organizations", "/api/v2/persons": "persons", "/api/v2/deals": "deals"}


def _asked_in_lists(listings: dict[str, int]) -> Counter:
    """(kind, id) -> how many times the id was in an `ids=` question of the kind's first list."""
    out: Counter = Counter()
    for key, n in listings.items():
        path, _, query = key.partition("?")
        ids = parse_qs(query).get("ids")
        if path in BATCHED and ids:
            for sid in ids[0].split(","):
                out[(BATCHED[path], sid)] += n
    return out


def _dangling_entries(db, kind: str) -> dict[str, dict[str, Any]]:
    rows = db.sql(
        "SELECT source_id, action, reason, record_id, dangling FROM migration_records"
        " WHERE tenant_id = %(t)s AND kind = %(k)s AND dangling IS NOT NULL",
        {"t": TENANT, "k": kind},
    )
    return {r["source_id"]: r for r in rows}


def _existing(truth: dict[str, Any], parent_kind: str) -> set[str]:
    return {str(i).lower() for name in PARENT_TRUTH[parent_kind] for i in truth["ids"][name]}


@pytest.mark.parametrize("seed", [7, 9])  # 7: six persons on a deleted organization; 9: five deals on deleted people
def test_rows_on_deleted_parents_are_imported_with_the_link_empty_and_the_id_kept(db, seed: int) -> None:
    with sandbox(seed=seed) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        stats = sb.stats()
        requests = stats["requests"]
    assert run.status == "succeeded", failed_tasks(db, run.id)
    expected = {k: {str(i).lower() for i in ids} for k, ids in truth["dangling"].items()}
    assert ledger_reads.dangling_counts(db, run.id) == {k: len(v) for k, v in expected.items() if v}
    asked: set[tuple[str, str]] = set()
    for kind, ids in expected.items():
        entries = _dangling_entries(db, kind)
        assert set(entries) == ids, kind
        rows = {r["id"]: r for r in db.sql(f"SELECT * FROM crm.{TABLE[kind]} WHERE tenant_id = %(t)s", {"t": TENANT})}
        for sid, entry in entries.items():
            assert entry["action"] == "created"
            row = rows[entry["record_id"]]
            assert row["source_id"] == sid and row["dangling_refs"] == entry["dangling"]
            for ref in entry["dangling"]:
                # the parent really does not exist at the source; the link is empty, the id kept
                assert ref["parent_id"] not in _existing(truth, ref["parent_kind"]), ref
                assert row[COLUMN[ref["field"]]] is None
                assert f"{ref['field']} {ref['parent_id']} {DANGLING}" in entry["reason"]
                # no HTTP status in it: most parents are proven absent by a list (200), not a 404
                assert "(404)" not in entry["reason"] and "does not exist at the source" in entry["reason"]
                asked.add((ref["parent_kind"], ref["parent_id"]))
            said = row_story.explain(db, TENANT, kind, sid)
            assert said is not None and said["action"] == "created" and said["reason"].startswith("imported; ")
    # nothing of the account is lost: no row skipped, every listed row written
    lost = db.sql("SELECT kind, source_id, reason FROM migration_records WHERE tenant_id = %(t)s AND action <> 'created'",
                  {"t": TENANT})
    assert lost == []
    # a full run asks about none of them: its walks leave them to the catch-up, whose whole walk
    # did not list them (`walk_proof`) - no parent by id, no `ids=` question
    in_lists = _asked_in_lists(stats["listings"])
    assert asked and sum(requests.get(path, 0) for path in SINGLE) + sum(in_lists.values()) == 0, in_lists
    # and nothing waits for the catch-up after it: every waiting placeholder was settled
    assert not db.sql("SELECT 1 FROM migration_records WHERE tenant_id = %(t)s AND reason LIKE %(w)s",
                      {"t": TENANT, "w": f"%{WAITS_FOR_WALK}%"})
    # counted as it happened: a row its phase left to the catch-up's walk is `waiting` there, not
    # skipped, and the catch-up's count of its kind says it was imported; the run adds up
    report = rollup.rollup(db, run.id)
    waited = {k.kind: k.waiting for k in report.kinds if k.waiting}
    assert sum(waited.values()) >= sum(len(v) for v in expected.values()) and report.incomplete == []
    assert {k.kind: k.skipped for k in report.kinds if k.skipped} == {} and "catchup" not in waited
    assert waited == {k.kind: k.caught_up.get("imported", 0) for k in report.kinds if k.kind in waited}
    # `migrate report` and `status` show them as an outcome of their own (a run stopped before its
    # catch-up would otherwise show rows that are neither written nor skipped nor failed)
    assert {kind: outcome_counts(report, kind)["waiting"] for kind in waited} == waited
    # ...and the run's totals count each once, with the catch-up's outcome: none still left to it
    assert outcome_counts(report)["waiting"] == 0
    # the run-end check: a placeholder of the succeeded run still waiting is named...
    with db.transaction() as tx:
        ledger.skip(tx, run, "persons", "999999", f"{NOT_LINKED}: org_id 5 is not here, {WAITS_FOR_WALK}", "v1")
    assert rollup.rollup(db, run.id).incomplete == ["persons: 1 row still waits for the catch-up's walk"]
    # ...and once its row is deleted at the source, it says so instead of waiting
    with db.transaction() as tx:
        assert ledger.mark_deleted(tx, run, "persons", ["999999"]) == 1
    assert _ledger(db, "persons")["999999"]["reason"] == GONE_BEFORE_WALK
    assert rollup.rollup(db, run.id).incomplete == []
    # the dependents of rows with a deleted parent are imported and linked to them
    dependents = 0
    for kind, child_kind, column in (("persons", "deals", "contact_id"), ("persons", "leads", "contact_id"),
                                     ("deals", "activities", "deal_id"), ("deals", "notes", "deal_id"),
                                     ("deals", "emails", "deal_id")):
        parents = [e["record_id"] for e in _dangling_entries(db, kind).values()]
        linked = db.sql(f"SELECT count(*) AS n FROM crm.{child_kind} WHERE tenant_id = %(t)s AND {column} = ANY(%(p)s)",
                        {"t": TENANT, "p": parents})[0]["n"]
        dependents += linked
    assert dependents >= (4 if seed == 7 else 6)


def test_a_parent_that_failed_stays_a_placeholder(db) -> None:
    # badrow: malformed organizations fail alone (some with a sound id: the ledger knows them as
    # failed); their persons must stay placeholders, not be imported as if the parent were deleted
    with sandbox(seed=3, faults="badrow:0.15") as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    bad_orgs = {str(i) for i in truth["malformed"]["organizations"]}
    failed_orgs = {sid for sid, r in _ledger(db, "organizations").items() if r["action"] == "failed"}
    assert failed_orgs and failed_orgs <= bad_orgs
    persons = _ledger(db, "persons")
    children = {str(p["id"]) for p in _source_persons(truth, sb_seed=3) if str(p.get("org_id")) in bad_orgs}
    assert children, "the account must have persons in a malformed organization"
    for sid in children & set(persons):
        entry = persons[sid]
        assert entry["action"] in ("skipped", "failed"), entry
        if entry["action"] == "skipped":
            assert entry["reason"].startswith(NOT_LINKED), entry
    # a parent without a sound id is unknown to the ledger: the source says it exists -> placeholder
    unkeyed = bad_orgs - set(_ledger(db, "organizations"))
    for sid in children & set(persons):
        org = next(str(p["org_id"]) for p in _source_persons(truth, sb_seed=3) if str(p["id"]) == sid)
        if org in unkeyed and persons[sid]["action"] == "skipped":
            assert NOT_WRITTEN in persons[sid]["reason"], persons[sid]
    skipped = {sid for sid in children & set(persons) if persons[sid]["action"] == "skipped"}
    assert skipped, "some persons of failed organizations must be in the ledger as placeholders"
    assert not _dangling_entries(db, "persons").keys() & skipped


def test_a_parent_kind_the_run_does_not_import_stays_a_placeholder_and_is_not_asked(db) -> None:
    with sandbox(seed=7) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT, kinds=["persons"])
        stats = sb.stats()
        requests = stats["requests"]
    assert run.status == "succeeded", failed_tasks(db, run.id)
    persons = _ledger(db, "persons")
    with_org = {str(p["id"]) for p in _source_persons(truth, sb_seed=7) if p.get("org_id") is not None}
    assert with_org and actions(persons, "skipped") == with_org
    assert sum(requests.get(path, 0) for path in SINGLE) == 0 and not _asked_in_lists(stats["listings"])
    assert ledger_reads.dangling_counts(db, run.id) == {}


# --- helpers -------------------------------------------------------------------------------------


def _ledger(db, kind: str) -> dict[str, dict[str, Any]]:
    rows = db.sql("SELECT source_id, action, reason, record_id, dangling FROM migration_records"
                  " WHERE tenant_id = %(t)s AND kind = %(k)s", {"t": TENANT, "k": kind})
    return {r["source_id"]: r for r in rows}


def _source_persons(truth: dict[str, Any], *, sb_seed: int) -> list[dict[str, Any]]:
    from pipedrive_sandbox.data import dataset_for

    ds = dataset_for("tiny", sb_seed, None)
    return [ds.record("persons", i) for i in range(ds.count("persons"))]


def test_a_row_a_kind_outside_the_walk_points_at_is_not_left_to_the_catch_up() -> None:
    # a participant points at its person; the catch-up does not walk participants and reads a deal's
    # participants again only for the deals it writes: a person left waiting would leave its
    # participants skipped (test_crm_fanouts_run's faults run lost one). So a run taking
    # participants asks about a person's missing organization; the owners the catch-up reads again
    # are the record lists' own (`record_lists.FAMILIES`)
    assert {k: f.of for k, f in FAMILIES.items()} == {k: walk_proof.RECHECKED[k] for k in FAMILIES}
    default = [k.name for k in KINDS if k.default]
    assert walk_proof.left_to_catchup(default, "persons", "organizations")
    assert walk_proof.left_to_catchup([*default, "followers", "deal_history"], "persons", "organizations")
    assert not walk_proof.left_to_catchup([*default, "participants"], "persons", "organizations")
    assert walk_proof.left_to_catchup([*default, "participants"], "deals", "persons")
