"""What the catch-up failed and skipped of the kinds whose phase had closed: the rollup's
`failed_by_catchup` and `skipped_by_catchup`.

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

if TYPE_CHECKING:
    from engine_core.models import Run
    from engine_core.rollup import KindRollup


def closed_phase_kinds(run: Run, kinds: dict[str, KindRollup]) -> list[list[KindRollup]]:
    """The kinds of each phase closed (every phase once the run ended): a record kept apart is
    written before its task's stats are, so an open phase would credit it to the catch-up."""
    by_phase: dict[int, list[KindRollup]] = defaultdict(list)
    for kr in kinds.values():
        by_phase[kr.phase].append(kr)
    return [mine for phase, mine in by_phase.items() if run.terminal or phase < run.current_phase]


def _identities(mine: list[KindRollup]) -> dict[str, list[KindRollup]]:
    """A phase's kinds by the ledger kind their rows are held under: `<kind>_archived` beside
    `<kind>` under `<kind>` (archived deals under `deals`, as `migrate rows` and `verify` fold
    them), every other kind under its own name."""
    names = {kr.kind for kr in mine}
    out: dict[str, list[KindRollup]] = defaultdict(list)
    for kr in mine:
        stem = kr.kind.removesuffix("_archived")
        out[stem if stem in names else kr.kind].append(kr)
    return out


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
            extra = sum(held.get(kr.kind, 0) - kr.failed + kr.handed_over.get("failed", 0)
                        - max(0, kr.caught_up.get("failed", 0) - kr.failed) for kr in group)
            if extra > 0:
                kr = next(k for k in group if k.kind == ledger_kind)
                kr.failed_by_catchup = extra
                kr.failed += extra
                kr.seen += extra


def skipped_by_catchup(kinds: dict[str, KindRollup], closed: list[list[KindRollup]], held: dict[str, int]) -> None:
    """Count into each kind's `skipped` and `seen` (and `skipped_by_catchup`) the skipped rows the run
    holds under it beyond what its phase counted, so the kind's skipped figure is the one `migrate
    rows` and `ledger_reads.bad_row_counts` give and its row still adds up. Such rows are the
    catch-up's, listed and skipped after the phase closed (a kind a phase lists under written parents
    only - deal products, mail, followers - has a skipped parent's rows listed by the catch-up
    alone); the catch-up's row counts them too, as their carrier. Per ledger kind of each phase
    (`_identities`): a kind holding no rows of its own name (archived deals under `deals`) nets its
    count against the kind that holds them, never another kind of the phase; a ledger kind holding
    fewer than its phase counted (the catch-up wrote some) keeps the phase's figure. Closed phases
    with tasks of their own only, the catch-up's not (a sync's kinds show none, as with
    `failed_by_catchup`); `held`: the run's skipped records per kind (not those waiting for the
    catch-up's walk)."""
    for mine in closed:
        if any(kr.handed_over for kr in mine) or not any(kr.tasks for kr in mine):
            continue  # the catch-up's own, or no task's (a sync's kinds): the catch-up's row counts them
        for ledger_kind, group in _identities(mine).items():
            n = sum(held.get(kr.kind, 0) - kr.skipped for kr in group)
            if n > 0:
                kinds[ledger_kind].skipped_by_catchup = n
                kinds[ledger_kind].skipped += n
                kinds[ledger_kind].seen += n
