"""Top-up: put a run's pending tasks on the lane, to the deficit, and wake as many of this process's idle lanes.

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
    Work enqueued by another process is still found by the poll.

    `announce(run_id, n)` wakes at most `n` of the run's waiters (a permit each), not all of them:
    waking every idle lane for one task cost a claim, a look and often a top-up per lane (85 claim
    attempts for 25 tasks on the small account). No enqueue is missed: a waiter passes the
    generation it saw before it looked for work, and a permit announced after that generation
    wakes it even if it arrives before the wait begins. Permits its own look saw go stale once
    that look claims nothing (`looked_empty`), so an enqueue a busy lane claimed itself does not
    wake an idle one later. `notify()` (the run moved on, or ended) wakes every waiter."""

    SLICE = 0.05  # how often a waiter looks at its cancel Event (it cannot wait on both)

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._broadcast = 0  # the generation of the last notify(): every waiter that saw less wakes
        self._runs: dict[int, list[int]] = {}  # run id -> [generation of its last announce, permits]

    def generation(self) -> int:
        """The generation now: pass it to `wait` after looking for work."""
        with self._cond:
            return self._generation

    def notify(self) -> None:
        """Wake every waiter of every run (a phase closed or a run ended: each lane looks again)."""
        with self._cond:
            self._generation += 1
            self._broadcast = self._generation
            self._cond.notify_all()

    def announce(self, run_id: int, n: int) -> None:
        """`n` tasks of run `run_id` were enqueued and committed: wake up to `n` of its waiters."""
        if n <= 0:
            return
        with self._cond:
            self._generation += 1
            state = self._runs.setdefault(run_id, [0, 0])
            state[0] = self._generation
            state[1] += n
            self._cond.notify_all()  # each waiter checks its run's permits; at most n take one

    def looked_empty(self, run_id: int, seen: int) -> None:
        """A lane of `run_id` that read generation `seen` then claimed nothing: every task announced
        up to `seen` was committed before its claim looked, so those permits are stale."""
        with self._cond:
            state = self._runs.get(run_id)
            if state is not None and state[0] <= seen:
                del self._runs[run_id]

    def wait(self, seen: int, timeout: float, cancel: threading.Event | None = None, run_id: int | None = None) -> bool:
        """Wait up to `timeout` seconds for a `notify()` after generation `seen`, or for a permit of
        run `run_id` announced after it (taking the permit); True when woken (False: timed out or
        `cancel` set)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._broadcast > seen:
                    return True
                state = self._runs.get(run_id) if run_id is not None else None
                if state is not None and state[0] > seen and state[1] > 0:
                    state[1] -= 1
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or (cancel is not None and cancel.is_set()):
                    return False
                self._cond.wait(min(left, self.SLICE))


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
    refill commit together, one transaction fewer per task). The caller announces the ids on
    `WORK` once it has committed. The run's lane lock is held until the caller commits."""
    tx.execute("lock_run_lane", {"run_id": run_id})
    rows = tx.fetch_all("enqueue_pending", {"run_id": run_id, "max_inflight": settings.max_inflight})
    return [r["id"] for r in rows]


def top_up(db: Database | Conn, run_id: int, settings: Settings) -> list[int]:
    """Refill the run's lane to MAX_INFLIGHT enqueued-or-running tasks (to the deficit, never one-for-one)."""
    with db.transaction() as tx:
        ids = top_up_in(tx, run_id, settings)
    WORK.announce(run_id, len(ids))  # committed: as many idle lanes may claim them now
    return ids
