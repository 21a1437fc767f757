"""A follow-up run of the archived lists alone (`--kinds deals_archived,leads_archived` after a run of
the six kinds a plain loader reads) adds up: its rows are claimed in the ledger under `deals` and
`leads`, the ledger kinds the archived lists are held under, and the rollup's add-up check compares
its phase with those (it compared with `deals_archived` and `leads_archived`, which hold nothing,
and said "140 imported ... but 0 claimed in the ledger by this run"). Reconciled with the
sandbox's truth (its archived counts) and the ledger; the name rule the engine folds by is held to
Pipedrive's own (`kinds.ledger_kind`)."""
from __future__ import annotations

from engine_core import rollup, rollup_catchup
from engine_core.providers.pipedrive import kinds as pipedrive_kinds
from tests.pipedrive.support import failed_tasks, live_op, migrate, sandbox

SIX = ["organizations", "persons", "deals", "leads", "activities", "notes"]
ARCHIVED = ["deals_archived", "leads_archived"]


def test_a_run_of_the_archived_lists_alone_adds_up_against_the_ledger_kinds_that_hold_them(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, "acme", kinds=SIX)
        second = migrate(db, sb, "acme", kinds=ARCHIVED)
        counts = sb.truth()["counts"]
    assert first.status == second.status == "succeeded", (failed_tasks(db, first.id), failed_tasks(db, second.id))
    r = rollup.rollup(db, second.id)
    assert r.complete, r.incomplete
    kinds = {k.kind: k for k in r.kinds}
    claimed = {row["kind"]: int(row["n"]) for row in db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE migration_id = %(r)s AND action IN ('created', 'matched')"
        " GROUP BY kind", {"r": second.id})}
    for archived, held_under in (("deals_archived", "deals"), ("leads_archived", "leads")):
        k = kinds[archived]
        # every archived row the source serves, imported by this run and claimed under its ledger kind
        assert k.seen == counts[archived] == k.written, (archived, k, counts)
        assert claimed.get(held_under, 0) == k.written and claimed.get(archived, 0) == 0, (archived, claimed)
    phase = next(c for c in r.completeness if set(c["kinds"]) >= set(ARCHIVED))
    assert phase["complete"] and phase["stats_written"] == phase["ledger_written"] > 0, phase


def test_a_deal_deleted_before_a_run_of_the_archived_lists_alone_is_counted_under_their_kind(db) -> None:
    """The run's catch-up walks the active deals too (to settle them) and marks a deal deleted at the
    source under `deals`: the rollup counts it beside the archived deals, the kind of the plan held
    under `deals`, not under a `deals` kind of the catch-up's phase (whose add-up check would then
    count every deal this run claimed: "phase 2 (catchup, deals): 0 imported or matched in the task stats but
    6 claimed in the ledger by this run")."""
    with sandbox() as sb:
        first = migrate(db, sb, "acme", kinds=SIX)
        gone = next(c for c in (live_op(sb, "delete") for _ in range(60)) if c["kind"] == "deals")
        second = migrate(db, sb, "acme", kinds=ARCHIVED)
    assert first.status == second.status == "succeeded", (failed_tasks(db, first.id), failed_tasks(db, second.id))
    marked = db.sql("SELECT source_id FROM migration_records WHERE tenant_id = 'acme' AND kind = 'deals'"
                    " AND deleted_at_source IS NOT NULL")
    assert [r["source_id"] for r in marked] == [str(gone["id"])], (marked, gone)
    r = rollup.rollup(db, second.id)
    assert r.complete, r.incomplete
    kinds = {k.kind: k for k in r.kinds}
    assert "deals" not in kinds and kinds["deals_archived"].deleted_at_source == 1, kinds.keys()


def test_the_engines_name_rule_folds_every_pipedrive_kind_as_pipedrive_does() -> None:
    for kind in pipedrive_kinds.BY_NAME:
        assert rollup_catchup.ledger_kind_named(kind) == pipedrive_kinds.ledger_kind(kind), kind
