"""Per-record lists as kinds of the run: a deal's participants (`/v1/deals/{id}/participants`),
the followers of deals, persons and organizations (`/api/v2/{kind}/{id}/followers`) and a deal's
history (`/v1/deals/{id}/changelog`), mapped by `fanouts`.

Each is a fan-out - one listing per record - so each is opt-in (`kinds.Kind.default`): on the seed
customer's account participants cost about 620,000 tokens, followers 2,120,000, history 1,240,000
(the README's "Choosing the kinds").

**History from the changelog, not the flow.** `/v1/deals/{id}/changelog` (20 tokens) lists a
deal's field changes - every field, `stage_id` among them, with old and new value, time and actor
- 500 a page. `/v1/deals/{id}/flow` (40 tokens) serves the same field changes as `dealChange`
items mixed with notes, activities, files and mail the run already has, 100 a page by default: for
the same stage and field changes it costs at least twice the tokens. The changelog is the one.

**Discovery reads the ledger, not the source.** A kind's first task pages through the tenant's
written, live records of the ledger kinds it fans out over (deals; deals, persons and
organizations for followers), 500 ids a task, and seeds tasks of `RECORDS_PER_TASK` records
(`{"of": "deals", "records": [ids]}`, keyed by the first id, so a retried discovery finds its
tasks there). No request: the run has just written those records, and a record that is not
written could not hold its rows anyway (they would be skipped as not linked). A dry run adds the
records it would have written.

**A task** (`RecordListTask`), the shape of the email phase's: its offset is the index of the first
of its records not finished, so everything before it is written. It works in rounds of up to
`FETCH_THREADS` page requests (at most the budget's lease), reserved on the task's thread and run on
fetch threads that hold no database connection; a round is joined before anything is written. The
records finished in a row from the offset are then written as one page through the engine's one
write path (`write.write_mapped_page`: references through the ledger, windows, the checkpoint -
the index after them - inside the last window). A record whose list answers 403 while the token
reads the account (`paging.settle_refusals`) is that record's outcome: kept beside the ledger
under its kind and key "deal <id>" ("person <id>", "organization <id>") with the reason, counted
`records_unreachable`; the run goes on. 404 (the record deleted since it was written): no rows,
a warning; the catch-up marks the record itself. An answer that cannot be read is kept the same
way with its reason. A token refused (401, or 403 on `/v1/users/me`) stops the task as ever.

**The catch-up** (`catchup_tasks`): records the catch-up writes because they changed (created, or
a newer `update_time`) get their lists read again in tasks of its own (`{"fanout": kind, "recheck":
true}`), in runs and syncs that take the kind. A recheck also marks the rows the record's list no
longer serves deleted at the source (`marks.Marks`: a participant removed, a user who
stopped following). What it does not see: a list that changes without its record's `update_time`
moving (Pipedrive does not move a deal's update time when a follower is added) waits for a change
of the record, or a run of the kind. A person gone (404: deleted, or merged - its participations
then re-pointed to the survivor) gets its participations' deals rechecked (`relist_of_gone`), not
its participations marked.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine_core import holdings
from engine_core.budget import Budget
from engine_core.context import TaskContext
from engine_core.errors import RateLimitParked, TaskStopped
from engine_core.marks import Marks, Unreadable, write_marks
from engine_core.models import Successor, TaskOutcome
from engine_core.providers.pipedrive import fanouts, writers
from engine_core.providers.pipedrive.paging import Page, item_scope, settle_refusals
from engine_core.providers.pipedrive.errors import BadResponse, ItemRefused, PipedriveError
from engine_core.providers.pipedrive.kinds import CURSOR, OFFSET, PAGE, kind as kind_entry
from engine_core.providers.pipedrive.mapping import KINDS_OF_REF, MalformedRow, Mapped, sound_id, unreadable_key
from engine_core.write import Prepared, write_mapped_page

FETCH_THREADS = 4  # page requests in flight per task, as the email phase's
RECORDS_PER_TASK = 20  # records a task lists: five rounds of four
DISCOVER_PAGE = 500  # ledger ids a discovery task reads
TOUCH_EVERY = 15.0  # seconds between lock refreshes while rounds run without a commit
WORD = {"deals": "deal", "persons": "person", "organizations": "organization"}


@dataclass(frozen=True)
class Family:
    """One per-record kind: `kind` (its plan and ledger kind), `of` (the ledger kinds of the
    records it lists for, in discovery order), `paging` ("offset" or "cursor": the spec's),
    `table` (its crm table) and `mapper(row, tenant_id, of, record source id) -> Mapped`."""

    kind: str
    of: tuple[str, ...]
    paging: str
    table: str
    mapper: Callable[[Any, str, str, str], Mapped]

    def path(self, of: str, record: int | str) -> str:
        """The record's list path, from the kind's entry (`kinds.py`): `/v1/deals/7/participants`,
        `/api/v2/persons/7/followers`."""
        template = kind_entry(self.kind).path
        return template.format(of, record) if template.count("{}") == 2 else template.format(record)


FAMILIES: dict[str, Family] = {
    "participants": Family("participants", ("deals",), OFFSET, "deal_participants",
                           lambda row, tenant, of, sid: fanouts.map_participant(row, tenant, sid)),
    "followers": Family("followers", ("deals", "persons", "organizations"), CURSOR, "followers", fanouts.map_follower),
    "deal_history": Family("deal_history", ("deals",), CURSOR, "deal_history",
                           lambda row, tenant, of, sid: fanouts.map_deal_change(row, tenant, sid)),
}


# --- pages ---------------------------------------------------------------------------------


def page_of(body: Any, path: str, paging: str, position: Any) -> Page:
    """One answered page of a record's list: its rows and where the next starts (`next_start` for
    offset paging, `next_cursor` for cursor paging). Raises BadResponse for data that is not a
    list, or a next position that does not advance."""
    data = body.get("data") if isinstance(body, dict) else None
    if data is None:
        data = []
    if not isinstance(data, list):
        raise BadResponse("data is not a list", method="GET", path=path, status=200)
    extra = body.get("additional_data") if isinstance(body, dict) else None
    extra = extra if isinstance(extra, dict) else {}
    if paging == CURSOR:
        cursor = extra.get("next_cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise BadResponse("next_cursor is not a string", method="GET", path=path, status=200)
        if cursor and cursor == position:
            raise BadResponse("the next cursor repeats this page's", method="GET", path=path, status=200)
        return Page(rows=tuple(data), next_cursor=cursor or None, more=bool(cursor))
    pagination = extra.get("pagination") if isinstance(extra.get("pagination"), dict) else extra
    if not pagination.get("more_items_in_collection"):
        return Page(rows=tuple(data))
    start = int(position or 0)
    nxt = pagination.get("next_start", start + len(data))
    if not isinstance(nxt, int) or isinstance(nxt, bool) or nxt <= start:
        raise BadResponse("next_start does not advance", method="GET", path=path, status=200)
    return Page(rows=tuple(data), next_start=nxt, more=True)


def fetch_page(client: Any, family: Family, of: str, record: int, position: Any = None, *,
               cancel: Any = None, reservation: Any = None) -> Page:
    """One page of a record's list (`position`: the offset or cursor; None: the first page),
    `PAGE` rows. 403/404 raise `ItemRefused` (`paging.item_scope`: the record's, once
    `settle_refusals` has cleared the token); other errors as the client raises them."""
    path = family.path(of, record)
    params: dict[str, Any] = {"limit": PAGE}
    if family.paging == OFFSET:
        params["start"] = int(position or 0)
    elif position:
        params["cursor"] = position
    with item_scope(path):
        body = client.get(path, params, cancel=cancel, reservation=reservation)
    return page_of(body, path, family.paging, position)


def list_rows(client: Any, family: Family, of: str, record: int, cancel: Any = None) -> list[Any]:
    """Every row of a record's list, page after page (verify's listing); raises as `fetch_page`."""
    rows: list[Any] = []
    position: Any = None
    while True:
        page = fetch_page(client, family, of, record, position, cancel=cancel)
        rows.extend(page.rows)
        if not page.more:
            return rows
        position = page.next_start if family.paging == OFFSET else page.next_cursor


# --- discovery -----------------------------------------------------------------------------


def seeds(kind: str) -> list[Successor]:
    """The first task of a per-record kind: the discovery of its first record kind."""
    of = FAMILIES[kind].of[0]
    return [Successor(f"{kind}:discover:{of}:0", {"discover": of, "after": 0})]


def discover(ctx: TaskContext) -> TaskOutcome:
    """One page of the tenant's written records of `cursor["discover"]` after `cursor["after"]`
    (ledger ids, module docstring): tasks of `RECORDS_PER_TASK` records, then the next page, or
    the family's next record kind. No request is made."""
    family = FAMILIES[ctx.task.kind]
    of, after = ctx.task.cursor["discover"], int(ctx.task.cursor.get("after", 0))
    ids = holdings.written_after(ctx.db, ctx.run, of, after, DISCOVER_PAGE)
    ctx.stats.bump("records_found", len(ids))
    out = [Successor(f"{family.kind}:{of}:{ids[i]}", {"of": of, "records": ids[i:i + RECORDS_PER_TASK]})
           for i in range(0, len(ids), RECORDS_PER_TASK)]
    if len(ids) == DISCOVER_PAGE:
        out.append(Successor(f"{family.kind}:discover:{of}:{ids[-1]}", {"discover": of, "after": ids[-1]}))
    elif family.of.index(of) + 1 < len(family.of):
        nxt = family.of[family.of.index(of) + 1]
        out.append(Successor(f"{family.kind}:discover:{nxt}:0", {"discover": nxt, "after": 0}))
    return TaskOutcome(tuple(out))


def lists_records_of(run_kinds: Iterable[str], of: str) -> bool:
    """Whether a per-record kind the run takes lists the records of ledger kind `of`."""
    return any(family.kind in run_kinds and of in family.of for family in FAMILIES.values())


def catchup_tasks(run_kinds: Iterable[str], of: str, listed_as: str, page: int,
                  records: Sequence[int]) -> list[Successor]:
    """The catch-up's rechecks of the records of ledger kind `of` it wrote (`records`: their source
    ids; `listed_as`, `page`: where, for the tasks' keys, so a page listed again finds them there):
    one task of `RECORDS_PER_TASK` records per per-record kind the run takes that lists `of`'s records."""
    ids = sorted({int(r) for r in records})
    out: list[Successor] = []
    for family in FAMILIES.values():
        if family.kind not in run_kinds or of not in family.of or not ids:
            continue
        for i in range(0, len(ids), RECORDS_PER_TASK):
            out.append(Successor(f"{family.kind}:{listed_as}:{page}:{i // RECORDS_PER_TASK}",
                                 {"fanout": family.kind, "of": of, "records": ids[i:i + RECORDS_PER_TASK],
                                  "recheck": True}))
    return out


# --- the task --------------------------------------------------------------------------------


@dataclass
class Ask:
    """A page request of a round: record index in the task and where its page starts."""

    index: int
    position: Any = None


class RecordListTask:
    """One task of a per-record kind (module docstring): `cursor["records"]` (source ids of ledger
    kind `cursor["of"]`), listed `fetch_threads` pages a round within the budget's lease, written a
    finished run of records at a time; the offset is the first record not finished."""

    def __init__(self, ctx: TaskContext, client: Any, budget: Budget | None, pool: ThreadPoolExecutor, *,
                 fetch_threads: int = FETCH_THREADS) -> None:
        cursor = ctx.task.cursor
        self.ctx, self.client, self.budget, self.pool = ctx, client, budget, pool
        self.family = FAMILIES[cursor.get("fanout") or ctx.task.kind]
        self.kind = self.family.kind
        self.of = cursor["of"]
        self.records = [int(r) for r in cursor.get("records", [])]
        self.recheck = bool(cursor.get("recheck"))
        self.per_round = max(1, min(fetch_threads, budget.lease_size())) if budget is not None else fetch_threads
        self.offset = min(ctx.offset, len(self.records))
        self.asks: deque[Ask] = deque(Ask(i) for i in range(self.offset, len(self.records)))
        self.rows: dict[int, list[Any]] = {}
        self.finished: set[int] = set()
        self.refused: dict[int, str] = {}  # record index -> why its list cannot be read
        self._touched = time.monotonic()

    def run(self) -> TaskOutcome:
        """List and write every record from the offset on. Raises TaskStopped, RateLimitParked or a
        PipedriveError after writing the records finished."""
        try:
            while self.asks:
                if self.ctx.should_stop():
                    raise TaskStopped()
                if time.monotonic() - self._touched >= TOUCH_EVERY:
                    self.ctx.touch()
                    self._touched = time.monotonic()
                self.round()
                self.commit()
        except (TaskStopped, RateLimitParked, PipedriveError):
            self.commit()  # nothing is in flight: keep what is finished
            raise
        self.commit()
        return TaskOutcome()

    def round(self) -> None:
        """Up to `per_round` page requests, reserved here, run on the pool, all joined; refusals
        settled on this thread (`settle_refusals`); raises the first failure after taking the rest."""
        asks = [self.asks.popleft() for _ in range(min(self.per_round, len(self.asks)))]
        try:
            reservation = self.budget.reserve(len(asks), cancel=self.ctx.cancel, deferred=True) if self.budget else None
        except BaseException:
            self.asks.extendleft(reversed(asks))
            raise
        try:
            futures: list[Future] = [self.pool.submit(fetch_page, self.client, self.family, self.of,
                                                      self.records[a.index], a.position, cancel=self.ctx.cancel,
                                                      reservation=reservation) for a in asks]
            if reservation is not None:
                reservation.serve(futures)  # the fetch threads' budget business runs here
            answers: list[tuple[Ask, Any]] = []
            for a, f in zip(asks, futures):
                try:
                    answers.append((a, f.result()))
                except BaseException as e:  # noqa: BLE001 - every request is joined before raising
                    answers.append((a, e))
        finally:
            if reservation is not None:
                reservation.release()
        refusals = [e for _, e in answers if isinstance(e, ItemRefused) and e.status == 403]
        if refusals:
            try:
                settle_refusals(self.client, refusals, cancel=self.ctx.cancel)
            except BaseException:
                self.asks.extendleft(reversed([a for a, e in answers if not isinstance(e, Page)]))
                raise
        fatal: BaseException | None = None
        again: list[Ask] = []
        for a, answer in answers:
            sid = self.records[a.index]
            if isinstance(answer, Page):
                self.rows.setdefault(a.index, []).extend(answer.rows)
                if answer.more:
                    again.append(Ask(a.index, answer.next_start if self.family.paging == OFFSET else answer.next_cursor))
                else:
                    self.finished.add(a.index)
            elif isinstance(answer, ItemRefused) and answer.status == 404:
                self.ctx.log.note("warning", self.kind, f"{WORD[self.of]} not found at the source (deleted since it "
                                  "was written): its list is not read", subject=f"{WORD[self.of]} {sid}")
                self.rows.pop(a.index, None)
                self.finished.add(a.index)
            elif isinstance(answer, (ItemRefused, BadResponse)):
                self.refused[a.index] = _why(answer)
                self.rows.pop(a.index, None)
                self.finished.add(a.index)
            else:
                fatal = fatal or answer
                again.append(a)
        self.asks.extendleft(reversed(again))  # a record's next page before other records
        if fatal is not None:
            raise fatal

    def commit(self) -> None:
        """Write the records finished in a row from the offset (`write_mapped_page`, the offset
        after them checkpointed in the last window); records refused are kept with their reason,
        a recheck's rows no longer served are marked deleted at the source."""
        start = end = self.offset
        while end < len(self.records) and end in self.finished:
            end += 1
        if end == start:
            return
        ctx, run = self.ctx, self.ctx.run
        prepared: list[Prepared] = []
        served: dict[int, set[str]] = {}
        for i in range(start, end):
            sid = str(self.records[i])
            mapper = _bound(self.family, run.tenant_id, self.of, sid)
            mine = [Prepared.of(row, mapper, malformed=MalformedRow, raw_id=sound_id, raw_key=unreadable_key)
                    for row in self.rows.get(i, ())]
            served[i] = {p["id"] for p in mine if p["id"] is not None}
            prepared += mine
        if self.refused.keys() & set(range(start, end)) or self.recheck:
            self._settle(start, end, served)
        if prepared:
            write_mapped_page(ctx, prepared, kind=self.kind, probe=writers.probe_of(ctx, self.client),
                              resume_from=0, offset_after=lambda e: end if e >= len(prepared) else start,
                              fail_if_all_failed=False)
        else:
            with ctx.db.transaction() as tx:
                ctx.checkpoint(tx, end)
        ctx.stats.bump("records", end - start)
        for i in range(start, end):
            self.rows.pop(i, None)
        self.offset = end
        self._touched = time.monotonic()

    def _settle(self, start: int, end: int, served: dict[int, set[str]]) -> None:
        """Before the rows of records start..end are written: the refused records kept with their
        reason (`marks.Unreadable`, kind and key "deal <id>"), and on a recheck the rows a
        listed record no longer serves marked deleted at the source, in one transaction."""
        ctx, run = self.ctx, self.ctx.run
        refused = {i: why for i, why in self.refused.items() if start <= i < end}
        for i, why in refused.items():
            ctx.log.note("error", self.kind, why, subject=f"{WORD[self.of]} {self.records[i]}")
        listed = [i for i in range(start, end) if i not in refused]
        marks = Marks(unreadable=[Unreadable(self.kind, f"{WORD[self.of]} {self.records[i]}", why,
                                             f'{{"{self.of}_id": {self.records[i]}}}') for i, why in refused.items()])
        with ctx.db.transaction() as tx:
            if refused:
                ctx.stats.bump("records_unreachable", len(refused))
            if self.recheck and listed:
                held = held_rows(tx, run, self.family, self.of, [str(self.records[i]) for i in listed])
                marks.add_gone(self.kind, [s for i in listed for s in held.get(str(self.records[i]), ()) if s not in served[i]])
            marked = write_marks(tx, run, marks)
            if marks.gone.get(self.kind):
                ctx.stats.bump("deleted_at_source", marked)


def held_rows(conn: Any, run: Any, family: Family, of: str, records: Sequence[str]) -> dict[str, list[str]]:
    """Record source id -> the source ids of the family's live rows (not marked deleted at the
    source) the product holds under it, found through the ledger's record and the table's parent
    column (`fanouts.FOLLOWED`, `holdings.rows_under`)."""
    column, word = fanouts.FOLLOWED[of]
    return holdings.rows_under(conn, run, family.table, column, KINDS_OF_REF[word], records)


def _bound(family: Family, tenant: str, of: str, sid: str) -> Callable[[Any], Mapped]:
    return lambda row: family.mapper(row, tenant, of, sid)


def _why(error: BaseException) -> str:
    if isinstance(error, ItemRefused):
        detail = f" ({error.detail})" if error.detail else ""
        return (f"the record's list cannot be read: the source answered HTTP {error.status}{detail} while the token "
                "reads the account - not visible to this token's user; none of its rows is fetched")
    return f"the record's list cannot be read: the source's answer is malformed ({error})"


def run_list_task(ctx: TaskContext, client: Any, budget: Budget | None, *, fetch_threads: int = FETCH_THREADS) -> TaskOutcome:
    """Run one task of a per-record kind (`RecordListTask`) with its own pool of `fetch_threads`
    fetchers; raises as `RecordListTask.run`."""
    with ThreadPoolExecutor(max_workers=fetch_threads, thread_name_prefix=f"list-{ctx.task.id}") as pool:
        return RecordListTask(ctx, client, budget, pool, fetch_threads=fetch_threads).run()


def source_ids(meter: Any, kind: str, records: Iterable[tuple[str, int]]) -> Iterator[tuple[str, str | None]]:
    """Every row id (and version) the source lists now for a per-record kind, over `records`
    ((ledger kind, source id) of every record the source lists): each record's whole list,
    through `meter` (counted). A record refused with 403 while the token reads the account goes
    to `meter.unreachable` ("deal 12" -> reason; verify tells it unreachable, not missing); a 404
    (deleted since listed) has no rows. Rows the mapper refuses are not listed."""
    family = FAMILIES[kind]
    for of, record in records:
        try:
            rows = list_rows(meter, family, of, record, cancel=meter.cancel)
        except ItemRefused as e:
            if e.status == 403:
                settle_refusals(meter.client, [e], cancel=meter.cancel)
                meter.unreachable[f"{WORD[of]} {record}"] = (_why(e), [])
            continue
        for row in rows:
            try:
                mapped = family.mapper(row, "", of, str(record))
            except MalformedRow:
                continue
            yield mapped.source_id, mapped.version


# The rows that go with a record: (kind, crm table, the column naming the record), per ledger kind.
DEPENDENTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "deals": (("participants", "deal_participants", "deal_id"), ("followers", "followers", "deal_id"),
              ("deal_history", "deal_history", "deal_id")),
    "persons": (("followers", "followers", "contact_id"),),
    "organizations": (("followers", "followers", "company_id"),),
}

# Rows of a record gone (404) that may live on under another record: a person's participations. A
# person answers 404 when deleted and when merged, and a merge re-points its participations to the
# survivor (same participant id), so they are not marked with the person: their deals' lists are
# read again (a recheck), which writes them as served and marks the ones no longer served.
# Record kind -> (family, crm table, column naming the record, column naming the listed record, its table).
RELISTED: dict[str, tuple[str, str, str, str, str]] = {
    "persons": ("participants", "deal_participants", "contact_id", "deal_id", "deals"),
}


def mark_dependents_deleted(tx: Any, run: Any, of: str, records: Sequence[str]) -> int:
    """Before the catch-up marks records of ledger kind `of` deleted at the source (404): the
    per-record rows that go with them - a deal's participants, followers and history, a person's
    and an organization's followers - marked deleted too (a person's participations are read
    again instead: `relist_of_gone`)
    (`marks.write_marks`), as the source no longer lists them. Returns how many were marked."""
    if of not in DEPENDENTS or not records:
        return 0
    word = fanouts.FOLLOWED[of][1]
    marks = Marks()
    for kind, table, column in DEPENDENTS[of]:
        under = holdings.rows_under(tx, run, table, column, KINDS_OF_REF[word], [str(sid) for sid in records])
        marks.add_gone(kind, [sid for rows in under.values() for sid in rows])
    return write_marks(tx, run, marks)


def relist_of_gone(conn: Any, run: Any, of: str, records: Sequence[str]) -> list[Successor]:
    """When the catch-up finds records of ledger kind `of` gone (404): rechecks (`catchup_tasks`'
    shape, `RECORDS_PER_TASK` records each) of the records whose lists hold rows naming them
    (`RELISTED`: the deals of a gone person's participations), in a run that takes the family;
    none otherwise - those rows are left as they are, not marked, as a 404 does not tell a merge
    (rows re-pointed, still served) from a deletion."""
    if of not in RELISTED or not records:
        return []
    kind, table, column, parent_column, parent = RELISTED[of]
    if kind not in run.kinds:
        return []
    deals = holdings.parents_of_rows_under(conn, run, table, column, KINDS_OF_REF[fanouts.FOLLOWED[of][1]],
                                           [str(sid) for sid in records], parent_column, parent)
    ids = sorted(int(d) for d in deals if d.isdigit() and int(d) > 0)
    return [Successor(f"{kind}:{of}-gone:{ids[i]}", {"fanout": kind, "of": parent, "records": ids[i:i + RECORDS_PER_TASK],
                                                     "recheck": True})
            for i in range(0, len(ids), RECORDS_PER_TASK)]
