"""The catch-up phase: what moved while a run walked, and all of a sync.

**The catch-up phase** (kind `catchup`, the plan's last phase; a sync has it too). A full run's
walks cover the snapshot; what moved while they walked - a row updated from one `update_time`
span into another the walker had passed, a note pushed across an offset boundary by a deletion,
a deal archived between the active and the archived lists, deletions, merges - is found here by
one inventory walk per kind, parents first (users, pipelines, stages, organizations, persons,
deals + archived deals, leads + archived leads, written one after another in one chain of tasks;
then activities and notes, which nothing links to, at once in a task each: `LAST_LEVEL`). Only the
writing needs that order: the chain's first page starts a read-ahead of every list of the walk at
once (`inventory.ReadAhead`, in this process, its pages held compact: the rows the ledger holds at
their version as {id, version}, `compact`, so a whole list of a large account is read ahead), and
each page is taken from it as the chain comes to it, so under latency the chain waits about as
long as its longest list's walk, not for every page of every list in turn. A page is still
asked once, in the walk's own sequence per list, and counted by the task that takes it. A row
that moved between two lists read at once could be in neither page, so the lists of one ledger
kind are read one after the other (archived deals once the deals' last page is read), as the chain
walks them. A page's rows are compared with the ledger in one query: rows the ledger lacks, holds
only as a placeholder, holds at an older version or holds as deleted are written through the
engine's write path (created, or updated in place with the ledger's history); which rows need
writing is the engine's rule (`inventory_ledger.to_write`); the rest cost nothing more. The
placeholders a full run's walks left to this walk (`walk_proof`: a parent not known then, not
asked) are settled here without a request: a parent the chain wrote links them; one its whole walk
did not serve is gone, and the row is imported with that link dangling (`writers.probe_of` with the
page, `LastParents` for the last level). Other missing parents are asked of the source as before;
what the catch-up writes is counted under the row's kind too (`catchup_stats.PerKindStats`). Every id served is
recorded in `migration_inventory`. When a ledger kind's lists are done, a `deletes` task takes the
kind's live ledger entries the inventory did not see, asks the source for each (`GET` by id: 1-2
tokens): 404 is a deletion (or a merge: Pipedrive's merged id answers 404 and its children were
re-pointed to the survivor, whose update moved them into this walk) and is marked
(`marks.mark_gone`); a row that answers is written as served (it moved between lists while the walk
passed). Changed deals with more mail than the product holds for them (`email_messages_count`
against crm.emails) get email tasks of ten deals (`emails.py`), so mail is fetched only for deals
whose mail changed (and only in runs that import mail); these tasks take over the run's own mail
placeholders (mail the emails phase skipped because its deal, created meanwhile, was not written
yet), and list once the mail of the deals that waited for this walk, which the emails phase left to
them (`walk_proof.mail_left_to_catchup`; a deal written by id in its `deletes` task gets its mail
task there). What a task owes for the rows it writes - their mail, a deal's product lines, a
record's per-record lists - is named in its cursor before they are written (`owed`): a task that
dies after the write and before those tasks are committed finds the rows written on its retry, no
longer changed nor waiting, and makes them all the same.

**A sync** (`runs.start_sync`, mode 'sync') is this phase: the provider seeds nothing else but
the field definitions, and the catch-up brings every change and deletion since the last succeeded
run's snapshot. Why one listing and not an `updated_since` listing plus an id listing: deletions
can only be found by a full id listing (Pipedrive has no list of deleted rows), and Pipedrive's
lists serve whole rows with their `update_time`, so that listing already carries every changed
row; an `updated_since` listing as well would list the changed rows twice (one call per kind at
least). With the run option `detect_deletes: false` a sync lists only what changed instead:
`updated_since` = the sync's `since` minus the snapshot margin on the v2 lists, notes and active
leads (`SINCE_KINDS`); files and archived leads, which take no such filter, newest first up to the
first page that reaches a row older than that (`NEWEST_FIRST`); users, pipelines and stages are
listed whole (short lists); no deletes tasks.
Instead, per ledger kind, the rows the ledger holds as skipped that this listing did not serve are
asked by id and written as served (`retake_skipped`): a skip is not final - the parent it waited
for may have been written since, while the row itself did not change. (A full listing serves
every skipped row the source still has, and `inventory_ledger.needs_write` takes placeholders over.)
A full run always walks the whole inventory: rows lost by its own walks (a shifted offset) have
not changed, so no `updated_since` listing would bring them, and a deletion (or a merge's merged
id) is in no `updated_since` listing. Nothing cheaper proves that nothing was deleted: the v2
lists carry no totals, the v1 pagination none either, `ids=` asks 100 ids for a page's 10 tokens
(5x a walk's cost per row), only deals have a count (`/v1/deals/summary` + `/archived`: 120 tokens,
more than walking both deal lists below ~5,000 deals; about 0.15% of the seed customer's tokens
saved above), and `/v1/recents` (one month, no leads, deletions undocumented) is no proof.
Measured with sandbox counters on an unchanged account: the whole walk costs 11 requests / 170
tokens on `tiny`, exactly what an `updated_since` listing of the same lists costs (every list is
one page either way), and 18 / 250 on `small` against 11 / 170 (0.7% of the run's 11,311 tokens);
at the seed customer's size about 800 requests / 10,000 tokens (~1.3%; estimated from its list
sizes) would be saved. A catch-up listing only what changed since the snapshot loses the note a
deletion shifted out of the notes' walk, the deletion and the merge (three of the six tests of
tests/pipedrive/test_live_listing.py fail against it), so the whole walk stays.

What the catch-up does not find: mail deleted at the source (mail is only ever added, by listing a
deal's messages) and field definitions (refreshed by every run's `fields` task). Rows changed
while the catch-up itself walks past them are the next sync's (their update time is after this
run's snapshot, which the next sync lists from).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from engine_core import inventory_ledger, marks, write
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.errors import PageFailed
from engine_core.ledger_reads import mail_held, unseen_live, unseen_skipped
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.source import snapshot_margin
from engine_core.providers.pipedrive import compact, contents, lines, owed, record_lists, retake, writers
from engine_core.providers.pipedrive.catchup_stats import counted_as
from engine_core.providers.pipedrive.earlier_kinds import earlier_kinds
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.inventory import ReadAhead, ask_ahead, list_step, path_of, row_id, version_of
from engine_core.providers.pipedrive.kinds import CATCHUP_ORDER as ORDER
from engine_core.providers.pipedrive.kinds import LAST_LEVEL, SINGLE_PATHS, ledger_kind
from engine_core.providers.pipedrive.mapping import MalformedRow, sound_id, unreadable_key
from engine_core.providers.pipedrive.meter import CountingClient, Meter
from engine_core.providers.pipedrive.stripes import rfc3339
from engine_core.providers.pipedrive.walk_proof import WALKED_LISTS, mail_left_to_catchup, proof_lists, settled_by_walk

CATCHUP = "catchup"
DEALS_PER_TASK = 10
# Pages a catch-up task walks (across its lists) before it hands on to a successor (`run_page`): a
# hand-over is a finish, a claim and a new task whose first page is fetched in line (~50 ms on the
# small account's chain, whose 11 pages took two tasks at 10: A/B of full small runs, catch-up phase
# median 1.27 -> 1.17 s at load 5-8); stops are still seen after every page.
PAGES_PER_TASK = 25


def detect_deletes(run: Run) -> bool:
    """The run option `detect_deletes` (default true; a full run always does)."""
    value = run.options.get("detect_deletes", True)
    if isinstance(value, str):
        value = value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value) or not run.is_sync


def changed_since(run: Run) -> str | None:
    """`updated_since` of a sync that does not detect deletes: its `since` minus the margin."""
    if detect_deletes(run) or run.since is None:
        return None
    return rfc3339(run.since - snapshot_margin(run))


def catchup_kinds(run: Run) -> list[str]:
    """The lists the catch-up walks, in walking order: the run's kinds, and - in a full run, not
    dry - the lists it walks only to settle parents (`proof_kinds`)."""
    proof = proof_kinds(run)
    return [k for k in ORDER if k in run.kinds or k in proof]


def proof_kinds(run: Run) -> tuple[str, ...]:
    """The lists a full run's catch-up (not dry) walks only to settle the parents its walks left to it
    (`walk_proof.proof_lists`); a sync's and a dry run's none (they ask the source instead)."""
    return () if run.is_sync or run.dry_run else proof_lists(run.kinds)


def catchup_seeds(run: Run) -> list[Successor]:
    """The catch-up's first task. A dry run's catch-up makes the same listing calls and writes
    nothing, not even dry (its walks wrote nothing to compare the source with; their report is
    the run's); it seeds no mail and no deletes tasks."""
    kinds = catchup_kinds(run)
    if not kinds:
        return []
    if kinds[0] in LAST_LEVEL:
        return [page_task(k, 0, {}) for k in kinds if k in LAST_LEVEL]
    return [page_task(kinds[0], 0, {})]


def page_task(kind: str, page: int, at: Mapping[str, Any]) -> Successor:
    """The catch-up task that walks `kind`'s list from page number `page` at position `at`; its
    id is `catchup:<kind>:p<page>`."""
    return Successor(f"{CATCHUP}:{kind}:p{page}", {"list": kind, "page": page, **at})


def _after_list(run: Run, kind: str) -> list[Successor]:
    """What follows a list's last page: the next list's first page (before the last level, every
    list of the last level: `LAST_LEVEL`; a list of the last level is followed by no list), and -
    when this was the last list of its ledger kind - that kind's deletes task."""
    kinds = catchup_kinds(run)
    i = kinds.index(kind) if kind in kinds else len(kinds)
    out: list[Successor] = []
    following = kinds[i + 1] if i + 1 < len(kinds) else None
    if following is not None and kind not in LAST_LEVEL:
        out.append(page_task(following, 0, {}))
        if following in LAST_LEVEL:
            out.extend(page_task(k, 0, {}) for k in kinds[i + 2 :] if k in LAST_LEVEL)
    if not run.dry_run and (following is None or ledger_kind(following) != ledger_kind(kind)):
        lk = ledger_kind(kind)
        if detect_deletes(run):
            out.append(Successor(f"{CATCHUP}:{lk}:deletes", {"deletes": lk}))
        else:
            # a listing of what changed only: the kind's skipped rows that did not change are not
            # in it, though the parent they waited for may be here now - asked by id instead
            out.append(Successor(f"{CATCHUP}:{lk}:skipped", {"deletes": lk, "placeholders": True}))
    return out


def mail_wanted(conn: Conn, run: Run, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Deals (source ids, ascending) among these written deal rows whose `email_messages_count`
    exceeds the mail the product holds for them (`ledger_reads.mail_held`), or is unknown."""
    counts = {row_id(r): r.get("email_messages_count") for r in rows if isinstance(r.get("id"), int)}
    counts = {sid: c for sid, c in counts.items() if sid and (c is None or (isinstance(c, int) and c > 0))}
    if not counts:
        return []
    held = mail_held(conn, run.tenant_id, run.source, list(counts))
    return sorted(int(sid) for sid, c in counts.items() if c is None or c > held.get(sid, 0))


def mail_tasks(kind: str, page: int, deals: Sequence[int]) -> list[Successor]:
    """Mail tasks for the deals (source ids) a catch-up page found with mail to fetch,
    `DEALS_PER_TASK` deals each, retaking this run's own placeholders (`retake`)."""
    return [
        Successor(f"{CATCHUP}:mail:{kind}:p{page}:c{j // DEALS_PER_TASK}",
                  {"deals": list(deals[j : j + DEALS_PER_TASK]), "retake": True})
        for j in range(0, len(deals), DEALS_PER_TASK)
    ]


def write_changed(ctx: TaskContext, client: PipedriveClient, mapper_of: Any, kind: str, lk: str,
                  rows: Sequence[dict[str, Any]], *, full: bool = False, proof: bool = False,
                  before: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Record the rows as seen, write those the ledger does not hold at their version; returns
    the rows written. Outcomes are also counted per listing kind (`catchup_stats.PerKindStats`); `full`: these
    rows are a page of the kind's whole list (not only what changed), so `listed@kind` and
    `unchanged@kind` are counted too (the source's count at the catch-up, for the rollup).
    `before(rows)`: called with the rows to write before any is written (`owed`: a retry finds
    them written at their version, so what they owe must be known before).

    `proof`: a list walked only to settle parents (`proof_kinds`: not a kind of the run) writes only the
    rows the ledger holds already (a deal the run wrote, archived since: what the kind's deletes
    task would have asked by id and written), counted under the run's own list of the ledger kind;
    its other rows are only recorded as seen, and it counts no `listed@`."""
    listed = [(row_id(r), r) for r in rows if isinstance(r, dict)]
    with ctx.db.connection() as conn:
        pairs = [(sid, version_of(kind, r)) for sid, r in listed if sid is not None]
        if proof:
            held = inventory_ledger.remember_and_compare(conn, ctx.run, lk, [sid for sid, _ in pairs])
            wanted = {sid for sid, version in pairs
                      if sid in held and inventory_ledger.needs_write(held[sid], version, ctx.run)}
        else:
            wanted = inventory_ledger.to_write(conn, ctx.run, lk, pairs)
    changed = [r for sid, r in listed if (sid is None and not proof) or sid in wanted]
    changed = compact.full_rows(ctx, client, kind, changed)  # a row read ahead compact: whole again
    if changed and before is not None:
        before(changed)
    ctx.stats.bump("inventory_listed", len(listed))
    ctx.stats.bump("unchanged", len(listed) - len(changed))
    credit = next(k for k in WALKED_LISTS[lk] if k in ctx.run.kinds) if proof else kind
    if full and not proof:
        ctx.stats.bump(f"listed@{kind}", len(listed))
        ctx.stats.bump(f"unchanged@{kind}", len(listed) - len(changed))
    if changed:
        ctx.offset = 0  # the page is listed again on a retry and compared again: never skip by offset

        def write() -> None:
            try:
                writers.write_page(ctx, changed, mapper_of(kind), kind=lk, client=client, walked=kind)
            except PageFailed:
                # raised once every window has committed: the few rows picked from this page (often
                # one malformed row failing again) failed alone, each with its reason in the ledger
                pass

        counted_as(ctx, credit, write)
    return changed


_readers: OrderedDict[tuple[str, int, str], ReadAhead] = OrderedDict()
_readers_lock = threading.Lock()
READERS_KEPT = 8  # runs whose catch-up lists a process reads ahead at once (the oldest is closed)


class LastParents:
    """The parents of the last level's rows to write (`LAST_LEVEL`: activities and notes, the
    rows the ledger holds as placeholders or at an older version when their page is read ahead),
    asked of the source while the chain still writes, so the last level's tasks find them answered
    (`writers.ask_source`, the catch-up's answers). The pages' parents are gathered and asked in
    one go whenever no page of the last level is being read (`ReadAhead.settled`): every list read
    to its end, or waiting for its walker - one question per parent kind (`ids=` lists of up to 100)
    instead of one per page. Only a cache: a parent not asked here is asked by its page's task, one
    asked here and written by the chain since is found in the ledger. Its requests are counted by
    the next last-level task that takes a page (`uncounted`)."""

    def __init__(self, ctx: TaskContext, client: Any, mapper_of: Any) -> None:
        self.ctx = ctx
        self.mapper_of = mapper_of
        self.reader: ReadAhead | None = None
        self._lock = threading.Lock()
        self._pending: set[writers.Pair] = set()
        self._counting = CountingClient(client)  # counts a request before it is sent
        self._counted = (0, 0)

    def arrived(self, kind: str, step: Any) -> None:
        """A page of `kind` is read ahead: its rows' unknown parents join the question."""
        if kind not in LAST_LEVEL:
            return
        pairs = self._unknown(kind, step.rows) if step.rows else []
        with self._lock:
            self._pending.update(pairs)
        if self.reader is not None and self.reader.settled(LAST_LEVEL):
            self.ask()

    def _unknown(self, kind: str, rows: Sequence[dict[str, Any]]) -> list[writers.Pair]:
        listed = [(row_id(r), r) for r in rows if isinstance(r, dict)]
        with self.ctx.db.connection() as conn:
            wanted = inventory_ledger.unwritten(conn, self.ctx.run, ledger_kind(kind),
                                                [(sid, version_of(kind, r)) for sid, r in listed if sid is not None])
        changed = [r for sid, r in listed if sid in wanted]
        if not changed:
            return []
        prepared = write.map_page(changed, self.mapper_of(kind), malformed=MalformedRow, raw_id=sound_id,
                                  raw_key=unreadable_key)
        unknown = write.unknown_parents(self.ctx, prepared)
        pairs = writers.askable(self.ctx.run, unknown, {}, earlier_kinds(self.ctx, unknown))
        # the parents the walk settles when the page is written are not asked (`walk_proof`)
        settled = settled_by_walk(self.ctx, kind, prepared, pairs, gone=False)
        return [p for p in pairs if p not in settled]

    def ask(self) -> None:
        """Ask the source about every parent gathered so far (one question a kind)."""
        with self._lock:
            pairs, self._pending = sorted(self._pending), set()
        if not pairs:
            return
        writers.ask_source(self._counting, pairs, writers.answers_key(self.ctx))

    def uncounted(self) -> tuple[int, int]:
        """The requests and tokens asked here (counted as they are sent) that no task counted yet,
        now counted."""
        with self._lock:
            spent = (self._counting.requests, self._counting.tokens)
            before, self._counted = self._counted, spent
        return spent[0] - before[0], spent[1] - before[1]


_parents: dict[tuple[str, int, str], LastParents] = {}


def reader_of(ctx: TaskContext, client: Any, kinds: Sequence[str], since: str | None, *, start: bool,
              mapper_of: Any = None) -> tuple[ReadAhead | None, LastParents | None]:
    """The run's `ReadAhead` of the catch-up's lists in this process and its `LastParents` (None
    when it has none; no `LastParents` for a dry run, which writes nothing); made - reading every list
    of the walk at once - when `start` (the chain's first page). Its requests go through the client
    `client` counts (`CountingClient.inner`); a page is counted by the task that takes it."""
    scope = (str(ctx.db.url), ctx.run.id, str(ctx.run.started_at))
    with _readers_lock:
        reader = _readers.get(scope)
        if reader is None and start:
            inner = client.inner if isinstance(client, CountingClient) else client
            # the lists of one ledger kind (deals, then archived deals) are read one after the other
            follows = {k: before for before, k in zip(kinds, kinds[1:]) if ledger_kind(k) == ledger_kind(before)}
            parents = None if ctx.run.dry_run or mapper_of is None else LastParents(ctx, inner, mapper_of)
            # pages held compact (`compact`): a whole list of a large account read ahead
            reader = _readers[scope] = ReadAhead(inner, kinds, since, step=compact.compacting(ctx, lambda m, k, a, s: list_step(m, k, a, s)),
                                                 ahead=compact.AHEAD,
                                                 follows=follows, arrived=parents.arrived if parents else None)
            if parents is not None:
                parents.reader = reader
                _parents[scope] = parents
            while len(_readers) > READERS_KEPT:
                old, closed = _readers.popitem(last=False)
                closed.close()
                _parents.pop(old, None)
        return reader, _parents.get(scope)


def run_page(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """Pages of the catch-up's inventory walk (module docstring): up to `PAGES_PER_TASK` pages in
    one task, walking on from a list's last page to the next list's first (a task a page would
    pay a claim, a finish, a top-up and the barrier's check per page). After each page but the task's last, the task moves its own cursor to the next page
    (`TaskContext.move_cursor`) in one transaction with the page's mail tasks and, after a ledger
    kind's last list, that kind's deletes task: a task that dies resumes at the page after the last
    one it finished, and the page it was on is listed and compared again (never skipped by offset);
    the page's follow-ups (mail, product lines, rechecks) are in its cursor before its rows are
    written, and made from there (`owed`)."""
    cursor = dict(ctx.task.cursor)
    kind = cursor["list"]
    lk = ledger_kind(kind)
    since = changed_since(ctx.run)
    kinds = catchup_kinds(ctx.run)
    first = int(cursor.get("page", 0)) == 0 and kind == kinds[0]
    if first:
        with ctx.db.transaction() as tx:
            inventory_ledger.forget_older(tx, ctx.run)
    # the chain's lists are read at once, written one after another (the last level: at once anyway)
    reader, parents = reader_of(ctx, client, kinds, since, start=first and kind not in LAST_LEVEL, mapper_of=mapper_of)
    meter = Meter(client, {}, ctx.cancel)
    walked = 0
    while True:
        page = int(cursor.get("page", 0))
        step = reader.take(kind, cursor, ctx.cancel) if reader is not None else None
        if step is None:
            step = list_step(meter, kind, cursor, since)
        elif isinstance(client, CountingClient):
            client.count(path_of(kind))
        walked += 1
        if step.after is not None:
            if reader is None or not reader.reading(kind):
                ask_ahead(client, kind, step.after, since)
        else:
            for nxt in _after_list(ctx.run, kind):
                listed = nxt.cursor.get("list")  # the lists walked next (here, or in tasks of their own)
                if listed is not None and (reader is None or not reader.reading(listed)):
                    ask_ahead(client, listed, {}, since)
        mailing = lk == "deals" and "emails" in ctx.run.kinds

        def owing(changed: list[dict[str, Any]]) -> None:
            due = owed.lists_due(ctx.run, lk, changed)
            if mailing:
                with ctx.db.connection() as conn:
                    due[owed.MAIL_DUE] = mail_wanted(conn, ctx.run, changed)
            owed.owe(ctx, cursor, due)

        if ctx.run.dry_run:
            ctx.stats.bump("inventory_listed", len(step.rows))
        else:
            write_changed(ctx, client, mapper_of, kind, lk, step.rows, full=since is None,
                          proof=kind in proof_kinds(ctx.run), before=owing)
        if parents is not None and kind in LAST_LEVEL:
            asked, tokens = parents.uncounted()  # the parents asked ahead (this page's waited for)
            ctx.stats.bump("requests", asked)
            ctx.stats.bump("tokens", tokens)
        successors: list[Successor] = []
        if mailing:
            deals = owed.owed(cursor, owed.MAIL_DUE)  # this page's, and a page that died here before
            if deals:
                ctx.stats.bump("mail_deals", len(deals))
                successors.extend(mail_tasks(kind, page, deals))
        if kind == "files" and step.after is None and contents.KIND in ctx.run.kinds and not ctx.run.dry_run:
            # the files list walked: the contents still to fetch (changed files, failed downloads)
            successors.append(Successor(contents.CATCHUP_DISCOVERY, {"contents": "discover"}))
        # a deal's products changed with it: its lines are listed again (lines.py), the deals the
        # kind's lists wrote together once they are walked (one `deal_ids` call per 100 deals)
        due = owed.owed(cursor, owed.LINES_DUE)  # this page's and the pages' before it
        if due and step.after is None and _last_of_kind(ctx.run, kind):
            successors.extend(lines.catchup_tasks(kind, page, due))
            due = []
        successors.extend(owed.rechecks(ctx.run, cursor, lk, kind, page))
        if step.after is None:
            after = _after_list(ctx.run, kind)
            first = next((s for s in after if s.cursor.get("list") is not None), None)
            if first is None or walked >= PAGES_PER_TASK:
                return TaskOutcome(tuple(successors + [_carrying(s, due) if s is first else s for s in after]))
            # the next list in this same task; the deletes task of a ledger kind done goes on the lane
            successors += [s for s in after if s is not first]
            following_page = _carrying(first, due)
        else:
            following_page = _carrying(page_task(kind, page + 1, step.after), due)
            if walked >= PAGES_PER_TASK:
                return TaskOutcome(tuple(successors + [following_page]))
        ctx.move_cursor(following_page.cursor, successors=successors)
        cursor = dict(following_page.cursor)
        kind = cursor["list"]
        lk = ledger_kind(kind)
        ctx.stop_point()  # after the move: a stop resumes at the next page, this page's successors made


def _last_of_kind(run: Run, kind: str) -> bool:
    """Whether `kind` is the last list of its ledger kind the run's catch-up walks."""
    kinds = catchup_kinds(run)
    following = kinds[kinds.index(kind) + 1] if kind in kinds and kinds.index(kind) + 1 < len(kinds) else None
    return following is None or ledger_kind(following) != ledger_kind(kind)


def _carrying(task: Successor, due: Sequence[int]) -> Successor:
    """`task` (the walk's next page) carrying the deals whose lines are still to list (`LINES_DUE`)."""
    return Successor(task.cursor_key, {**task.cursor, owed.LINES_DUE: list(due)}, task.kind) if due else task


def ask_by_id(ctx: TaskContext, client: PipedriveClient, lk: str, ids: Sequence[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """Ask the source for each of a ledger kind's `ids` by id (`SINGLE_PATHS`, 1-2 tokens each),
    one at a time with a stop point between: returns `(gone, present)` - the ids answered 404 (a
    deletion, or a merge: the merged id answers 404) in the order asked, and the rows that answered
    (`data`, a dict) as served. A body without a dict `data` is neither (nothing to write, no proof
    of deletion). Other errors (auth, budget, a 5xx the client gave up on) raise as the client
    raises them: the task is retried and asks again."""
    meter = Meter(client, {}, ctx.cancel)
    gone: list[str] = []
    present: list[dict[str, Any]] = []
    for sid in ids:
        ctx.stop_point()
        try:
            body = meter.get(SINGLE_PATHS[lk].format(sid))
        except NotFound:
            gone.append(sid)
            continue
        data = body.get("data")
        if isinstance(data, dict):
            present.append(data)
    return gone, present


def _settle(ctx: TaskContext, client: PipedriveClient, mapper_of: Any, lk: str,
            gone: Sequence[str], present: Sequence[dict[str, Any]]) -> list[Successor]:
    """Write the rows that answered as served; mark the ones gone deleted at the source, with the
    rows that go with them. The lists that may still serve rows naming a gone record
    (`record_lists.relist_of_gone`: a merged person's participations) get their rechecks first,
    created before anything is marked: a task that dies between asks again and finds them made.
    Returns the follow-ups of the rows written here, as a page of the walk makes its own: the mail
    tasks of the deals that waited for the walk (their mail is the catch-up's:
    `walk_proof.mail_left_to_catchup`), a deal's product lines listed again, a record's per-record
    lists read again; owed in the task's cursor before the write (`owed`)."""
    if present:
        # seen by the run once `write_changed` compares them, before they are written: a retry
        # no longer finds them unseen, so it asks again the ones named here (`_ask_and_settle`)
        owed.owe(ctx, ctx.task.cursor, {owed.ANSWERED: [i for i in map(row_id, present) if i is not None]})
        ids = {int(i) for i in map(row_id, present) if i is not None and i.isdigit()}
        left = mail_left_to_catchup(ctx, ids) if lk == "deals" and "emails" in ctx.run.kinds else set()

        def owing(changed: list[dict[str, Any]]) -> None:
            owed.owe(ctx, ctx.task.cursor, {**owed.lists_due(ctx.run, lk, changed),
                                            owed.MAIL_DUE: left & set(owed.record_ids(changed))})

        write_changed(ctx, client, mapper_of, lk, lk, present, before=owing)
    # these rows' follow-ups, or those of rows a retry no longer asks (written then)
    asked, deals = f"{lk}-asked", owed.owed(ctx.task.cursor, owed.MAIL_DUE)
    follow = mail_tasks(asked, 0, deals) if deals else []
    follow += lines.catchup_tasks(asked, 0, owed.owed(ctx.task.cursor, owed.LINES_DUE))
    follow += owed.rechecks(ctx.run, ctx.task.cursor, lk, asked, 0)
    if not gone:
        return follow
    relist = record_lists.relist_of_gone(ctx.db, ctx.run, lk, list(gone))
    if relist:
        ctx.move_cursor(dict(ctx.task.cursor), ctx.offset, successors=relist)
    with ctx.db.transaction() as tx:
        record_lists.mark_dependents_deleted(tx, ctx.run, lk, list(gone))  # a deal's followers, ...
        if lk == "deals":
            lines.mark_lines_of_deleted_deals(tx, ctx.run, gone)  # a deal's product lines
        ctx.stats.values["deleted_at_source"] = marks.mark_gone(tx, ctx.run, lk, list(gone))
    return follow


def retake_skipped(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """A ledger kind's skipped rows this catch-up's listing did not serve (a sync listing only what
    changed): each is asked by id (1-2 tokens) and written as served - a skip whose reason no
    longer holds (its parent written since) ends imported, one that still holds is skipped again
    with its reason; a row gone at the source (404) keeps its placeholder and is marked deleted at
    the source. Failed rows are not asked: a malformed row stays malformed until it changes, and
    the listing brings it then."""
    return _ask_and_settle(ctx, client, mapper_of, unseen_skipped, "skipped_asked")


def run_deletes(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """A ledger kind's entries (written, skipped or failed; not yet marked) the inventory did not
    see: 404 at the source -> marked deleted;
    a row that answers moved between lists meanwhile and is written as served. (With the cursor's
    `placeholders`: `retake_skipped` instead.)"""
    if ctx.task.cursor.get("placeholders"):
        return retake_skipped(ctx, client, mapper_of)
    return _ask_and_settle(ctx, client, mapper_of, unseen_live, "delete_candidates")


def _ask_and_settle(ctx: TaskContext, client: PipedriveClient, mapper_of: Any, unseen: Any, stat: str) -> TaskOutcome:
    """The task's ledger kind's entries `unseen` reads (`ledger_reads.unseen_live` or
    `unseen_skipped`), and those that answered an attempt of this task that died before writing
    them (`ANSWERED`), asked by id and settled (`_settle`); their number goes to stats[`stat`]."""
    lk = ctx.task.cursor["deletes"]
    run = ctx.run
    ids = sorted(set(unseen(ctx.db, run.tenant_id, run.source, lk, run.id)) | set(owed.owed(ctx.task.cursor, owed.ANSWERED)))
    gone, present = ask_by_id(ctx, client, lk, ids)
    ctx.stats.values[stat] = len(ids)
    follow = _settle(ctx, client, mapper_of, lk, gone, present)
    return TaskOutcome(tuple(follow + read_again(ctx, lk)))


def read_again(ctx: TaskContext, lk: str) -> list[Successor]:
    """Once ledger kind `lk` is written (its lists and the rows asked by id): the catch-up tasks
    reading again, through their fan-out, the rows of kinds it does not walk that were read before
    their `lk` parent was written (`retake`: one read per record listing them); their number goes
    to stats `retake_records`. None in a run whose placeholders all still miss a parent."""
    with ctx.db.connection() as conn:
        records = retake.records_to_read(conn, ctx.run, lk)
    ctx.stats.values["retake_records"] = sum(len(ids) for by in records.values() for ids in by.values())
    deals = records.get("emails", {}).get("deals", [])
    return retake.read_again(records, lk) + (mail_tasks(f"retake-{lk}", 0, deals) if deals else [])
