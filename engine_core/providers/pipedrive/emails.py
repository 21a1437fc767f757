"""The email phase: discovery, then tasks of ten deals that keep four requests in flight.

Discovery walks the deal lists (active and archived) a page per task, asking for each deal's
`email_messages_count`, and seeds tasks of ten deals that have mail (`{"deals": [ids]}`, keyed by
discovery page and chunk, so a retried page finds its tasks already there). A source that does not
report the count gets every deal listed: a deal without mail then costs one listing call. A deal
the ledger holds waiting for the catch-up's walk gets no task: the catch-up writes it and lists its
mail then (`walk_proof.mail_left_to_catchup`), once. Its messages are not listed here, so they are
no rows of this phase (not `seen`, not `waiting`: no ledger row holds them); the page counts the
deals in `left_to_catchup:deals` (`rows.left_to_catchup`) and their messages as the list reports
them in `messages_left_to_catchup`, what the run's figures say of them (`rollup.KindRollup.left`).

An email task's offset is the index of the first of its deals not yet finished; everything before
it is written. The task works in rounds:

* a round is up to four requests - bodies of listed messages first, then listings (500 messages a
  page) of the next deals to keep the round full: reserve the slots on the task's thread, run the
  requests on four fetch threads that hold no database connection, join them all;
* the round's listed pages are judged by the engine before any body is fetched
  (`sighting.decide_page`, one connection a round): the messages the ledger already has are dropped
  (nothing written is fetched again), the references - the deals and the people on the mail -
  resolved, and only messages that will be written as served get a body;
* a window of 25 messages is written once every body in it is in hand, through the engine's page
  path (`write.write_mapped_page` with the references the listings read): one transaction, a
  savepoint per message or set-based statements, the checkpoint inside (the index of the first
  unfinished deal), and no request in flight while it is open, because rounds are joined before
  anything is written.

Rounds mix deals so that a task of small deals (most have one or two messages) still has four
requests in flight; a deal's checkpoint is written inside the window that finishes it rather than
in a transaction of its own (the seed's one-transaction-per-deal write cut, taken a step further).
A round never fetches more bodies than the current window has room for, and bodies go first into
a window, so a window's commit leaves no fetched body unwritten: a worker killed between windows
fetches nothing again on resume, one killed during a window's rounds at most that window's bodies
(they were never written). Everything written is recognised by the ledger and never fetched twice.

A stop is honoured between rounds: the messages in hand are written and the progress checkpointed
before the task stops. A message that cannot be fetched alone (a malformed answer) or cannot be
written fails alone with its reason; the deal's other messages land. A deal whose mail listing
answers 403 while the token still reads the account's own identity (`paging.settle_refusals`) is
that deal's outcome - its mail told unreachable with the reason (`EmailTask._unreachable`) - and
the task goes on; a token refused (401, or 403 on `/v1/users/me`) stops it as before.

Mail the source serves but Postgres cannot hold as given is imported, never lost:
every string of a message - subject, snippet, addresses, names, body - loses its NUL characters and
has lone UTF-16 surrogates replaced by U+FFFD (`clean_strings`); the client decodes invalid UTF-8
once, with U+FFFD (a deterministic property of the data, never retried); a body longer than
`EMAIL_BODY_MAX` is cut there and the row says `body_truncated` with its original length; a
body answering 403 (private) or 404 (deleted since listed) leaves the message without a body,
`body_unavailable` = the status, and a grouped warning in the run log. The stats count them:
`sanitized` (messages with any text repaired), `bodies_truncated`, `bodies_unavailable`.

Counts commit with the rows they describe. Every counter of a message - `messages_listed`,
`bodies`, `seen` and its outcome - is bumped inside the window that writes it, so a stop, a lost
lock or a crash that rolls a window back rolls its counts back too. The checkpoint is the first
unfinished deal plus `deals_done_mask` (in the task's stats, committed with them: bit j = deal j
is finished), so a resumed task lists only the deals it had not finished. In a deal it had
started, the messages its run already recorded (written, skipped, failed) were counted by a
committed window and are dropped without being counted, fetched or written again; messages that
leave no trace of this run in the ledger (already here from an earlier run) are counted when
their deal finishes, in the transaction that records the deal finished.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine_core.budget import Budget
from engine_core.context import TaskContext
from engine_core.errors import PageFailed, RateLimitParked, TaskStopped
from engine_core.models import Successor, TaskOutcome
from engine_core.marks import Marks, Unreadable, count_kept_apart, write_marks
from engine_core.rows import EMAIL_BODY_MAX, FittedBody, excerpt, fit_email_body, left_to_catchup
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.paging import Page, settle_refusals
from engine_core.providers.pipedrive.errors import BadResponse, BodyUnavailable, ItemRefused, PipedriveError
from engine_core.providers.pipedrive.mapping import MalformedRow, Mapped, unreadable_key
from engine_core.providers.pipedrive.mail import (clean_strings, clean_text, map_email, message_or_item,  # noqa: F401
                                                  sound_message_id, with_body, with_values)
from engine_core.providers.pipedrive.mail_expect import LISTED, WITH_MAIL, list_count, with_expectation
from engine_core.providers.pipedrive.stripes import MAIL_SOURCES, PAGE, email_discovery_next, email_tasks
from engine_core.providers.pipedrive.walk_proof import mail_left_to_catchup
from engine_core.sighting import RECORDED, decide_page
from engine_core.write import PageRefs, Prepared, write_mapped_page

KIND = "emails"
DONE_MASK = "deals_done_mask"  # a stats entry: bit j set = deal j of the task is finished and counted
FETCH_THREADS = 4  # requests in flight per task: four lane threads x four = sixteen per process
TOUCH_EVERY = 15.0  # seconds between lock refreshes while rounds run without a window commit
SYSTEMIC_FAILURE_MIN = 25  # a task with at least this many messages, all failed, fails itself

# --- discovery -------------------------------------------------------------------------------


def discover(ctx: TaskContext, client: PipedriveClient) -> TaskOutcome:
    """One page of a deal list: tasks of ten deals with mail, and the next discovery page, whose
    cursor says how many tasks the rest of the walk is expected to seed (`mail_expect`)."""
    cursor = ctx.task.cursor
    path = MAIL_SOURCES[cursor["discover"]]
    page = client.list_v2(path, {"include_fields": "email_messages_count"}, cursor=cursor.get("cursor"), limit=PAGE, cancel=ctx.cancel)
    deal_ids: list[int] = []
    counts: dict[int, int] = {}  # messages the list reports per deal with mail
    uncounted = 0
    unreachable: list[tuple[Any, Any]] = []
    for row in page.rows:
        ident = row.get("id") if isinstance(row, dict) else None
        count = row.get("email_messages_count") if isinstance(row, dict) else None
        if not isinstance(ident, int) or isinstance(ident, bool) or ident <= 0:
            # a malformed deal: the deals phase records it; no mail of it can be reached - said
            # here, with the count the list reports, so its mail is told somewhere
            if not (isinstance(count, int) and not isinstance(count, bool) and count <= 0):
                unreachable.append((row, count))
            continue
        if count is None:
            uncounted += 1
            deal_ids.append(ident)
        elif isinstance(count, int) and not isinstance(count, bool) and count > 0:
            deal_ids.append(ident)
            counts[ident] = count
    if uncounted:
        ctx.log.note("info", KIND, "the source does not report email_messages_count: every deal's mail is listed")
    if unreachable:
        note_unreachable_mail(ctx, unreachable)
    ctx.stats.bump("deals_listed", len(page.rows))
    ctx.stats.bump("deals_with_mail", len(deal_ids))
    deferred = mail_left_to_catchup(ctx, deal_ids)
    if deferred:
        # never listed here, so no rows of this phase: the catch-up lists them after writing the deal
        ctx.stats.bump(left_to_catchup("deals"), len(deferred))
        ctx.stats.bump("messages_left_to_catchup", sum(counts.get(d, 0) for d in deferred))
        deal_ids = [d for d in deal_ids if d not in deferred]
    successors: list[Successor] = email_tasks(cursor, sorted(deal_ids))
    if page.more and page.next_cursor:
        # the next page carries what the rest of the walk is expected to seed (`mail_expect`)
        nxt = email_discovery_next(cursor, page.next_cursor)
        listed, with_mail = int(cursor.get(LISTED, 0)) + len(page.rows), int(cursor.get(WITH_MAIL, 0)) + len(deal_ids)
        total = list_count(ctx.db, ctx.run.id, cursor["discover"])
        successors.append(Successor(nxt.cursor_key, with_expectation(nxt.cursor, listed, with_mail, total)))
    return TaskOutcome(tuple(successors))


def note_unreachable_mail(ctx: TaskContext, deals: Sequence[tuple[Any, Any]]) -> None:
    """The mail of deals served without a readable id (`(row, email_messages_count)`; the count
    None when the list does not report it): a deal's mail is listed by the deal's id, so none of
    it can be reached. Each deal is kept beside the ledger under kind `emails` (migration 0013:
    its key "deal " + `mapping.unreadable_key`, the reason naming the count), so the run's grouped
    reasons, `migrate rows` and `migrate explain` tell it; `mail_unreachable` counts the messages
    the list reported; each deal is a row seen and failed (`marks.count_kept_apart`). A dry run
    notes it in the run log only."""
    told = []
    for row, count in deals:
        what = f"{count} email(s)" if isinstance(count, int) else "its emails (the list reports no count)"
        told.append(("deal " + unreadable_key(row), row,
                     f"the mail of a deal served without a readable id cannot be listed: {what} not fetched "
                     "(the deal fails with its own reason in the deals phase)"))
        if isinstance(count, int):
            ctx.stats.bump("mail_unreachable", count)
    for key, _, reason in told:
        ctx.log.note("error", KIND, reason, subject=key)
    count_kept_apart(ctx.stats, len(told))
    if not ctx.run.dry_run:
        with ctx.db.transaction() as tx:
            write_marks(tx, ctx.run, Marks(unreadable=[Unreadable(KIND, key, reason, excerpt(row)) for key, row, reason in told]))


# --- the task of ten deals -------------------------------------------------------------------


class MailRow(Prepared):
    """A message on its way to its window, in the engine's row shape (`write.Prepared`: its `id`,
    `mapped`, `error`), with what its window counts when it commits."""

    def __init__(self, deal: int, prepared: Prepared) -> None:
        super().__init__(prepared)
        self.deal = deal  # index of its deal in the task
        self.fetched = False  # its body is in hand (or the source said it has none for us)
        self.repaired = 0  # characters of its text repaired: NUL, lone surrogates, invalid UTF-8
        self.unavailable: int | None = None  # the status its body fetch answered: 403 or 404
        self.truncated = False


@dataclass(frozen=True)
class Listing:
    """A request for one page of a deal's messages."""

    deal: int  # index in the task
    start: int


@dataclass
class Tally:
    """Messages written by this attempt, to tell a broken phase from a few malformed messages."""

    attempted: int = 0
    failed: int = 0


class EmailTask:
    """One mail task: for its deals (`cursor["deals"]`, source ids), list each deal's messages
    (`GET /v1/deals/{id}/mailMessages`), fetch the bodies of those that will be written
    (`GET /v1/mailbox/mailMessages/{id}?include_body=1`, `fetch_threads` at a time within the
    budget's lease) and write them in windows of `ctx.window` rows. The offset is the first deal
    not finished, so a resumed task lists no finished deal again."""

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
        self.per_round = fetch_threads
        if budget is not None:
            self.per_round = max(1, min(fetch_threads, budget.lease_size()))
        self.deals = [int(d) for d in ctx.task.cursor.get("deals", [])]
        # a catch-up's mail task: this run's own placeholders are taken over too - mail
        # skipped earlier in the run because its deal was not written yet (the catch-up wrote it)
        self.retake = bool(ctx.task.cursor.get("retake"))
        self.offset = min(ctx.offset, len(self.deals))
        done = ctx.stats.get(DONE_MASK)
        self.listed = {j: bool(done >> j & 1) for j in range(self.offset, len(self.deals))}
        self.outstanding = {j: 0 for j in range(self.offset, len(self.deals))}
        self.to_list: deque[Listing] = deque(Listing(j, 0) for j in range(self.offset, len(self.deals)) if not self.listed[j])
        # outcomes known without a write (another run wrote the message): counted when their deal
        # finishes, in the transaction that sets its bit in the done mask
        self.deferred: dict[int, Counter[str]] = {}
        self.to_fetch: deque[MailRow] = deque()
        # In hand for a window: messages with their bodies, and messages that need none (failed,
        # skipped, a dry run). Bodies go first into a window and a round never fetches more than
        # the window has room for, so a window's commit leaves no fetched body unwritten.
        self.ready_bodies: deque[MailRow] = deque()
        self.ready_other: deque[MailRow] = deque()
        # the references of every listed page (`sighting.decide_page`), its windows' (`write_mapped_page`);
        # `held`: messages the ledger holds written that go to a window again (a newer version)
        self.refs = PageRefs(dry=set() if ctx.run.dry_run else None)
        self.tally = Tally()
        self._touched = time.monotonic()

    # -- the task ---------------------------------------------------------------------------
    def run(self) -> TaskOutcome:
        """Run the task to its end. Raises TaskStopped, RateLimitParked or PipedriveError after
        writing what is in hand; PageFailed when all of at least `SYSTEMIC_FAILURE_MIN` messages
        failed (a broken task, not bad rows)."""
        try:
            while self.to_list or self.to_fetch or self.in_hand:
                if self.in_hand >= self.ctx.window or (self.in_hand and not self.to_fetch and not self.to_list):
                    self.write_window()
                    continue
                if self.ctx.should_stop():
                    raise TaskStopped()
                self._touch()
                self.round()
        except (TaskStopped, RateLimitParked, PipedriveError):
            # Nothing is in flight (rounds are joined): keep what is in hand, then stop.
            self.flush()
            raise
        self.checkpoint_progress()
        t = self.tally
        if t.attempted >= SYSTEMIC_FAILURE_MIN and t.failed == t.attempted:
            raise PageFailed(f"every message of the task failed ({t.failed}); first reasons are in the run log")
        return TaskOutcome()

    @property
    def in_hand(self) -> int:
        """Messages ready for a window (with their bodies, or needing none)."""
        return len(self.ready_bodies) + len(self.ready_other)

    def first_unfinished(self) -> int:
        """Index in `deals` of the first deal not yet listed or with messages not yet written
        (`len(deals)` when all are): the task's checkpoint offset."""
        for j in range(self.offset, len(self.deals)):
            if not self.listed[j] or self.outstanding[j]:
                return j
        return len(self.deals)

    # -- rounds -----------------------------------------------------------------------------
    def round(self) -> None:
        """Up to four requests: bodies first, listings to fill; reserved here, run on the pool."""
        bodies: list[MailRow] = []
        room = max(0, self.ctx.window - len(self.ready_bodies))
        while self.to_fetch and len(bodies) < min(self.per_round, room):
            bodies.append(self.to_fetch.popleft())
        listings: list[Listing] = []
        while self.to_list and len(bodies) + len(listings) < self.per_round:
            listings.append(self.to_list.popleft())
        n = len(bodies) + len(listings)
        try:
            reservation = self.budget.reserve(n, cancel=self.ctx.cancel, deferred=True) if self.budget is not None else None
        except BaseException:
            self.to_fetch.extendleft(reversed(bodies))
            self.to_list.extendleft(reversed(listings))
            raise
        cancel = self.ctx.cancel
        try:
            body_futures = [
                self.pool.submit(self.client.mail_body, int(r["id"]), cancel=cancel, reservation=reservation) for r in bodies
            ]
            list_futures = [
                self.pool.submit(self.client.mail_messages, self.deals[l.deal], l.start, PAGE, cancel=cancel, reservation=reservation)
                for l in listings
            ]
            if reservation is not None:
                # the fetch threads' budget business (a retry's slot, a 429 for the row) runs here
                reservation.serve(body_futures + list_futures)
            refused_bodies, fatal = self._join_bodies(bodies, body_futures)
            pages, refused_deals, fatal = self._join_listings(listings, list_futures, fatal)
        finally:
            if reservation is not None:
                reservation.release()
        if refused_bodies or refused_deals:
            try:
                # one deal's private mail is that deal's outcome, unless the token itself is refused
                settle_refusals(self.client, [e for _, e in refused_bodies] + [e for _, e in refused_deals],
                                cancel=self.ctx.cancel)
            except BaseException:
                self.to_fetch.extendleft(reversed([r for r, _ in refused_bodies]))
                self.to_list.extendleft(reversed([l for l, _ in refused_deals]))
                self.take_pages(pages)
                raise
            for r, e in refused_bodies:
                self._without_body(r, e)
            for l, e in refused_deals:
                self._unreachable(l, e)
                pages.append((l, Page()))
        self.take_pages(pages)
        if fatal is not None:
            raise fatal

    def _join_bodies(self, rows: list[MailRow], futures: list[Future]) -> tuple[list[tuple[MailRow, ItemRefused]], BaseException | None]:
        fatal: BaseException | None = None
        retry: list[MailRow] = []
        refused: list[tuple[MailRow, ItemRefused]] = []
        for r, f in zip(rows, futures):
            try:
                message = f.result()
            except BodyUnavailable as e:
                refused.append((r, e))  # the message's own outcome once the token is not the cause
                continue
            except BadResponse as e:
                r["error"] = e  # this message alone
                self.ready_other.append(r)
                continue
            except BaseException as e:  # noqa: BLE001 - every request is joined before raising
                fatal = fatal or e
                retry.append(r)
                continue
            r.fetched = True
            try:
                r["mapped"] = self._with_body(r, message)
            except MalformedRow as e:
                r["error"] = e
            self.ready_bodies.append(r)
        self.to_fetch.extendleft(reversed(retry))
        return refused, fatal

    def _without_body(self, r: MailRow, e: ItemRefused) -> None:
        """A body answering 403 (private) or 404 (deleted since listed): the message is imported
        without it, and says so."""
        r.fetched = True
        r.unavailable = e.status
        r["mapped"] = with_values(r["mapped"], {"body": None, "body_unavailable": e.status})
        self.ready_bodies.append(r)

    def _join_listings(
        self, listings: list[Listing], futures: list[Future], fatal: BaseException | None
    ) -> tuple[list[tuple[Listing, Page]], list[tuple[Listing, ItemRefused]], BaseException | None]:
        pages: list[tuple[Listing, Page]] = []
        refused: list[tuple[Listing, ItemRefused]] = []
        retry: list[Listing] = []
        for l, f in zip(listings, futures):
            try:
                pages.append((l, f.result()))
            except ItemRefused as e:
                if e.status == 404:
                    self.ctx.log.note("warning", KIND, "deal not found at the source (deleted since discovery)",
                                      subject=self.deals[l.deal])
                    pages.append((l, Page()))
                else:
                    refused.append((l, e))
            except BaseException as e:  # noqa: BLE001
                fatal = fatal or e
                retry.append(l)
        self.to_list.extendleft(reversed(retry))
        return pages, refused, fatal

    def _unreachable(self, listing: Listing, error: ItemRefused) -> None:
        """A deal whose mail listing the source refuses (403: the deal's mail is private to another
        user) while the token is accepted: none of its mail can be fetched. Told like mail of a
        deal without a readable id (`note_unreachable_mail`): kept beside the ledger under kind
        `emails` and key "deal <id>" with the reason, so the run's grouped reasons, `migrate rows`
        and `migrate explain emails "deal <id>"` say it; `deals_unreachable` counts such deals,
        each a row seen and failed (`marks.count_kept_apart`).
        The deal finishes with no message; the task and the phase go on."""
        deal = self.deals[listing.deal]
        key = f"deal {deal}"
        reason = (f"the deal's mail cannot be listed: the source answered HTTP {error.status}"
                  f"{' (' + error.detail + ')' if error.detail else ''} while the token reads the account"
                  " - the deal's mail is not visible to this token's user; none of it is fetched")
        self.ctx.stats.bump("deals_unreachable")
        count_kept_apart(self.ctx.stats, 1)
        self.ctx.log.note("error", KIND, reason, subject=key)
        if not self.ctx.run.dry_run:
            with self.ctx.db.transaction() as tx:
                write_marks(tx, self.ctx.run, Marks(unreadable=[Unreadable(KIND, key, reason, f'{{"deal_id": {deal}}}')]))

    # -- listed pages -----------------------------------------------------------------------
    def take_pages(self, pages: list[tuple[Listing, Page]]) -> None:
        """Map the listed messages, judge them against the ledger in one connection
        (`sighting.decide_page`: what the ledger has costs no request), and queue each message for
        its body (or straight for its window)."""
        if not pages:
            return
        run = self.ctx.run
        rows: list[MailRow] = []
        more: list[Listing] = []
        for listing, page in pages:
            deal_sid = str(self.deals[listing.deal])
            for raw in page.rows:
                item, repaired = clean_strings(raw)  # subject, snippet, addresses: text Postgres can hold
                row = MailRow(listing.deal, Prepared.of(
                    item, lambda it: map_email(it, run.tenant_id, deal_sid), malformed=MalformedRow,
                    raw_id=sound_message_id, raw_key=lambda it: unreadable_key(message_or_item(it))))
                row.repaired = repaired
                rows.append(row)
            if page.more and page.next_start is not None:
                more.append(Listing(listing.deal, page.next_start))
            else:
                self.listed[listing.deal] = True
        self.to_list.extendleft(reversed(more))  # finish a deal's listing before starting others
        decided = decide_page(self.ctx, KIND, rows, retake=self.retake)
        self.refs.found.update(decided.refs.found)
        self.refs.held.update(decided.refs.held)
        self.refs.exists.update(decided.refs.exists)  # deals left to the catch-up's walk
        self.refs.held_as.update(decided.refs.held_as)  # deals failed or skipped: the mail's reason says so
        if self.refs.dry is not None and decided.refs.dry:
            self.refs.dry |= decided.refs.dry
        for r, outcome, fetch in zip(rows, decided.outcomes, decided.fetch):
            if outcome == RECORDED:
                continue
            if outcome is not None:
                # never fetched again; counted when its deal finishes
                self.deferred.setdefault(r.deal, Counter())[outcome] += 1
                continue
            self.outstanding[r.deal] += 1
            # bodies only for messages that will be written: none in a dry run, none without the deal
            (self.to_fetch if fetch else self.ready_other).append(r)

    # -- writing ------------------------------------------------------------------------------
    def write_window(self) -> None:
        """Write up to `ctx.window` messages in hand (bodies first) in one transaction, with the
        counts and the offset of the deals they finish; a window that fails restores the counts."""
        ctx = self.ctx
        rows = [self.ready_bodies.popleft() for _ in range(min(ctx.window, len(self.ready_bodies)))]
        rows += [self.ready_other.popleft() for _ in range(min(ctx.window - len(rows), len(self.ready_other)))]
        for r in rows:
            self.outstanding[r.deal] -= 1
        before, after = self.offset, self.first_unfinished()
        counted = ctx.stats.copy()  # what was committed so far: a failed window restores it
        ctx.stats.bump("deals", after - before)
        self._count(rows)
        self._count_finished()
        try:
            # the engine's write path with the references the rows' listings read; a window whose
            # every message failed (often a window of one) is not a broken task: each message
            # failed alone; the task-level judgement is the tally's
            result = write_mapped_page(ctx, rows, kind=KIND, refs=self.refs, resume_from=0,
                                       offset_after=lambda _: after, fail_if_all_failed=False)
        except BaseException:
            ctx.stats = counted
            for r in rows:
                self.outstanding[r.deal] += 1
            for r in reversed(rows):
                (self.ready_bodies if r.fetched else self.ready_other).appendleft(r)
            raise
        else:
            self.tally.attempted += result.attempted
            self.tally.failed += result.failed
        self.offset = after
        self._touched = time.monotonic()  # the window's checkpoint refreshed the lock
        self._note(rows)

    def _count_finished(self) -> None:
        """Deals finished since the last commit: their deferred outcomes and their done bit, for
        the transaction about to commit (the caller restores the stats if it does not)."""
        stats = self.ctx.stats
        done = stats.get(DONE_MASK)
        for j in range(self.offset, len(self.deals)):
            if done >> j & 1 or not self.listed[j] or self.outstanding[j]:
                continue
            done |= 1 << j
            for outcome, n in self.deferred.pop(j, Counter()).items():
                stats.bump("messages_listed", n)
                stats.bump("seen", n)
                stats.bump(outcome, n)
        stats.values[DONE_MASK] = done

    def _count(self, rows: list[MailRow]) -> None:
        """A window's message counters, bumped with the window (restored if it rolls back)."""
        stats = self.ctx.stats
        stats.bump("messages_listed", len(rows))
        for r in rows:
            if r.fetched and r.unavailable is None:
                stats.bump("bodies")
            if r.unavailable is not None:
                stats.bump("bodies_unavailable")
            if r.truncated:
                stats.bump("bodies_truncated")
            if r.repaired:
                stats.bump("sanitized")

    def _note(self, rows: list[MailRow]) -> None:
        """Grouped run-log notes for what a committed window imported other than as served."""
        log = self.ctx.log
        for r in rows:
            if r.unavailable is not None:
                why = "private message" if r.unavailable == 403 else "deleted at the source since it was listed"
                log.note("warning", KIND, f"imported without its body: the source answered HTTP {r.unavailable} ({why})",
                         subject=r["id"])
            if r.truncated:
                log.note("warning", KIND, f"body cut at {EMAIL_BODY_MAX:,} characters (body_truncated)", subject=r["id"])
            if r.repaired:
                log.note("info", KIND, "text repaired: NUL removed, lone surrogates or invalid UTF-8 replaced with U+FFFD",
                         subject=r["id"])

    def _with_body(self, r: MailRow, message: Any) -> Mapped:
        """The fetched body made storable: text repaired, cut at `EMAIL_BODY_MAX`, flags set."""
        body = message.get("body") if isinstance(message, dict) else None
        r.repaired += int(getattr(message, "invalid_utf8", 0) or 0)
        if isinstance(body, str):
            body, repaired = clean_text(body)
            r.repaired += repaired
        fitted = fit_email_body(body) if isinstance(body, str) else FittedBody(body)
        r.truncated = fitted.truncated
        mapped = with_body(r["mapped"], {"body": fitted.body})  # its checks: a body that is not text
        return with_values(mapped, {"body_truncated": fitted.truncated, "body_original_length": fitted.original_length})

    def flush(self) -> None:
        """Write every message in hand and checkpoint (before a stop or a source failure)."""
        while self.in_hand:
            self.write_window()
        self.checkpoint_progress()

    def checkpoint_progress(self) -> None:
        """Deals finished without a window of their own (no mail, all here) move the offset too."""
        after = self.first_unfinished()
        done = self.ctx.stats.get(DONE_MASK)
        newly = [j for j in range(self.offset, len(self.deals)) if self.listed[j] and not self.outstanding[j] and not done >> j & 1]
        if after > self.offset or newly:
            counted = self.ctx.stats.copy()
            self.ctx.stats.bump("deals", after - self.offset)
            self._count_finished()
            try:
                with self.ctx.db.transaction() as tx:
                    self.ctx.checkpoint(tx, after)
            except BaseException:
                self.ctx.stats = counted
                raise
            self.offset = after

    def _touch(self) -> None:
        if time.monotonic() - self._touched >= TOUCH_EVERY:
            self.ctx.touch()
            self._touched = time.monotonic()


def run_email_task(ctx: TaskContext, client: PipedriveClient, budget: Budget | None, *, fetch_threads: int = FETCH_THREADS) -> TaskOutcome:
    """Run one mail task (`EmailTask`) with its own pool of `fetch_threads` body fetchers; raises as
    `EmailTask.run`."""
    with ThreadPoolExecutor(max_workers=fetch_threads, thread_name_prefix=f"mail-{ctx.task.id}") as pool:
        return EmailTask(ctx, client, budget, pool, fetch_threads=fetch_threads).run()
