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
from tests.pipedrive.support import failed_tasks, migrate, sandbox

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


def test_the_engines_name_rule_folds_every_pipedrive_kind_as_pipedrive_does() -> None:
    for kind in pipedrive_kinds.BY_NAME:
        assert rollup_catchup.ledger_kind_named(kind) == pipedrive_kinds.ledger_kind(kind), kind
