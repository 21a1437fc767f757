"""Top-up: put a run's pending tasks on the lane, to the deficit, and wake this process's idle lanes.

Each path is idempotent: enqueueing twice is harmless because a task is claim-or-exit; enqueueing
zero times is the only failure, and the reaper repairs it.
"""
from __future__ import annotations

import threading
import time

from psycopg.types.json import Jsonb

from engine_core.config import Settings
from engine_core.db import Conn, Database
from engine_core.models import Run, Successor


class WorkSignal:
    """Tells this process's idle drainers that tasks were enqueued: a lane that found
    nothing to claim waits here instead of sleeping its whole poll interval, so a discovery's
    walkers, a page's successor or a new phase's tasks are claimed at once by idle lanes (they
    waited up to 0.2 s each: ~0.15 s per discovery and per phase boundary on the entity path).
    Work enqueued by another process is still found by the poll. Generations, not a flag: a
    waiter passes the generation it saw before it looked for work, so no enqueue is missed."""

    SLICE = 0.05  # how often a waiter looks at its cancel Event (it cannot wait on both)

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0

    def generation(self) -> int:
        """The generation now: pass it to `wait` after looking for work."""
        with self._cond:
            return self._generation

    def notify(self) -> None:
        """Tell this process's waiters that tasks were enqueued (a new generation)."""
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float, cancel: threading.Event | None = None) -> bool:
        """Wait up to `timeout` seconds for work enqueued after generation `seen`; True when some
        was (False: timed out or `cancel` set)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation == seen:
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()):
                    return False
                self._cond.wait(min(left, self.SLICE))
            return True


WORK = WorkSignal()


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


def top_up_in(tx: Conn, run_id: int, settings: Settings) -> list[int]:
    """`top_up` inside the caller's open transaction (a finishing task's: the finish and the
    refill commit together, one transaction fewer per task). The caller notifies `WORK` once it
    has committed, when ids came back. The run's lane lock is held until the caller commits."""
    tx.execute("lock_run_lane", {"run_id": run_id})
    rows = tx.fetch_all("enqueue_pending", {"run_id": run_id, "max_inflight": settings.max_inflight})
    return [r["id"] for r in rows]


def top_up(db: Database | Conn, run_id: int, settings: Settings) -> list[int]:
    """Refill the run's lane to MAX_INFLIGHT enqueued-or-running tasks (to the deficit, never one-for-one)."""
    with db.transaction() as tx:
        ids = top_up_in(tx, run_id, settings)
    if ids:
        WORK.notify()  # committed: this process's idle lanes may claim them now
    return ids
