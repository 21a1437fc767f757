"""A window: rows written in one transaction with one savepoint per row, the checkpoint inside it.

A page cannot be one transaction: Postgres caches at most 64 subtransaction ids per top-level
transaction, and past that every visibility check takes a slower path. So a page is written in
windows of `WINDOW` rows, one savepoint per row so that a malformed row loses itself and not its
window. The set-based fast path (a `Batch`) writes a window's plain rows in set-based statements
first; when the database refuses it, the window is rolled back and written again per row.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from engine_core import ledger, ledger_reads
from engine_core.config import Settings
from engine_core.db import Conn, Database
from engine_core.errors import DatabaseUnavailable, LockLost, PageFailed, TransientError
from engine_core.models import Run, Stats, Task
from engine_core.rows import WAITING, excerpt, unreadable_key
from engine_core.runlog import RunLog, failure_reason

# Rows per set-based window (`TaskContext.set_window`; read when a context is made, so a test or a
# process may set it). 500, a Pipedrive page: against 100, the entity
# path's Postgres backends spent 11-13% less CPU (bench/entity_path.py --also-before window, CPU
# medians, interleaved; 18% in an earlier session), the engine's process about the same: a fifth
# of the claims, checkpoints and commits. A window whose rows leave more than `window` per row is
# still written again in windows of `window` rows (see `write_rows`).
SET_WINDOW = 500
# A refused set-based window of more rows goes again in windows of this many (each refused in turn
# in windows of `window`): a page of which a tenth leaves per row - rows written before, a catch-up's
# updates - is then written as it was with windows of 100, not in twenty windows of 25.
SET_WINDOW_FALLBACK = 100

Writer = Callable[[Conn, Any], str]
# A window's set-based writer (optimistic windows): given the window's rows to write as
# (position in the window, row), it writes the ones it can in set-based statements and returns
# their outcomes by position; the rows it leaves out go through the per-row savepoints. It may
# carry `leaves(rows) -> int`: how many of such rows it would leave per row for certain, asked
# before a large window's statements (more than `window`: the window is split without them).
Batch = Callable[[Conn, "list[tuple[int, Any]]"], "dict[int, str]"]


class _BatchRefused(Exception):
    """A window's set-based part was refused by the database: its transaction is rolled back."""


@dataclass(frozen=True)
class PageResult:
    """A page's outcome over its windows: rows attempted, rows failed, and rows by outcome
    (imported, matched, skipped, ...)."""
    attempted: int
    failed: int
    outcomes: dict[str, int]


def row_id(row: Any) -> str | None:
    """A row's source id as the ledger keys it (text, at most 64 characters), or None when the row
    has no readable `id` (not a dict, missing, empty, a bool)."""
    if isinstance(row, dict):
        value = row.get("id")
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip():
            return str(value)[:64]
    return None


def _held_key(row: Any) -> str:
    """A row's key in `ledger_reads.placeholders_of_run`: its source id, or "raw:" + the raw key of
    a row without a readable id, as `_write_row` records it (migration 0013)."""
    sid = row_id(row)
    if sid is not None:
        return sid
    raw = row.get("raw", row) if isinstance(row, Mapping) else row
    return "raw:" + ((row.get("raw_key") if isinstance(row, Mapping) else None) or unreadable_key(raw))


class Windows:
    """The window writer half of `TaskContext` (a mixin: the context's dataclass holds the fields)."""

    if TYPE_CHECKING:
        db: Database
        run: Run
        task: Task
        settings: Settings
        log: RunLog
        stats: Stats
        offset: int
        window: int
        set_window: int

        @property
        def revisit(self) -> bool: ...

        def checkpoint(self, tx: Conn, offset: int) -> None: ...

    def write_rows(
        self,
        rows: Sequence[Any],
        writer: Writer,
        *,
        kind: str | None = None,
        resume_from: int | None = None,
        offset_after: Callable[[int], int] | None = None,
        fail_if_all_failed: bool = True,
        batch: Batch | None = None,
    ) -> PageResult:
        """Write a page in windows: one transaction per window, one savepoint per row, the
        checkpoint inside the window's transaction. A row that raises is rolled back alone and
        counted; a deadlock or serialization failure loses the window and releases the task.
        A page whose every row failed raises PageFailed unless the caller judges that itself.

        With `batch` (optimistic windows; not in a dry run), windows hold `set_window`
        rows (no savepoints bound them), and each first offers its rows to write (not those
        committed before, nor a revisit's own) to `batch` in the window's transaction; the rows it
        answers for are counted with its outcomes, the rest are written per row after it. When
        the batch raises (a row the database refuses), or leaves more than `window` rows to write
        per row (their savepoints would overflow Postgres's 64 cached subxids; a batch's
        `leaves` says so before its statements), the window's transaction is rolled back and its
        rows go in windows of SET_WINDOW_FALLBACK rows, refused in turn in windows of `window`
        rows, each set-based first and per row when refused, so a malformed row still fails alone
        with its reason; a deadlock, a lost lock or a lost connection loses the window as before."""
        kind = kind or self.task.kind
        start = self.offset if resume_from is None else resume_from
        attempted = failed = 0
        mine: dict[str, str] = {}
        if self.revisit:
            # a task run again after a retry: rows this run already wrote count as written, untouched
            with self.db.connection() as conn:
                ids = [row_id(r) for r in rows[start:]]
                mine = ledger.written_by_run(conn, self.run, kind, ids)
                # rows this run updated in place count as updated again: the history keeps
                # the update, and the task's fresh counts must say so too (the rollup compares them)
                for sid in ledger.updated_by_run(conn, self.run, kind, ids):
                    mine.setdefault(sid, ledger.UPDATED)
        outcomes: dict[str, int] = {}
        set_based = batch is not None and not self.run.dry_run
        size = max(self.window, self.set_window) if set_based else self.window
        for w in range(0, len(rows), size):
            if w + len(rows[w : w + size]) <= start:
                continue  # committed before a crash or a release
            counts = self._write_span(rows, w, size, start, kind, writer, mine, batch if set_based else None, offset_after)
            for k, v in counts.items():
                outcomes[k] = outcomes.get(k, 0) + v
            attempted += sum(counts.values())
            failed += counts.get(ledger.FAILED, 0)
            if self.log.should_flush_early():
                self.log.flush(self.db)  # type: ignore[arg-type]
        if fail_if_all_failed and attempted and failed == attempted:
            raise PageFailed(f"every row of the page failed ({failed} rows); first reasons are in the run log")
        return PageResult(attempted, failed, outcomes)

    def _write_span(self, rows: Sequence[Any], w: int, size: int, start: int, kind: str, writer: Writer,
                    mine: dict[str, str], batch: Batch | None, offset_after: Callable[[int], int] | None) -> dict[str, int]:
        """rows[w : w + size] in windows, their outcome counts. Larger than `window` (set-based):
        one window, which refused - by the database, or leaving more than `window` rows per row
        (their savepoints would overflow the subxid cache) - rolls back and goes again in windows
        of SET_WINDOW_FALLBACK rows, then of `window`. A window of `window` rows: set-based first
        with a batch, per row without one or when refused. Rows before `start` were committed."""
        if batch is not None and size > self.window:
            counts = self._write_window(rows, w, size, start, kind, writer, mine, batch, offset_after, per_row_max=self.window)
            if counts is not None:
                return counts
            smaller = SET_WINDOW_FALLBACK if size > SET_WINDOW_FALLBACK > self.window else self.window
            counts = {}
            for v in range(w, min(w + size, len(rows)), smaller):
                if v + len(rows[v : v + smaller]) <= start:
                    continue
                for k, n in self._write_span(rows, v, smaller, start, kind, writer, mine, batch, offset_after).items():
                    counts[k] = counts.get(k, 0) + n
            return counts
        part = None
        if batch is not None:
            part = self._write_window(rows, w, size, start, kind, writer, mine, batch, offset_after)
        if part is None:  # no batch, or the window's set-based part refused: per row
            part = self._write_window(rows, w, size, start, kind, writer, mine, None, offset_after)
        return part

    def _write_window(self, rows: Sequence[Any], w: int, size: int, start: int, kind: str, writer: Writer,
                      mine: dict[str, str], batch: Batch | None, offset_after: Callable[[int], int] | None = None,
                      per_row_max: int | None = None) -> dict[str, int] | None:
        """One window, rows[w : w + size], in one transaction with its checkpoint: its outcome
        counts. With `batch`, its rows to write go to the set-based part first; None when the
        database refused that part, or when more than `per_row_max` rows are left to write per
        row after it (the transaction rolled back, the stats restored: the caller writes the rows
        again in smaller windows). Rows before `start` were committed before."""
        window = rows[w : w + size]
        before = self.stats.copy()
        counts: dict[str, int] = {}
        try:
            with self.db.transaction() as tx:
                before_rows = self._placeholders(tx, kind, window[max(0, start - w):]) if self.stats.hears_rows else None
                batched: dict[int, str] = {}
                if batch is not None:
                    todo = [(j, row) for j, row in enumerate(window)
                            if w + j >= start and (not mine or mine.get(row_id(row) or "") is None)]
                    leaves = getattr(batch, "leaves", None)
                    if per_row_max is not None and leaves is not None and leaves(todo) > per_row_max:
                        raise _BatchRefused()  # too many per row for certain: split before any statement
                    batched = self._write_batch(tx, todo, batch) if todo else {}
                    if per_row_max is not None and len(todo) - len(batched) > per_row_max:
                        raise _BatchRefused()
                seen = 0
                for j, row in enumerate(window):
                    if w + j < start:
                        continue
                    done = mine.get(row_id(row) or "") if mine else None
                    if done is not None:
                        outcome = {"created": ledger.IMPORTED, "matched": ledger.MATCHED}.get(done, done)
                    elif j in batched:
                        outcome = batched[j]
                    else:
                        outcome = self._write_row(tx, kind, row, writer)
                    seen += 1
                    counts[outcome] = counts.get(outcome, 0) + 1
                    if before_rows is not None:
                        self.stats.heard(outcome, before_rows.get(_held_key(row)))
                # counted once a window (the checkpoint below writes them with the offset)
                if seen:
                    self.stats.bump("seen", seen)
                for outcome, n in counts.items():
                    self.stats.bump(outcome, n)
                end = w + len(window)
                self.checkpoint(tx, offset_after(end) if offset_after else end)
        except _BatchRefused:
            self.stats = before  # the window's transaction rolled back: again, per row
            return None
        except BaseException:
            self.stats = before  # the window is gone; so are its counts
            raise
        return counts

    def _placeholders(self, tx: Conn, kind: str, rows: Sequence[Any]) -> dict[str, str]:
        """The run's placeholders among `rows` before they are written (`ledger_reads.placeholders_of_run`)."""
        keys = [_held_key(row) for row in rows]
        return ledger_reads.placeholders_of_run(tx, self.run, kind, [k for k in keys if not k.startswith("raw:")],
                                                [k[4:] for k in keys if k.startswith("raw:")])

    def _write_batch(self, tx: Conn, todo: list[tuple[int, Any]], batch: Batch) -> dict[int, str]:
        """A window's set-based part in the window's transaction (no savepoint): its outcomes by
        position; when the database refuses it, _BatchRefused (the caller rolls the window back
        and writes it per row)."""
        try:
            return batch(tx, todo)
        except (TransientError, LockLost):
            raise  # the whole window is gone: the task retries with its cursor
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e).splitlines()[0] if str(e) else "connection lost") from e
        except Exception as e:
            raise _BatchRefused() from e

    def _note_dry_skip(self, tx: Conn, kind: str, row: Any, outcome: str) -> None:
        """A dry run's skipped (or waiting) row: its placeholder's reason, read before the
        savepoint's rollback takes it, noted in the run log at the outcome's level ("skipped",
        "waiting"), where the dry run's grouped reasons find it (`rollup.grouped_reasons`)."""
        sid = row_id(row) if outcome in (ledger.SKIPPED, WAITING) else None
        reason = ledger_reads.placeholder_reason(tx, self.run, kind, str(sid)) if sid is not None else None
        if reason is not None:
            self.log.note(outcome, kind, reason, subject=sid)

    def _write_row(self, tx: Conn, kind: str, row: Any, writer: Writer) -> str:
        try:
            with tx.savepoint() as sp:
                outcome = writer(tx, row)
                if self.run.dry_run:
                    self._note_dry_skip(tx, kind, row, outcome)
                    sp.rollback()  # a dry run reports what it would do, writes nothing
            if self.run.dry_run and outcome in (ledger.IMPORTED, ledger.MATCHED):
                sid = row_id(row)
                if sid is not None:  # remembered so this run's later phases can link to it
                    ledger.note_dry(tx, self.run, kind, sid, outcome)
            return outcome
        except (TransientError, LockLost):
            raise  # the whole window is gone: the task retries with its cursor
        except psycopg.OperationalError as e:
            raise DatabaseUnavailable(str(e).splitlines()[0] if str(e) else "connection lost") from e
        except Exception as e:  # a malformed row fails alone, with its reason
            reason = failure_reason(e)
            sid = row_id(row)
            if sid is not None:
                self.log.note("error", kind, reason, subject=sid)
                if not self.run.dry_run:
                    ledger.note_placeholder(tx, self.run, kind, sid, reason, action="failed")
                return ledger.FAILED
            # no readable id: the ledger cannot key it, so it is kept apart under its raw key
            # (migration 0013) - counted failed and told nowhere else was a silent loss
            raw = row.get("raw", row) if isinstance(row, Mapping) else row
            key = (row.get("raw_key") if isinstance(row, Mapping) else None) or unreadable_key(raw)
            self.log.note("error", kind, reason, subject=key)
            if not self.run.dry_run:
                ledger.note_unreadable(tx, self.run, kind, key, reason, excerpt(raw))
            return ledger.FAILED
