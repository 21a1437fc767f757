"""What a source says besides its rows, as plain data the engine writes: rows gone at the source
and records the source will not let it read.

A provider finds these while it lists (a record's list no longer serves a row; a deal's mail
answers 403 while the token reads the account) and hands them over as `Marks`; the engine writes
them through the ledger's one door (`ledger.mark_deleted`: soft deletes with their history;
`ledger.note_unreadable`: kept beside the ledger with the reason) in the caller's transaction, so
they commit with what they belong to. A provider never calls the ledger itself.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_core import ledger
from engine_core.db import Conn
from engine_core.models import Run

# The task stat counting records kept apart: a record kept for rows no listing can serve (a deal's
# mail when the deal has no readable id or its mail is refused), one failed record for all of them.
KEPT_APART = "kept_apart"


@dataclass(frozen=True)
class Unreadable:
    """A record the source will not let the run read (or a row without a readable id): its ledger
    `kind`, the `key` it is kept under (`"deal 12"`, `rows.unreadable_key`), the `reason` (cut at
    500 characters) and what a person recognises it by (`excerpt`, JSON text, or None)."""

    kind: str
    key: str
    reason: str
    excerpt: str | None = None


@dataclass
class Marks:
    """What one step of a source found besides rows: `gone` (ledger kind -> source ids the source
    no longer serves: marked deleted at the source) and `unreadable` (`Unreadable` records)."""

    gone: dict[str, list[str]] = field(default_factory=dict)
    unreadable: list[Unreadable] = field(default_factory=list)

    def add_gone(self, kind: str, source_ids: Iterable[object]) -> None:
        """Add source ids of ledger `kind` the source no longer serves."""
        self.gone.setdefault(kind, []).extend(str(s) for s in source_ids)

    def __bool__(self) -> bool:
        return any(self.gone.values()) or bool(self.unreadable)


def write_marks(tx: Conn, run: Run, marks: Marks) -> int:
    """Write `marks` in the caller's transaction `tx`: the unreadable records first (none in a dry
    run: a dry run keeps nothing beside the ledger), then each kind's gone rows soft-deleted
    (`ledger.mark_deleted`, which in a dry run only counts). Returns how many ledger entries were
    marked deleted now (a dry run: would be)."""
    if not run.dry_run:
        for u in marks.unreadable:
            ledger.note_unreadable(tx, run, u.kind, u.key, u.reason, u.excerpt)
    return sum(mark_gone(tx, run, kind, ids) for kind, ids in marks.gone.items())


def mark_gone(tx: Conn, run: Run, kind: str, source_ids: Sequence[object]) -> int:
    """Soft-delete the rows of ledger `kind` the source no longer serves (`ledger.mark_deleted`),
    in `tx`; returns how many entries were marked now. No statement for no ids."""
    return ledger.mark_deleted(tx, run, kind, source_ids) if source_ids else 0


def count_kept_apart(stats: Any, n: int) -> None:
    """Count `n` records kept apart (`KEPT_APART`) on a task's `stats`: each is a row the task saw
    and failed, so its phase's figures - the progress lines, the phase's materialisation, the run's
    per-kind table - count it as they count every failed row, from the same task stats."""
    for key in ("seen", "failed", KEPT_APART):
        stats.bump(key, n)
