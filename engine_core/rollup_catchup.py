"""What the catch-up failed and skipped of the kinds whose phase had closed: the rollup's
`failed_by_catchup` and `skipped_by_catchup`, and the check that neither counts a row twice
(`beyond_listing`).

The catch-up writes rows of every kind after their phases closed. The failed and skipped records
the run holds per kind (one read, `rollup._LEDGER_HELD`, grouped by the ledger entries' kind)
beyond what the kind's phase counted are the catch-up's, and each kind's share is its own: the
kinds of a phase are compared with the ledger one ledger kind at a time (`_identities`: archived
deals and leads are netted with `deals` and `leads`, under which their records are held), so two
kinds of one phase never trade the catch-up's rows.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from engine_core.rows import AGAIN, SKIPPED_WAITING

if TYPE_CHECKING:
    from engine_core.models import Run
    from engine_core.rollup import KindRollup


# the catch-up's counts of the rows it met that the run held as placeholders (`rows.AGAIN`)
_HEARD = frozenset({*AGAIN.values(), SKIPPED_WAITING})


def closed_phase_kinds(run: Run, kinds: dict[str, KindRollup]) -> list[list[KindRollup]]:
    """The kinds of each phase closed (every phase once the run ended): a record kept apart is
    written before its task's stats are, so an open phase would credit it to the catch-up."""
    by_phase: dict[int, list[KindRollup]] = defaultdict(list)
    for kr in kinds.values():
        by_phase[kr.phase].append(kr)
    return [mine for phase, mine in by_phase.items() if run.terminal or phase < run.current_phase]


def ledger_kind_named(kind: str) -> str:
    """The ledger kind a task kind's rows are held under, by name: `<kind>_archived` under `<kind>`
    (archived deals under `deals`, as `migrate rows` and `verify` fold them; Pipedrive's
    `kinds.ledger_kind`, which a test holds this to), every other kind under its own name. The
    engine has no provider here, so the rule is the name's."""
    return kind.removesuffix("_archived")


def _identities(mine: list[KindRollup]) -> dict[str, list[KindRollup]]:
    """A phase's kinds by the ledger kind their rows are held under (`ledger_kind_named`): a phase
    of an archived list alone (a run of `deals_archived` after one of `deals`) holds its rows under
    `deals` too."""
    out: dict[str, list[KindRollup]] = defaultdict(list)
    for kr in mine:
        out[ledger_kind_named(kr.kind)].append(kr)
    return out


def _holder(ledger_kind: str, group: list[KindRollup]) -> KindRollup:
    """The kind of `group` that the records of `ledger_kind` are credited to: the one named so, else
    the first (an archived list taken alone)."""
    return next((k for k in group if k.kind == ledger_kind), group[0])


def failed_by_catchup(closed: list[list[KindRollup]], held: dict[str, int]) -> None:
    """Count into each kind's `failed` and `seen` (and `failed_by_catchup`) the failed records the
    run holds under it beyond what its tasks counted as failed rows - records kept apart among them
    (`marks.KEPT_APART`) - so the kind's failed figure is the one `migrate rows` and
    `ledger_reads.bad_row_counts` give, and its row still adds up (`seen` = `accounted`). Such
    records are the catch-up's: rows (or a deal's mail) it failed that the phase had not. The
    catch-up's failures of a kind (its "failed@<kind>", `caught_up`) are rows a task counted - the
    catch-up's, in its own row and the kind's `by catch-up` - and a row its phase failed and the
    catch-up failed again is one record, so only its failures beyond the kind's own count are left
    out here (a sync's kinds, without tasks, show none). Per ledger kind of each phase
    (`_identities`): a task kind writing under another kind's identity (archived deals under
    `deals`) is netted with it, and the excess goes to the kind the records are held under, so the
    catch-up's failures of two kinds of one phase stay each its own. `closed`: the kinds of each
    closed phase (`closed_phase_kinds`); `held`: the run's failed records per kind."""
    for mine in closed:
        for ledger_kind, group in _identities(mine).items():
            extra = held.get(ledger_kind, 0) - sum(kr.failed - kr.handed_over.get("failed", 0)
                                                   + max(0, kr.caught_up.get("failed", 0) - kr.failed) for kr in group)
            if extra > 0:
                kr = _holder(ledger_kind, group)
                kr.failed_by_catchup = extra
                kr.failed += extra
                kr.seen += extra


def skipped_by_catchup(closed: list[list[KindRollup]], held: dict[str, int]) -> None:
    """Count into each kind's `skipped` (and `skipped_by_catchup`) the skipped rows the run holds under
    it beyond what its phase counted, so the kind's skipped figure is the one `migrate rows` and
    `ledger_reads.bad_row_counts` give and its row still adds up. Such rows are the catch-up's,
    skipped after the phase closed, of two sorts, each counted once:

    * rows the phase left to the catch-up's walk (its `waiting`, already rows seen): the catch-up
      skipped them, so they move from `waiting` to `skipped` (`waiting_skipped`), `seen` unchanged;
    * rows the phase never counted (a kind a phase lists under written parents only - deal products,
      mail, followers - has a skipped parent's rows listed by the catch-up alone): added to
      `skipped` and to `seen`.

    Which of a kind's rows beyond its phase's skipped count were waiting is not in the ledger (a
    settled placeholder keeps no trace of having waited): the catch-up counts them as it skips them
    (`caught_up["skipped_waiting"]`, `rows.SKIPPED_WAITING`), and the rest are rows the phase never
    counted. A catch-up that kept no such count (its tasks' stats have no `rows.AGAIN` count of any
    kind: written before it counted them) leaves an estimate: the phase's waiting rows take them
    first. Per ledger kind of each phase (`_identities`): a kind holding no rows of its
    own name (archived deals under `deals`) nets its count against the kind that holds them, never
    another kind of the phase; a ledger kind holding fewer than its phase counted (the catch-up
    wrote some) keeps the phase's figure. Closed phases with tasks of their own only, the
    catch-up's not (a sync's kinds show none, as with `failed_by_catchup`); `held`: the run's
    skipped records per kind (not those waiting for the catch-up's walk)."""
    counted = any(key in _HEARD for mine in closed for kr in mine for key in kr.caught_up)
    for mine in closed:
        if any(kr.handed_over for kr in mine) or not any(kr.tasks for kr in mine):
            continue  # the catch-up's own, or no task's (a sync's kinds): the catch-up's row counts them
        for ledger_kind, group in _identities(mine).items():
            n = held.get(ledger_kind, 0) - sum(kr.skipped for kr in group)
            if n <= 0:
                continue
            kr = _holder(ledger_kind, group)
            kr.skipped_by_catchup = n
            kr.skipped += n
            # the waiting rows it skipped: as the catch-up counted them, or (no count kept) an estimate
            waited = min(n, sum(m.caught_up.get(SKIPPED_WAITING, 0) for m in group)) if counted else n
            # the kind that counted them first, then the ledger kind's own
            for member in sorted(group, key=lambda m: (-m.caught_up.get(SKIPPED_WAITING, 0), m.kind != ledger_kind)):
                moved = min(waited, member.waiting)
                waited -= moved
                member.waiting -= moved
                member.waiting_skipped = moved
                if member is not kr:  # an archived kind's waiting rows are skipped rows of the kind holding them
                    member.seen -= moved
                    kr.seen += moved
                n -= moved
            kr.seen += n  # rows its phase never counted


def beyond_listing(mine: list[KindRollup]) -> list[str]:
    """The check that no row is counted twice across a phase and the catch-up: per ledger kind of
    a phase (`_identities`) whose catch-up listed every member kind whole (`caught_up["listed"]`),
    the rows the rollup counted beyond what the phase saw (`KindRollup.added_by_catchup`: rows
    the catch-up skipped or failed that its phase never counted) are rows that listing served and
    the phase had not - at most the listing's rows plus those deleted at the source since, less the
    phase's rows seen. A row counted both as left to the catch-up and as the catch-up's skip breaks
    it. One line per ledger kind that does ("persons: 13 rows counted beyond the 1500 its phase
    saw, but the catch-up's listing of 1500 (0 deleted at the source) served none new")."""
    out = []
    for ledger_kind, group in _identities(mine).items():
        added = sum(kr.added_by_catchup for kr in group)
        if not added or not all("listed" in kr.caught_up for kr in group):
            continue
        phase_seen = sum(kr.seen - kr.added_by_catchup for kr in group)
        listed = sum(kr.caught_up["listed"] for kr in group)
        deleted = sum(kr.deleted_at_source for kr in group)
        new = max(0, listed + deleted - phase_seen)
        if added > new:
            out.append(f"{ledger_kind}: {added} row{'' if added == 1 else 's'} counted beyond the {phase_seen} its "
                       f"phase saw, but the catch-up's listing of {listed} ({deleted} deleted at the source) served "
                       f"{new or 'none'} new")
    return out
