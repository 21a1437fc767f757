"""What a provider's task runner gets: its task, its run, and the window writer."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from engine_core import ledger
from engine_core.config import WINDOW, Settings
from engine_core.db import Conn, Database
from engine_core.errors import DatabaseUnavailable, LockLost, PageFailed, TaskStopped, TransientError
from engine_core.models import Run, Stats, Task
from engine_core.runlog import RunLog, failure_reason

Writer = Callable[[Conn, Any], str]


@dataclass(frozen=True)
class PageResult:
    attempted: int
    failed: int
    outcomes: dict[str, int]


def row_id(row: Any) -> str | None:
    if isinstance(row, dict):
        value = row.get("id")
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip():
            return str(value)[:64]
    return None


@dataclass
class TaskContext:
    db: Database
    run: Run
    task: Task
    worker: str
    settings: Settings
    log: RunLog
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: Stats = field(default_factory=Stats)
    offset: int = 0
    window: int = WINDOW
    # Set by the lock keeper (or `touch`) when the task's lock was found taken: the task is someone
    # else's now, so it stops at its next stop point and its next checkpoint raises LockLost.
    lock_lost: threading.Event = field(default_factory=threading.Event)
    _stop_checked: float = 0.0
    _stop_seen: bool = False

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

    def move_cursor(self, cursor: dict[str, Any], offset: int = 0) -> None:
        """Replace the task's own cursor (it walked on) and restart its offset with it."""
        with self.db.transaction() as tx:
            n = tx.execute(
                "update_task_cursor",
                {"task_id": self.task.id, "worker": self.worker, "cursor": Jsonb(cursor),
                 "offset": offset, "stats": Jsonb(self.stats.values)},
            )
            if n != 1:
                raise LockLost()
        self.offset = offset

    def touch(self) -> None:
        """Keep the lock fresh during long source waits (the reaper releases stale locks). The
        worker's lock keeper does this on its own thread as well; raises LockLost when the lock is gone."""
        if self.db.execute("touch_task", {"task_id": self.task.id, "worker": self.worker}) != 1:
            self.lock_lost.set()
            raise LockLost()

    # -- windows ----------------------------------------------------------------------------
    def write_rows(
        self,
        rows: Sequence[Any],
        writer: Writer,
        *,
        kind: str | None = None,
        resume_from: int | None = None,
        offset_after: Callable[[int], int] | None = None,
        fail_if_all_failed: bool = True,
    ) -> PageResult:
        """Write a page in windows: one transaction per window, one savepoint per row, the
        checkpoint inside the window's transaction. A row that raises is rolled back alone and
        counted; a deadlock or serialization failure loses the window and releases the task.
        A page whose every row failed raises PageFailed unless the caller judges that itself."""
        kind = kind or self.task.kind
        start = self.offset if resume_from is None else resume_from
        attempted = failed = 0
        mine: dict[str, str] = {}
        if self.revisit:
            # a task run again after a retry: rows this run already wrote count as written, untouched
            with self.db.connection() as conn:
                ids = [row_id(r) for r in rows[start:]]
                mine = ledger.written_by_run(conn, self.run, kind, ids)
                # rows this run updated in place (issue 9) count as updated again: the history keeps
                # the update, and the task's fresh counts must say so too (the rollup compares them)
                for sid in ledger.updated_by_run(conn, self.run, kind, ids):
                    mine.setdefault(sid, ledger.UPDATED)
        outcomes: dict[str, int] = {}
        for w in range(0, len(rows), self.window):
            window = rows[w : w + self.window]
            if w + len(window) <= start:
                continue  # committed before a crash or a release
            before = self.stats.copy()
            counts: dict[str, int] = {}
            try:
                with self.db.transaction() as tx:
                    for j, row in enumerate(window):
                        if w + j < start:
                            continue
                        done = mine.get(row_id(row) or "")
                        if done is not None:
                            outcome = {"created": ledger.IMPORTED, "matched": ledger.MATCHED}.get(done, done)
                        else:
                            outcome = self._write_row(tx, kind, row, writer)
                        self.stats.bump("seen")
                        self.stats.bump(outcome)
                        counts[outcome] = counts.get(outcome, 0) + 1
                    end = w + len(window)
                    self.checkpoint(tx, offset_after(end) if offset_after else end)
            except BaseException:
                self.stats = before  # the window is gone; so are its counts
                raise
            for k, v in counts.items():
                outcomes[k] = outcomes.get(k, 0) + v
            attempted += sum(counts.values())
            failed += counts.get(ledger.FAILED, 0)
            if self.log.should_flush_early():
                self.log.flush(self.db)  # type: ignore[arg-type]
        if fail_if_all_failed and attempted and failed == attempted:
            raise PageFailed(f"every row of the page failed ({failed} rows); first reasons are in the run log")
        return PageResult(attempted, failed, outcomes)

    def _write_row(self, tx: Conn, kind: str, row: Any, writer: Writer) -> str:
        try:
            with tx.raw.transaction() as sp:
                outcome = writer(tx, row)
                if self.run.dry_run:
                    raise psycopg.Rollback(sp)  # a dry run reports what it would do, writes nothing
            if self.run.dry_run and outcome in (ledger.IMPORTED, ledger.MATCHED):
                sid = row_id(row)
                if sid is not None:  # remembered so this run's later phases can link to it
                    tx.execute("dry_record", {"run_id": self.run.id, "kind": kind, "source_id": sid, "outcome": outcome})
            return outcome
        except (TransientError, LockLost):
            raise  # the whole window is gone: the task retries with its cursor
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e).splitlines()[0] if str(e) else "connection lost") from e
        except Exception as e:  # a malformed row fails alone, with its reason
            reason = failure_reason(e)
            sid = row_id(row)
            self.log.note("error", kind, reason, subject=sid)
            if sid is not None and not self.run.dry_run:
                ledger.note_placeholder(tx, self.run, kind, sid, reason, action="failed")
            return ledger.FAILED
