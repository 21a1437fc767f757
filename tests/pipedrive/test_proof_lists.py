"""A run that imports one list of a ledger kind and not the other (deals but not archived deals,
leads but not archived leads: the six kinds a plain loader reads) settles its activities' and
notes' missing parents by its catch-up's walk, not by asking the source (`walk_proof.proof_lists`),
over the sandbox on real Postgres. Pinned here:
* the outcome of every row is the one the source's answers give: the same ledger entries (action,
  reason, dangling references) and the same product links as a run that asks the source about each
  missing parent, row by row, kind by kind - rows on deleted parents imported with the link empty,
  rows on archived ones (there, not imported) placeholders saying so;
* it asks about none: no lead by id, no `ids=` question of the deal lists; the archived lists are
  walked once each;
* a deal the run wrote and that is archived before the catch-up is written as archived by the
  walk of the archived list (the kind's deletes task no longer asks it by id).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pytest

from engine_core import rollup
from engine_core.providers.pipedrive import catchup, walk_proof
from engine_core.worker import Worker
from engine_core.providers.registry import for_run
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox, start
from tests.pipedrive.test_live_listing import assert_current, change, entry, finish

SIX = ["organizations", "persons", "deals", "leads", "activities", "notes"]
LINKS = {"activities": ("deal_id", "lead_id", "contact_id", "company_id"),
         "notes": ("deal_id", "lead_id", "contact_id", "company_id")}
TABLE = {"activities": "crm.activities", "notes": "crm.notes"}
PROBES = ("/v1/leads/{id}", "/api/v2/deals/{id}")


def _outcomes(db, tenant: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = db.sql("SELECT kind, source_id, action, reason, dangling FROM migration_records WHERE tenant_id = %(t)s",
                  {"t": tenant})
    return {(r["kind"], r["source_id"]): (r["action"], r["reason"], r["dangling"]) for r in rows}


def _links(db, tenant: str) -> dict[tuple[str, str], tuple[bool, ...]]:
    out: dict[tuple[str, str], tuple[bool, ...]] = {}
    for kind, columns in LINKS.items():
        rows = db.sql(f"SELECT source_id, {', '.join(columns)} FROM {TABLE[kind]} WHERE tenant_id = %(t)s",
                      {"t": tenant})
        out.update(((kind, r["source_id"]), tuple(r[c] is not None for c in columns)) for r in rows)
    return out


def _deal_ids_questions(listings: dict[str, int]) -> int:
    return sum(n for key, n in listings.items()
               if key.partition("?")[0] in ("/api/v2/deals", "/api/v2/deals/archived") and "ids" in parse_qs(key.partition("?")[2]))


@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_six_kinds_settle_missing_parents_by_the_walk_with_the_outcomes_asking_gives(db, monkeypatch, scale: str) -> None:
    with sandbox(scale=scale, seed=7) as sb:
        sb.reset_stats()
        walked = migrate(db, sb, "walked", kinds=SIX)
        stats = sb.stats()
        with monkeypatch.context() as m:  # the same run asking the source about every missing parent
            m.setattr(walk_proof, "proof_lists", lambda kinds: ())
            m.setattr(catchup, "proof_lists", lambda kinds: ())
            sb.reset_stats()
            asked = migrate(db, sb, "asked", kinds=SIX)
            asking = sb.stats()
    assert walked.status == asked.status == "succeeded", (failed_tasks(db, walked.id), failed_tasks(db, asked.id))
    # row by row, kind by kind: the same outcome and the same links
    ours, theirs = _outcomes(db, "walked"), _outcomes(db, "asked")
    assert ours.keys() == theirs.keys()
    differing = {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]}
    assert differing == {}
    assert _links(db, "walked") == _links(db, "asked")
    # the account has what the walk settles: rows on deleted parents and on archived ones
    actions = [v[0] for k, v in ours.items() if k[0] in LINKS]
    assert any(v[2] for v in ours.values()) and "skipped" in actions
    # ...settled without asking: the asking run asked, this one did not
    assert sum(asking["requests"].get(p, 0) for p in PROBES) + _deal_ids_questions(asking["listings"]) > 0
    assert sum(stats["requests"].get(p, 0) for p in PROBES) + _deal_ids_questions(stats["listings"]) == 0
    assert stats["requests_total"] < asking["requests_total"]
    # the run adds up as the asking one does
    mine, other = rollup.rollup(db, walked.id), rollup.rollup(db, asked.id)
    assert mine.incomplete == other.incomplete == []
    assert _totals(mine) == _totals(other)


def _totals(report: Any) -> dict[str, tuple[int, int, int]]:
    """Per kind: (imported, skipped, failed), the kind's phase and the catch-up's together (rows its
    phase left waiting for the catch-up are imported there)."""
    return {k.kind: (k.imported + k.caught_up.get("imported", 0), k.skipped, k.failed)
            for k in report.kinds if k.kind != "catchup"}


def test_a_deal_archived_before_the_catch_up_is_written_archived_by_the_walk_of_the_archived_list(db) -> None:
    with sandbox() as sb:
        run = start(db, sb, "acme", kinds=["organizations", "persons", "deals", "activities"])
        assert catchup.proof_kinds(run) == ("deals_archived",)
        deals_phase = next(i for i, group in enumerate(run.plan) if "deals" in group)
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=deals_phase)
        deal = min(int(i) for i in sb.truth("deals")["ids"]["deals"])
        assert entry(db, "deals", deal)["action"] == "created"
        change(sb, "archive", "deals", deal)
        sb.reset_stats()
        finish(db, run.id)
        requests = sb.stats()["requests"]
        row = assert_current(db, sb, "deals", deal, truth_kind="deals_archived")
    assert row["archived"] is True
    assert requests.get("/api/v2/deals/archived", 0) >= 1 and requests.get("/api/v2/deals/{id}", 0) == 0


def test_a_run_of_the_archived_lists_alone_asks_no_record_an_earlier_run_wrote_from_the_other_lists(db) -> None:
    """The deletes task asks by id each record of the ledger kind the catch-up's walk did not serve:
    a run of the archived lists alone, after one of the active lists, asked every active deal and
    lead the first run wrote. Its catch-up walks the active lists too, only to settle them."""
    with sandbox() as sb:
        first = migrate(db, sb, "acme", kinds=["organizations", "persons", "deals", "leads"])
        sb.reset_stats()
        second = migrate(db, sb, "acme", kinds=["deals_archived", "leads_archived"])
        requests = sb.stats()["requests"]
        truth = sb.truth()["ids"]
    assert first.status == second.status == "succeeded", (failed_tasks(db, first.id), failed_tasks(db, second.id))
    assert catchup.proof_kinds(second) == ("deals", "leads")
    assert requests.get("/api/v2/deals/{id}", 0) == 0 and requests.get("/v1/leads/{id}", 0) == 0, requests
    # nothing marked deleted that the source still has
    marked = db.sql("SELECT kind, source_id FROM migration_records WHERE tenant_id = 'acme'"
                    " AND deleted_at_source IS NOT NULL AND kind IN ('deals', 'leads')")
    live = {("deals", str(i)) for i in truth["deals"]} | {("leads", str(i).lower()) for i in truth["leads"]}
    assert not {(r["kind"], r["source_id"]) for r in marked} & live


def test_verify_of_a_tenant_without_the_archived_lists_misses_no_archived_row(db) -> None:
    """Verify lists a ledger kind's every list; one no run of the tenant took (archived deals and
    leads, not chosen) counts only the rows a run wrote that moved there (archived since): the rest
    are not this tenant's, not missing (it said FAILED: "deals: missing 99")."""
    from engine_core.providers.pipedrive.provider import PipedriveProvider
    from engine_core.verify import verify

    with sandbox() as sb:
        run = migrate(db, sb, "acme", kinds=SIX)
        provider = PipedriveProvider(base_url=sb.base_url)
        before = verify(db, provider, "acme", FAST)
        deal = min(int(i) for i in sb.truth("deals")["ids"]["deals"])
        assert entry(db, "deals", deal)["action"] == "created"
        change(sb, "archive", "deals", deal)  # written active, archived since: still the tenant's
        after = verify(db, provider, "acme", FAST)
        archived = len(sb.truth()["ids"]["deals_archived"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert archived > 1
    assert before.passed, "\n".join(before.lines())
    deals = [next(k for k in proof.kinds if k.kind == "deals") for proof in (before, after)]
    assert deals[0].checked and deals[0].source == deals[0].ledger + deals[0].skipped + deals[0].failed
    # the deal archived since is found in the archived list (changed there: stale until a sync), not missing
    assert deals[1].source == deals[0].source and deals[1].differences == 1, deals[1].as_dict()
    line = next(x for x in after.lines() if x.startswith("deals:"))
    assert "missing" not in line and "stale 1" in "\n".join(after.lines()), after.lines()
