"""What a catch-up task counts per kind: its row outcomes credited to the kind they belong to, and
the rows among them that a walk of the run had counted before it.

Every row outcome (and `seen`) a catch-up task counts is counted twice, under its own name and as
"<counter>@<kind>" (`PerKindStats`): the rollup credits them to the kind (`KindRollup.caught_up`).
The catch-up also meets rows the run's phases counted already - the rows they left waiting for its
walk (`rows.WAITING`), the rows they skipped or failed (every placeholder is written again) - and
counts each once more in its own `seen`. So each row it writes is told with what the run held it
as before (`models.Stats.heard`, in the window's transaction: checkpointed with the window, so a
retried task counts it once), and per kind it counts:

* `again_waiting@<kind>`, `again_skipped@<kind>`, `again_failed@<kind>`: rows the run held as a
  placeholder of that sort before the catch-up wrote them (a phase's, or the catch-up's own before):
  what a total of the run takes off to count each row once (`rollup_totals`);
* `skipped_waiting@<kind>`: of the rows a phase left waiting, those the catch-up skipped: they
  move from the kind's `waiting` to its `skipped` (`rollup_catchup.skipped_by_catchup`).
"""
from __future__ import annotations

from typing import Any

from engine_core.context import TaskContext
from engine_core.models import Stats
from engine_core.rows import AGAIN, SKIPPED_WAITING, WAITING

# Row outcomes (and `seen`) a catch-up task also counts per listing kind, as "<counter>@<kind>"
# (`PerKindStats`): the rollup adds them to that kind's figures (engine_core.rollup).
PER_KIND = frozenset({"seen", "imported", "matched", "already_here", "updated", "skipped", "failed"})


class PerKindStats(Stats):
    """A catch-up task's stats while it writes rows of one listing kind: every row outcome (and
    `seen`) is counted twice, under its own name and as "<counter>@<kind>" (e.g. `imported@deals`),
    so the rollup can credit the rows the catch-up wrote to the kind they belong to (a
    source's count is met by the kind's phase plus the catch-up; the ledger's claims of a kind =
    its phase's + the catch-up's). Both counts land in the same window's checkpoint. With `hears`
    (a run that writes: not a dry run), each row written is also counted by what the run held it
    as before (`heard`; the module docstring)."""

    def __init__(self, values: dict[str, int], kind: str, hears: bool = False) -> None:
        super().__init__(values)
        self.kind = kind
        self.hears_rows = hears

    def bump(self, key: str, n: int = 1) -> None:
        """Add `n` to `key`, and to `key@kind` too when `key` is a row outcome (`PER_KIND`)."""
        super().bump(key, n)
        if key in PER_KIND:
            super().bump(f"{key}@{self.kind}", n)

    def heard(self, outcome: str, before: str | None) -> None:
        """Count a row the run held as a placeholder (`before`: "waiting", "skipped", "failed")
        under `again_<before>@kind`, and a waiting one now skipped under `skipped_waiting@kind`."""
        again = AGAIN.get(before or "")
        if again is None:
            return
        super().bump(f"{again}@{self.kind}")
        if before == WAITING and outcome == "skipped":
            super().bump(f"{SKIPPED_WAITING}@{self.kind}")

    def copy(self) -> PerKindStats:
        """An independent copy (the values before a window, restored when it fails)."""
        return PerKindStats(dict(self.values), self.kind, self.hears_rows)


def counted_as(ctx: TaskContext, kind: str, work: Any) -> Any:
    """Run `work()` with the task's row outcomes also counted under `kind` (`PerKindStats`), and
    the rows a walk of the run counted before (not in a dry run, which holds no placeholders)."""
    ctx.stats = PerKindStats(ctx.stats.values, kind, hears=not ctx.run.dry_run)
    try:
        return work()
    finally:
        ctx.stats = Stats(ctx.stats.values)
