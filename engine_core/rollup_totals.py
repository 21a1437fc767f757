"""A run's figures summed over its kinds, each row counted once: what `migrate report`'s headline says.

The per-kind table counts each kind as its phase counted it (with what the catch-up skipped or
failed of it after: the ledger's figures) and the catch-up's own row counts every row the catch-up
wrote. Summed as they stand, a row the catch-up met again would be counted twice: the rows a phase
left waiting for its walk (`rows.WAITING`: "left to catch-up" in the phase, then imported, skipped
or failed by the catch-up), and the rows a phase skipped or failed, which the catch-up's walk
writes again (every placeholder is taken over). The catch-up counts those per kind as it writes
them (`rows.AGAIN`: "again_waiting@persons", ...), so a total is: the phases' figures as they
counted them (`KindRollup.at_close`), plus the catch-up's own, less the rows it met again under the
outcome their phase had given them. Then `seen` is every row served once (on an unchanging
account, the source's own count), the outcomes add up to it, and `waiting` is what still waits:
none once the catch-up ran.

A catch-up that kept no such counts (its tasks' stats have none: written before it counted them)
is summed as before, the kinds' skipped and failed as the ledger holds them, with its phases'
waiting rows taken as settled once it closed (a succeeded run holds none still waiting:
`rollup.still_waiting`).
"""
from __future__ import annotations

from engine_core.rollup import KindRollup, RunRollup
from engine_core.rollup_left import catchup_done
from engine_core.rows import AGAIN, WAITING

# The totals' keys, in the order the headline says them.
TOTALS = ("seen", "imported", "matched", "already_here", "updated", "skipped", "waiting", "failed",
          "deleted_at_source")


def run_totals(r: RunRollup, catchup_kind: str | None) -> dict[str, int]:
    """Run `r`'s figures summed over its kinds, each row once (see the module docstring): {"seen",
    "imported", "matched", "already_here", "updated", "skipped", "waiting", "failed",
    "deleted_at_source"}. `catchup_kind`: the provider's catch-up task kind (None: the provider has
    none, and the kinds are summed as they are)."""
    own = [k for k in r.kinds if k.kind != catchup_kind]
    catchup = [k for k in r.kinds if k.kind == catchup_kind]
    again = {outcome: sum(int(k.caught_up.get(key, 0)) for k in own) for outcome, key in AGAIN.items()}
    if not catchup:
        return {c: sum(int(getattr(k, c)) for k in own) for c in TOTALS}
    if not any(again.values()):
        return _without_counts(r, own, catchup)
    out = {c: sum(int(getattr(k.at_close(), c)) for k in own) + sum(int(getattr(k, c)) for k in catchup)
           for c in TOTALS if c != "deleted_at_source"}
    out["deleted_at_source"] = sum(int(k.deleted_at_source) for k in r.kinds)
    for outcome, n in again.items():
        out[outcome] -= n  # the outcome its phase gave it: the catch-up's own counts it now
        out["seen"] -= n  # seen by its phase, and again by the catch-up
    return out


def _without_counts(r: RunRollup, own: list[KindRollup], catchup: list[KindRollup]) -> dict[str, int]:
    """The totals of a run whose catch-up kept no counts of the rows it met again (or met none): the
    kinds' skipped and failed as the ledger holds them (not again in the catch-up's row), the rest
    as the phases and the catch-up counted them; the phases' waiting rows, once the catch-up closed,
    settled by it (counted in its row, not again in `seen`)."""
    out = {c: sum(int(getattr(k, c)) for k in (*own, *catchup)) for c in TOTALS}
    for c in ("skipped", "failed"):
        out[c] = sum(int(getattr(k, c)) for k in own)
    out["seen"] -= sum(int(k.added_by_catchup) for k in own)
    if catchup_done(r):
        settled = sum(int(getattr(k, WAITING)) for k in own)
        out[WAITING] -= settled
        out["seen"] -= settled
    return out
