"""The fenced claim of a task, the pressure check in front of it, and the lock keeper behind it.

Two workers racing for one task both issue the claim's UPDATE; its `status = 'pending'` predicate is
the fence: exactly one changes the row and proceeds. A worker defers (claims nothing) while the
database is under pressure, and a claimed task's lock is kept fresh so the reaper releases only the
tasks of workers that are gone.
"""
from __future__ import annotations

import logging
import threading

from engine_core.config import Settings
from engine_core.db import Database
from engine_core.models import Run, Task
from engine_core.runlog import failure_reason

log = logging.getLogger(__name__)


def pressure_high(db: Database, settings: Settings) -> bool:
    """True when more than `settings.pressure_threshold` queries are active on the database (a
    threshold of 0 or less never says so): the worker then defers instead of claiming, leaving the
    task honestly pending (the seed's SystemPressure.high?)."""
    threshold = settings.pressure_threshold
    if threshold <= 0:
        return False
    row = db.fetch_one("active_queries")
    return bool(row and row["n"] > threshold)


def claim(db: Database, task_id: int, worker: str) -> Task | None:
    """Claim task `task_id` for `worker` (pending -> running, attempts + 1, locked_by/locked_at
    set) in one fenced UPDATE; None when the task was not pending (someone else has it, or it
    has settled)."""
    row = db.fetch_one("claim_task", {"task_id": task_id, "worker": worker})
    return None if row is None else Task.from_row(row)


def claim_next(db: Database, run_id: int | None, worker: str, max_phase: int | None = None) -> tuple[Task, Run] | None:
    """Claim the next claimable task of `run_id` (None: of any run) for `worker`, with its run;
    None when there is none. `max_phase`: claim no task of a later phase (a drain that stops when
    that phase closes)."""
    row = db.fetch_one("claim_next", {"run_id": run_id, "worker": worker, "max_phase": max_phase})
    if row is None:
        return None
    task = Task.from_row(row)
    run = Run.from_row(db.fetch_one("get_run", {"run_id": task.migration_id}))  # type: ignore[arg-type]
    return task, run


class LockKeeper:
    """Keeps one running task's lock (`locked_at`) fresh on a daemon thread, whatever the task waits
    on (a slow source, a 429 wait, a long body-fetch round, a budget wait), so the reaper releases
    only tasks whose worker is gone (with a 5 s threshold, live workers lost their locks
    and one mail body was fetched 63 times).

    Touches every `interval` seconds (a third of MIGRATE_STALE_LOCK_SECONDS) through a pool
    connection borrowed for the one statement, fenced on `locked_by`. A touch that finds the lock
    taken sets `lost` and ends (the task stops at its next stop point; its next checkpoint raises
    LockLost and rolls its window back). A database error is logged and tried again within a second.
    Stopped by the worker once the task has settled; a dead process takes its keeper with it.
    """

    def __init__(self, db: Database, task_id: int, worker: str, interval: float, lost: threading.Event) -> None:
        self.db = db
        self.task_id = task_id
        self.worker = worker
        self.interval = interval
        self.lost = lost
        self.touches = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_task(cls, db: Database, task_id: int, worker: str, settings: Settings, lost: threading.Event) -> LockKeeper:
        """A started keeper for the task; a threshold of 0 (every lock is stale at once) starts none."""
        keeper = cls(db, task_id, worker, settings.stale_lock_seconds / 3.0, lost)
        if settings.stale_lock_seconds > 0:
            keeper.start()
        return keeper

    def start(self) -> None:
        """Start touching the lock on a daemon thread."""
        self._thread = threading.Thread(target=self._keep, name=f"lock-keeper-{self.task_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop touching; waits up to 2 s for a touch in flight (fenced: harmless if it outlives
        us)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)  # a touch in flight is fenced and harmless if it outlives us

    def _keep(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            try:
                n = self.db.execute("touch_task", {"task_id": self.task_id, "worker": self.worker})
            except Exception as e:  # the database is briefly away: the lock is not lost yet
                log.warning("task %s: lock keeper could not touch its lock (%s); trying again", self.task_id, failure_reason(e))
                delay = min(self.interval, 1.0)
                continue
            if n != 1:
                if not self._stop.is_set():
                    log.warning("task %s: lock keeper found the lock taken (released as stale)", self.task_id)
                    self.lost.set()
                return
            self.touches += 1
            delay = self.interval
