"""Values the engine passes around: runs, tasks, outcomes."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

TERMINAL = ("stopped", "succeeded", "failed")
LIVE = ("running", "stopping")


@dataclass(frozen=True)
class Run:
    """One migration run as its `migrations` row holds it: tenant, source and account, status, the
    plan (phases of kinds) and the phase it is in, its options, mode ("full" or "sync") and
    snapshot moment. Frozen: a fresh read is a new Run."""
    id: int
    tenant_id: str
    source: str
    source_account: str
    status: str
    current_phase: int
    plan: tuple[tuple[str, ...], ...]
    options: dict[str, Any]
    dry_run: bool
    cancel_requested: bool
    started_at: datetime | None = None
    finished_at: datetime | None = None
    source_identity: str | None = None  # what the data belongs to (a Pipedrive company); None: not known yet
    mode: str = "full"  # "full" or "sync"
    snapshot_at: datetime | None = None  # the source moment the listings start from
    since: datetime | None = None  # a sync's lower bound: the last succeeded run's snapshot_at

    @property
    def is_sync(self) -> bool:
        """True for a sync (a catch-up of a tenant's earlier run), False for a full run."""
        return self.mode == "sync"

    @property
    def name(self) -> str:
        """How messages name the run: `run #7 (pipedrive for tenant 'acme')`."""
        return f"run #{self.id} ({self.source} for tenant {self.tenant_id!r})"

    @property
    def terminal(self) -> bool:
        """True once the run has ended (succeeded, failed or stopped): nothing claims its tasks."""
        return self.status in TERMINAL

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind of the plan, in phase order."""
        return tuple(k for group in self.plan for k in group)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        """A Run from its `migrations` row (a dict, as the named queries return it)."""
        return cls(
            id=row["id"],
            tenant_id=row["tenant_id"],
            source=row["source"],
            source_account=row["source_account"],
            status=row["status"],
            current_phase=row["current_phase"],
            plan=tuple(tuple(g) for g in row["plan"]),
            options=dict(row.get("options") or {}),
            dry_run=row["dry_run"],
            cancel_requested=row["cancel_requested"],
            started_at=row.get("started_at"),
            finished_at=row.get("finished_at"),
            source_identity=row.get("source_identity"),
            mode=row.get("mode") or "full",
            snapshot_at=row.get("snapshot_at"),
            since=row.get("since"),
        )


@dataclass(frozen=True)
class Task:
    """One task as its `migration_tasks` row holds it: run, phase, kind, cursor (where it starts)
    and processed_offset (rows of that cursor committed), status, attempts, stats."""
    id: int
    migration_id: int
    phase: int
    kind: str
    cursor_key: str
    cursor: dict[str, Any]
    processed_offset: int
    status: str
    attempts: int
    stats: dict[str, Any]
    locked_by: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Task:
        """A Task from its `migration_tasks` row (a dict, as the named queries return it)."""
        return cls(
            id=row["id"],
            migration_id=row["migration_id"],
            phase=row["phase"],
            kind=row["kind"],
            cursor_key=row["cursor_key"],
            cursor=dict(row.get("cursor") or {}),
            processed_offset=row["processed_offset"],
            status=row["status"],
            attempts=row["attempts"],
            stats=dict(row.get("stats") or {}),
            locked_by=row.get("locked_by"),
        )


@dataclass(frozen=True)
class Successor:
    """A task a finishing task creates: the next page of its stripe, or work found by discovery."""

    cursor_key: str
    cursor: dict[str, Any]
    kind: str | None = None  # defaults to the finishing task's kind


@dataclass(frozen=True)
class TaskOutcome:
    """What a provider's task runner returns: the successor tasks its work hands on (find-or-create
    on their cursor keys)."""
    successors: tuple[Successor, ...] = ()


@dataclass
class Stats:
    """A task's counters; `imported` created rows, `matched` linked existing ones."""

    values: dict[str, int] = field(default_factory=dict)

    def bump(self, key: str, n: int = 1) -> None:
        """Add `n` to counter `key`."""
        self.values[key] = int(self.values.get(key, 0)) + n

    def get(self, key: str) -> int:
        """Counter `key`, 0 when never bumped."""
        return int(self.values.get(key, 0))

    def copy(self) -> Stats:
        """An independent copy (a window keeps one to restore on rollback)."""
        return Stats(dict(self.values))

    # True: each row a window writes is told to `heard`, with what the run held it as before (a
    # catch-up's counts of the rows a walk before it had counted: `ledger_reads.placeholders_of_run`)
    hears_rows = False

    def heard(self, outcome: str, before: str | None) -> None:
        """One row a window wrote, in the window's transaction (so what it counts is checkpointed
        with the window): its `outcome` and what the run held it as before ("waiting", "skipped",
        "failed"; None: not a placeholder of the run). Nothing here; a task's stats may count it."""
