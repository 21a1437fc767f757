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
from engine_core.runlog import RunLog


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
    """Try to close `phase`. Exactly one caller wins; returns whether this one did.

    The winner seeds the next phase, or finalises the run after the last one, or - when the phase
    closed with failed tasks - fails the run at that phase (issue 10: no drainer works on past a
    failed phase; `runs.retry` re-arms the failed tasks and rewinds to it) and writes one grouped
    run-log entry per failed kind. The barrier holds while any task of the phase is pending,
    running or cancelled (issue 8). A phase whose tasks all exist already (a rewound retry) or
    that seeds nothing closes at once.
    """
    won_any = failed_here = False
    while True:
        with db.transaction() as tx:
            row = tx.fetch_one("advance_phase", {"run_id": run_id, "phase": phase})
            if row is None:
                break
            won_any = True
            if row["failed_tasks"]:
                _log_failed_phase(tx, row, phase, settings)
                failed_here = True  # the run failed at this phase: nothing to seed or top up
                break
            run = Run.from_row(row)
            if run.current_phase < len(run.plan):
                seed_phase(tx, run, run.current_phase, provider)
            else:
                tx.fetch_one("finalize_run", {"run_id": run_id})
                break
        phase = run.current_phase
    if won_any and not failed_here:
        top_up(db, run_id, settings)
    statistics.after_advance(db, closed=won_any)  # after the barrier commits (issue 11); never raises
    return won_any


def _log_failed_phase(tx: Conn, run_row: dict, phase: int, settings: Settings) -> None:
    """One grouped entry per kind whose tasks failed the phase, in the barrier's transaction."""
    plan = run_row["plan"]
    kinds = ", ".join(plan[phase]) if phase < len(plan) else "?"
    log = RunLog(run_row["id"], None, cap=settings.log_cap)
    for r in tx.fetch_all("phase_failed_tasks", {"run_id": run_row["id"], "phase": phase}):
        reason = (f"phase {phase + 1} ({kinds}) closed with {r['n']} failed {r['kind']} task(s): the run "
                  f"failed at this phase and nothing later was started (retry re-arms them); first: {r['reason']}")
        log.note("error", r["kind"], reason[:500], subject=f"task {r['first_task']}")
        log.groups[next(reversed(log.groups))]["count"] = int(r["n"])  # tasks, not notes
    log.flush(tx)
