"""The catch-up's share of a phase's skipped and failed rows is each kind's own
(`rollup_catchup`): on a sandbox whose catch-up skips rows of both deals and leads after their
phase closed, while the phase skipped archived leads (held under `leads`), each ledger kind's
figures - its kind's plus its archived kind's - are what the ledger holds under it, as `migrate
rows` counts them; the archived leads' count is netted against `leads`, not against the kind of
the phase with the most rows beyond its count (`deals`)."""
from __future__ import annotations

from tests.pipedrive.support import migrated_rollup, sandbox

TENANT = "acme"
# the tiny account of seed 6 at 5% malformed rows: the catch-up skips deals and leads the phase did
# not, and the phase skips archived leads
ACCOUNT = {"scale": "tiny", "seed": 6, "faults": "badrow:0.05"}
IDENTITIES = {"deals": ("deals", "deals_archived"), "leads": ("leads", "leads_archived")}


def test_the_catchups_skips_of_two_kinds_of_one_phase_stay_each_its_own(db) -> None:
    with sandbox(**ACCOUNT) as sb:
        _, r, kinds, held = migrated_rollup(db, sb, TENANT)
    # the situation: the phase skipped archived leads, and the catch-up skipped rows of both kinds
    assert kinds["leads_archived"].at_close().skipped > 0, kinds["leads_archived"]
    said = {k["kind"]: k for k in r.as_dict()["kinds"]}
    for ledger_kind, members in IDENTITIES.items():
        phase = sum(kinds[m].at_close().skipped for m in members)
        assert held[ledger_kind]["skipped"] > phase, (ledger_kind, held[ledger_kind], phase)
        for outcome in ("skipped", "failed"):
            figure = sum(getattr(kinds[m], outcome) for m in members)
            assert figure == held[ledger_kind][outcome], (ledger_kind, outcome, figure, held[ledger_kind])
        # the catch-up's part is the kind's own: what the ledger holds beyond its phase's count
        assert kinds[ledger_kind].skipped_by_catchup == held[ledger_kind]["skipped"] - phase, kinds[ledger_kind]
        assert said[ledger_kind]["skipped_by_catchup"] == kinds[ledger_kind].skipped_by_catchup
        assert said[ledger_kind]["skipped"] == kinds[ledger_kind].skipped
    for k in r.kinds:  # every row of the table still adds up
        assert k.seen == k.accounted, (k.kind, k)
        assert not (k.kind.endswith("_archived") and (k.skipped_by_catchup or k.failed_by_catchup)), k
    # `migrate report`'s headline sums the kinds as their phases counted them and the catch-up's
    # own row once: the run's skipped and failed rows, as the ledger holds them (it had added the
    # catch-up's rows twice: in each kind's figure and in the catch-up's)
    from migration_pipeline.cli.tables import outcome_counts

    headline = outcome_counts(r)
    for outcome in ("skipped", "failed"):
        assert headline[outcome] == sum(h[outcome] for h in held.values()), (outcome, headline, held)
