"""A task's position: its cursor and offset, its stop points, and the checkpoint.

The checkpoint (offset and stats) is written inside the window's transaction, so it never claims
more than was committed; fenced on `locked_by`, it raises LockLost when the task is no longer
this worker's, which rolls the window back.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from psycopg.types.json import Jsonb

from engine_core.config import Settings
from engine_core.db import Conn, Database
from engine_core.errors import LockLost, TaskStopped
from engine_core.models import Run, Stats, Successor, Task
from engine_core.topup import insert_tasks, top_up


class Checkpoints:
    """The position half of `TaskContext` (a mixin: the context's dataclass holds the fields)."""

    if TYPE_CHECKING:
        db: Database
        run: Run
        task: Task
        worker: str
        settings: Settings
        cancel: threading.Event
        stats: Stats
        offset: int
        lock_lost: threading.Event
        _stop_checked: float
        _stop_seen: bool

    @property
    def revisit(self) -> bool:
        """Re-armed by a retry to take over rows it skipped while their parents were failing."""
        return bool(self.stats.get("revisit"))

    # -- stopping ---------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True when this worker is cancelled (shutting down), its lock was lost, or the run was asked
        to stop (polled, not per row). Stopping is not cancelling: the worker decides what a stop
        means for the task (cancelled only when the run itself is stopping; see Worker.run_claimed)."""
        if self.cancel.is_set() or self.lock_lost.is_set() or self._stop_seen:
            return True
        now = time.monotonic()
        if now - self._stop_checked >= 1.0:
            self._stop_checked = now
            row = self.db.fetch_one("get_run", {"run_id": self.run.id})
            self._stop_seen = bool(row and (row["cancel_requested"] or row["status"] != "running"))
        return self._stop_seen

    def stop_point(self) -> None:
        """A safe place to stop: progress so far is checkpointed."""
        if self.should_stop():
            raise TaskStopped()

    # -- checkpoints ------------------------------------------------------------------------
    def checkpoint(self, tx: Conn, offset: int) -> None:
        """Write offset and stats in the caller's transaction; a lost lock rolls the window back."""
        n = tx.execute(
            "checkpoint_task",
            {"task_id": self.task.id, "worker": self.worker, "offset": offset, "stats": Jsonb(self.stats.values)},
        )
        if n != 1:
            raise LockLost()
        self.offset = offset

    def move_cursor(self, cursor: dict[str, Any], offset: int = 0, successors: Sequence[Successor] = ()) -> None:
        """Replace the task's own cursor (it walked on) and restart its offset with it.

        `successors`: tasks the work done so far hands on (find-or-create, as at finish), created
        in the same transaction as the move, so a task that walks on and then dies has created
        them once; new ones are put on the lane at once (`topup.top_up`)."""
        created = 0
        params = {"task_id": self.task.id, "worker": self.worker, "cursor": Jsonb(cursor),
                  "offset": offset, "stats": Jsonb(self.stats.values)}
        if not successors:  # one statement: no transaction to open and commit around it
            if self.db.execute("update_task_cursor", params) != 1:
                raise LockLost()
        else:
            with self.db.transaction() as tx:
                created = insert_tasks(tx, self.run, self.task.phase, self.task.kind, successors)
                if tx.execute("update_task_cursor", params) != 1:
                    raise LockLost()
        self.offset = offset
        if created:
            top_up(self.db, self.run.id, self.settings)

    def touch(self) -> None:
        """Keep the lock fresh during long source waits (the reaper releases stale locks). The
        worker's lock keeper does this on its own thread as well; raises LockLost when the lock is gone."""
        if self.db.execute("touch_task", {"task_id": self.task.id, "worker": self.worker}) != 1:
            self.lock_lost.set()
            raise LockLost()
