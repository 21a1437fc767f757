"""Putting work on the lane: seed a phase, refill to the deficit, and the fenced barrier.

Each path is idempotent: enqueueing twice is harmless because a task is claim-or-exit; enqueueing
zero times is the only failure, and the reaper repairs it.
"""
from __future__ import annotations

from psycopg.types.json import Jsonb

from engine_core import statistics
from engine_core.config import Settings
from engine_core.db import Conn, Database
from engine_core.models import Run, Successor
from engine_core.providers.base import Provider


def insert_tasks(tx: Conn, run: Run, phase: int, kind: str, successors: list[Successor] | tuple[Successor, ...]) -> int:
    """Find-or-create on (run, kind, cursor_key); returns how many were new."""
    created = 0
    for s in successors:
        row = tx.fetch_one(
            "insert_task",
            {
                "run_id": run.id,
                "phase": phase,
                "kind": s.kind or kind,
                "cursor_key": s.cursor_key,
                "cursor": Jsonb(s.cursor),
            },
        )
        created += row is not None
    return created


def seed_phase(tx: Conn, run: Run, phase: int, provider: Provider) -> int:
    created = 0
    for kind in run.plan[phase]:
        created += insert_tasks(tx, run, phase, kind, provider.seed_cursors(run, kind))
    return created


def top_up(db: Database | Conn, run_id: int, settings: Settings) -> list[int]:
    """Refill the run's lane to MAX_INFLIGHT enqueued-or-running tasks (to the deficit, never one-for-one)."""

    def _go(tx: Conn) -> list[int]:
        tx.execute("lock_run_lane", {"run_id": run_id})
        rows = tx.fetch_all("enqueue_pending", {"run_id": run_id, "max_inflight": settings.max_inflight})
        return [r["id"] for r in rows]

    if isinstance(db, Conn):
        with db.transaction() as tx:
            return _go(tx)
    with db.transaction() as tx:
        return _go(tx)


def advance_phase(db: Database, run_id: int, phase: int, provider: Provider, settings: Settings) -> bool:
    """Try to close `phase`. Exactly one caller wins; it seeds the next phase or finalises the run.

    A phase whose tasks all exist already (a rewound retry) or that seeds nothing closes at once.
    """
    won_any = False
    while True:
        with db.transaction() as tx:
            row = tx.fetch_one("advance_phase", {"run_id": run_id, "phase": phase})
            if row is None:
                break
            won_any = True
            run = Run.from_row(row)
            if run.current_phase < len(run.plan):
                seed_phase(tx, run, run.current_phase, provider)
            else:
                tx.fetch_one("finalize_run", {"run_id": run_id})
                break
        phase = run.current_phase
    if won_any:
        top_up(db, run_id, settings)
    statistics.after_advance(db, closed=won_any)  # after the barrier commits (issue 11); never raises
    return won_any
