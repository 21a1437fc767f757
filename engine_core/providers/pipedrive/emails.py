"""The email phase: discovery, then tasks of ten deals that fetch bodies four at a time.

Discovery walks the deal lists (active and archived) a page per task, asking for each deal's
`email_messages_count`, and seeds tasks of ten deals that have mail (`{"deals": [ids]}`, keyed by
discovery page and chunk, so a retried page finds its tasks already there). A source that does not
report the count gets every deal listed: a deal without mail then costs one listing call.

An email task's offset is the index of the deal it is on. Per deal:

1. list its messages, 500 a page (one listing call per page);
2. drop the messages the ledger already has - nothing written is fetched again;
3. for the rest, a window (25 messages) at a time: fetch bodies in rounds of four - reserve four
   rate-limit slots on the task's thread, fetch on four threads that hold no database connection,
   join them all - and only when every body of the window is in hand, write the window: one
   transaction, a savepoint per message, nothing in flight to the source while it is open;
4. checkpoint the next deal's index.

Windows are fetched and written in turn rather than a whole page first: the writes are the same,
but a worker that dies mid-page loses at most one window of fetched bodies instead of a page.
Bodies fetched and not yet written when a worker dies are fetched again on resume (they were never
written); everything written is recognised by the ledger and never fetched twice.

A stop is honoured between rounds and between deals: the bodies in hand are written first.
A message that cannot be fetched alone (not found, a malformed answer) or cannot be written fails
alone with its reason; the deal's other messages land.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine_core import ledger
from engine_core.budget import Budget
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.errors import PageFailed, TaskStopped
from engine_core.models import Successor, TaskOutcome
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import BadResponse, NotFound
from engine_core.providers.pipedrive.mapping import (
    DEAL_KINDS,
    MalformedRow,
    Mapped,
    map_email,
    message_of,
    row_source_id,
    with_body,
)
from engine_core.providers.pipedrive.stripes import MAIL_SOURCES, PAGE, email_discovery_next, email_tasks
from engine_core.providers.pipedrive.writers import ledger_refs, write_mapped

log = logging.getLogger(__name__)

KIND = "emails"
FETCH_THREADS = 4  # bodies in flight per task: four lane threads x four = sixteen per process
TOUCH_EVERY = 15.0  # seconds between lock refreshes while rounds run without a window commit
SYSTEMIC_FAILURE_MIN = 25  # a task with at least this many messages, all failed, fails itself

# Which run, if any, already wrote these messages: this run's own writes were counted when their
# window committed; an earlier run's are reported as already here.
CLAIMED_BY_SQL = """
SELECT source_id, migration_id FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND source_id = ANY(%(ids)s::text[]) AND action IN ('created', 'matched')
"""


# --- discovery -------------------------------------------------------------------------------


def discover(ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
    """One page of a deal list: tasks of ten deals with mail, and the next discovery page."""
    cursor = ctx.task.cursor
    path = MAIL_SOURCES[cursor["discover"]]
    page = client.list_v2(path, {"include_fields": "email_messages_count"}, cursor=cursor.get("cursor"), limit=PAGE, cancel=ctx.cancel)
    deal_ids: list[int] = []
    uncounted = 0
    for row in page.rows:
        ident = row.get("id") if isinstance(row, dict) else None
        if not isinstance(ident, int) or isinstance(ident, bool) or ident <= 0:
            continue  # a malformed deal: the deals phase records it; it has no mail we can reach
        count = row.get("email_messages_count")
        if count is None:
            uncounted += 1
            deal_ids.append(ident)
        elif isinstance(count, int) and not isinstance(count, bool) and count > 0:
            deal_ids.append(ident)
    if uncounted:
        ctx.log.note("info", KIND, "the source does not report email_messages_count: every deal's mail is listed")
    ctx.stats.bump("deals_listed", len(page.rows))
    ctx.stats.bump("deals_with_mail", len(deal_ids))
    successors: list[Successor] = email_tasks(cursor, sorted(deal_ids))
    if page.more and page.next_cursor:
        successors.append(email_discovery_next(cursor, page.next_cursor))
    return TaskOutcome(tuple(successors))


# --- the task of ten deals -------------------------------------------------------------------


class MailRow(dict):
    """A message on its way to its window (a dict: the engine reads its `id`)."""

    def __init__(self, ident: str | None, mapped: Mapped | None = None, error: BaseException | None = None, fetch: bool = False) -> None:
        super().__init__(id=ident)
        self.mapped = mapped
        self.error = error
        self.fetch = fetch  # its body is still to be fetched


@dataclass
class Tally:
    """Messages written by this attempt, to tell a broken phase from a few malformed messages."""

    attempted: int = 0
    failed: int = 0


class EmailTask:
    def __init__(
        self,
        ctx: TaskContext,
        client: PipedriveClient,
        budget: Budget | None,
        pool: ThreadPoolExecutor,
        *,
        fetch_threads: int = FETCH_THREADS,
    ) -> None:
        self.ctx = ctx
        self.client = client
        self.budget = budget
        self.pool = pool
        self.fetch_threads = fetch_threads
        self.tally = Tally()
        self._touched = time.monotonic()

    # -- the task ---------------------------------------------------------------------------
    def run(self) -> TaskOutcome:
        ctx = self.ctx
        deals = [int(d) for d in ctx.task.cursor.get("deals", [])]
        index = ctx.offset
        while index < len(deals):
            ctx.stop_point()  # a deal boundary: everything before it is checkpointed
            self.deal(deals[index], index)
            ctx.stats.bump("deals")
            with ctx.db.transaction() as tx:
                ctx.checkpoint(tx, index + 1)
            self._touched = time.monotonic()
            index += 1
        t = self.tally
        if t.attempted >= SYSTEMIC_FAILURE_MIN and t.failed == t.attempted:
            raise PageFailed(f"every message of the task failed ({t.failed}); first reasons are in the run log")
        return TaskOutcome()

    def deal(self, deal_id: int, index: int) -> None:
        start = 0
        while True:
            try:
                page = self.client.mail_messages(deal_id, start=start, limit=PAGE, cancel=self.ctx.cancel)
            except NotFound:
                self.ctx.log.note("warning", KIND, "deal not found at the source (deleted since discovery)", subject=deal_id)
                return
            self.ctx.stats.bump("messages_listed", len(page.rows))
            self.page(deal_id, index, page.rows)
            if not page.more or page.next_start is None:
                return
            start = page.next_start

    # -- one page of a deal's messages ---------------------------------------------------------
    def page(self, deal_id: int, index: int, items: Sequence[Any]) -> None:
        ctx, run = self.ctx, self.ctx.run
        deal_sid = str(deal_id)
        rows: list[MailRow] = []
        for item in items:
            try:
                mapped = map_email(item, run.tenant_id, deal_sid)
            except MalformedRow as e:
                rows.append(MailRow(_sound_id(item), error=e))
                continue
            rows.append(MailRow(mapped.source_id, mapped))
        ids = [r["id"] for r in rows if r.mapped is not None]
        with ctx.db.connection() as conn:
            claimed = _claimed_by(conn, run.tenant_id, run.source, ids)
            # one reference query per page: the deal and the people on its messages
            found = ledger.resolve(conn, run, [(k, deal_sid) for k in DEAL_KINDS] + ledger_refs(r.mapped for r in rows))
        todo: list[MailRow] = []
        for r in rows:
            if r.mapped is not None and r["id"] in claimed:
                if claimed[r["id"]] != run.id:
                    ctx.stats.bump("seen")
                    ctx.stats.bump(ledger.ALREADY_HERE)
                continue  # written before: never fetched again
            todo.append(r)
        deal_here = any(found.get((k, deal_sid)) is not None for k in DEAL_KINDS)
        for r in todo:
            # bodies only for messages that will be written: none in a dry run, none without the deal
            r.fetch = r.mapped is not None and deal_here and not run.dry_run
        window = ctx.window
        for w in range(0, len(todo), window):
            chunk = todo[w : w + window]
            error = self.fetch(chunk)
            ready = [r for r in chunk if not r.fetch]
            self.write(ready, found, index)
            if error is not None:
                raise error

    # -- fetch rounds -------------------------------------------------------------------------
    def fetch(self, rows: list[MailRow]) -> BaseException | None:
        """Fetch the bodies of `rows` in rounds; returns the error that ended the task's fetching
        (a stop, a spent budget, a source that keeps failing), with what was fetched kept."""
        wanted = [r for r in rows if r.fetch]
        per_round = self.fetch_threads
        if self.budget is not None:
            per_round = max(1, min(per_round, self.budget.lease_size()))
        for n in range(0, len(wanted), per_round):
            if self.ctx.should_stop():
                return TaskStopped()
            self._touch()
            batch = wanted[n : n + per_round]
            try:
                self.round(batch)
            except BaseException as e:  # noqa: BLE001 - handed back to be raised after the write
                return e
        return None

    def round(self, batch: list[MailRow]) -> None:
        """One round: reserve the slots here, fetch on the pool's threads, join every one."""
        reservation = self.budget.reserve(len(batch), cancel=self.ctx.cancel) if self.budget is not None else None
        try:
            futures = [
                self.pool.submit(self.client.mail_body, int(r["id"]), cancel=self.ctx.cancel, reservation=reservation)
                for r in batch
            ]
            fatal: BaseException | None = None
            for r, f in zip(batch, futures):
                try:
                    message = f.result()
                except (NotFound, BadResponse) as e:
                    r.error, r.fetch = e, False  # this message alone
                    continue
                except BaseException as e:  # noqa: BLE001 - the others are joined first
                    fatal = fatal or e
                    continue
                try:
                    assert r.mapped is not None
                    r.mapped = with_body(r.mapped, message)
                except MalformedRow as e:
                    r.error = e
                r.fetch = False
                self.ctx.stats.bump("bodies")
        finally:
            if reservation is not None:
                reservation.release()
        if fatal is not None:
            raise fatal

    # -- writing ------------------------------------------------------------------------------
    def write(self, rows: list[MailRow], found: dict[tuple[str, str], int], index: int) -> None:
        if not rows:
            return
        ctx = self.ctx

        def writer(tx: Conn, row: MailRow) -> str:
            if row.error is not None:
                raise row.error
            assert row.mapped is not None
            return write_mapped(tx, ctx.run, KIND, row.mapped, found)

        try:
            result = ctx.write_rows(rows, writer, kind=KIND, resume_from=0, offset_after=lambda _: index)
        except PageFailed:
            # a window of messages that all failed (often a window of one): each failed alone
            self.tally.attempted += len(rows)
            self.tally.failed += len(rows)
        else:
            self.tally.attempted += result.attempted
            self.tally.failed += result.failed
        self._touched = time.monotonic()  # the window's checkpoint refreshed the lock

    def _touch(self) -> None:
        if time.monotonic() - self._touched >= TOUCH_EVERY:
            self.ctx.touch()
            self._touched = time.monotonic()


def _sound_id(item: Any) -> str | None:
    try:
        return row_source_id(message_of(item), KIND)
    except MalformedRow:
        return None


def _claimed_by(conn: Conn, tenant_id: str, source: str, ids: list[str]) -> dict[str, int]:
    if not ids:
        return {}
    rows = conn.sql(CLAIMED_BY_SQL, {"tenant_id": tenant_id, "source": source, "kind": KIND, "ids": ids})
    return {r["source_id"]: r["migration_id"] for r in rows}


def run_email_task(ctx: TaskContext, client: PipedriveClient, budget: Budget | None, *, fetch_threads: int = FETCH_THREADS) -> TaskOutcome:
    with ThreadPoolExecutor(max_workers=fetch_threads, thread_name_prefix=f"mail-{ctx.task.id}") as pool:
        return EmailTask(ctx, client, budget, pool, fetch_threads=fetch_threads).run()
