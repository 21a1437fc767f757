"""Writing a page of Pipedrive rows through the engine's write path (`engine_core/write.py`):
the provider maps its rows (`mapping`) and says how to ask the source about missing parents
(`ask_source`, the probe); the engine resolves the page's references in one ledger query and
writes it in windows (set-based statements for plain rows, a savepoint a row for the rest).

A row whose parents are not all in the ledger is skipped as "not linked to any record": a
placeholder that a later run importing the parent takes over. Owners, the people on a mail,
custom fields that point at records and a deal's pipeline and stage are softer references: linked
when found, empty when not.

Parents deleted at the source. Pipedrive keeps a child's `org_id` after the
organization was permanently deleted, and such a parent is never listed. In a full run the walks
before the catch-up do not ask: the row waits for the catch-up's walk (`probe_of` answers None,
`walk_proof`), whose whole listing proves the parent gone when it does not serve it - imported with
the link empty, no request. Where that proof does not hold (a sync, a dry run, a parent's kind the
catch-up does not walk first, a row changed since its walk), the proof that a parent does not
exist is the source itself: for each missing parent the ledger knows nothing about
(no created, matched, skipped or failed entry) of a kind this run or an earlier one imports (`earlier_kinds`), the page asks the
source once - organizations, persons and deals many at a time through their v2 lists' `ids`
(absent: does not exist; `ask_source`), many leads through the archived leads' list, leads,
pipelines and stages by `GET` by id, through the
provider's budgeted client, before the page's windows open and holding no database connection -
and remembers the answer for the run (`SourceAnswers`). 404 (or absent from the lists): the row is imported with that link empty, and the
dangling reference is kept on the product row (`dangling_refs`) and on its ledger entry
(`dangling`, counted per kind by `ledger_reads.dangling_counts`), with a reason `migrate explain` shows
("imported; org_id 42 does not exist at the source"). 200: the parent exists but is not
written (it failed, or its listing missed it), so the row stays a placeholder, saying so. A parent
that failed or was skipped, and a parent of a kind no run of the tenant imported, stay placeholders
without a request. Owners stay soft references.

One identity per source record: the archived lists' tasks write ledger kind
`deals` / `leads` (`kinds.ledger_kind`), so a deal listed by `/api/v2/deals` and again, archived
since, by `/api/v2/deals/archived` is one ledger entry and one product row. Archiving moves a
record's update time, so its second sighting is a newer version: `updated` in place (below), with
`archived_updated` in the task's stats; a sighting whose version cannot be ordered against the
written one (equal times) is `already_here` and only brings the archived flag up
(`crm.refresh_archived`).

Changes. Every row carries its source version (`Mapped.version`: `update_time` as
served, or a content hash); a written row seen again with a newer version is written over its
product row in place (`crm.update`, same record id, never a second row), outcome `updated`, the
previous values in the ledger's history (`ledger.write_once`). A matched row (the product's own
contact, company or user) is not overwritten unless the run option `overwrite_matched` is true.

In a dry run nothing is written (the engine rolls each row's savepoint back), so a parent that
this same run would have created earlier is not in the ledger; the engine remembers the dry run's
would-be writes (`ledger.dry_written`), and a parent found there counts as linked.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from engine_core import write
from engine_core.context import TaskContext
from engine_core.window import PageResult
from engine_core.models import Run
from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.earlier_kinds import earlier_kinds
from engine_core.providers.pipedrive.kinds import BATCH_PATHS, PAGE, PARENT_PATHS, V1_PATHS, ledger_kind
from engine_core.providers.pipedrive.meter import token_cost
from engine_core.providers.pipedrive.walk_proof import settled_by_walk, walk_settles
from engine_core.providers.pipedrive.paging import rows_of
from engine_core.providers.pipedrive.mapping import (MalformedRow, Mapped, sound_id,
                                                     unreadable_key)
from engine_core.write import (  # noqa: F401 - the engine's names, as this module always offered them
    DANGLING,
    NOT_LINKED,
    NOT_WRITTEN,
    Event,
    Mapper,
    Pair,
    ledger_refs,
    lookup,
    missing_parents,
)

class Getter(Protocol):
    """What the parent probe needs of the provider's client (`PipedriveClient.get`)."""

    def get(self, path: str, params: Mapping[str, Any] | None = None, *, cancel: Any = None) -> dict[str, Any]:
        """GET `path` with `params`; the response's JSON body. Raises NotFound for a 404."""
        ...


# A malformed row is recorded in the ledger under its id only when the id itself is sound.
_raw_id = sound_id


# --- parents deleted at the source -------------------------------------------------------------


class SourceAnswers:
    """What the source answered about parents, per run and in memory: `True` exists (200), `False`
    does not exist (404). Shared by the lane threads of a process; a few runs are kept."""

    RUNS_KEPT = 32

    def __init__(self) -> None:
        self._by_run: OrderedDict[tuple[str, int], dict[Pair, bool]] = OrderedDict()
        self._lock = threading.Lock()
        # parents being asked now, by one lane thread each: the others wait for its answer
        self._asking: dict[tuple[tuple[str, int], Pair], threading.Event] = {}

    def take(self, key: tuple[str, int], pair: Pair) -> threading.Event | None:
        """None: the caller asks the source about `pair` and then `put`s the answer or `drop`s the
        question; else the Event another thread sets when it has (wait, then `get`)."""
        with self._lock:
            if pair in self._by_run.get(key, {}):
                done = threading.Event()
                done.set()
                return done
            asking = self._asking.get((key, pair))
            if asking is not None:
                return asking
            self._asking[(key, pair)] = threading.Event()
            return None

    def drop(self, key: tuple[str, int], pair: Pair) -> None:
        """The caller's question failed: a waiting thread asks again itself."""
        with self._lock:
            asking = self._asking.pop((key, pair), None)
        if asking is not None:
            asking.set()

    def get(self, key: tuple[str, int], pairs: Iterable[Pair]) -> dict[Pair, bool]:
        """What this run (`key`: database url, run id) already heard about `pairs`: {pair: exists}."""
        with self._lock:
            known = self._by_run.get(key, {})
            return {p: known[p] for p in pairs if p in known}

    def put(self, key: tuple[str, int], pair: Pair, exists: bool) -> None:
        """Remember the source's answer about `pair` for the run `key` (the oldest run forgotten
        past RUNS_KEPT)."""
        with self._lock:
            self._by_run.setdefault(key, {})[pair] = exists
            self._by_run.move_to_end(key)
            while len(self._by_run) > self.RUNS_KEPT:
                self._by_run.popitem(last=False)
            asking = self._asking.pop((key, pair), None)
        if asking is not None:
            asking.set()


ANSWERS = SourceAnswers()


def askable(run: Run, pairs: Iterable[Pair], known: Mapping[Pair, str], held: Collection[str] = ()) -> list[Pair]:
    """Missing parents worth a request: unknown to the ledger, of a kind the run imports or an
    earlier run of the tenant took (`held`: `earlier_kinds`, whose docstring says why the others
    are not), and of a kind the source can be asked about by id."""
    imported = {ledger_kind(k) for k in run.kinds} | set(held)
    return sorted(p for p in pairs if p not in known and p[0] in imported and p[0] in PARENT_PATHS)


# Questions one page sends at once (each a request through the budgeted client, which paces them):
# enough for a page's every question to go in one round trip - the small account's largest page
# asks 14 (11 leads by id, one list per other kind) - so a page waits for its parents one round
# trip, not one per four questions.
PROBE_THREADS = 16

# Parents asked many at a time: the v2 lists that take `ids` - "comma separated string
# array of up to 100 entity ids to fetch ... If any of the requested entities do not exist or are not
# visible, they are not included in the response" (shared/pipedrive-openapi, v2 `GET /persons`,
# `/organizations`, `/deals`, `/deals/archived`). A deal may be archived, and archived deals are
# in no normal list (since 2025-07-15) while `GET /api/v2/deals/{id}` answers them: the ids the
# active list leaves out are asked of the archived list before they count as gone. Leads (v1 only),
# pipelines and stages take no `ids` and are asked by id (`PARENT_PATHS`); many leads at once are
# looked up in the archived leads' list (`LEADS_LIST_MIN`), and the ones it does not serve by id (a
# listing proves nothing about a lead created since it was taken: uuids have no order to bound it by).
IDS_MAX = 100  # the spec's cap on `ids` (the sandbox answers 400 beyond it, as a request the API refuses)
# A kind's parents asked by one `ids=` list rather than by id from this many on. Tokens: a list
# request costs 10 (`/deals/archived` 20), a record by id 1, so a batch of n < 10 spends more
# tokens than n GETs (and fewer requests: 1-2 instead of n).
BATCH_MIN = 2
# Leads take no `ids`: a question of this many leads or more reads the archived leads' list instead
# of a `GET` each (`_listed_leads`; the active leads are the run's own walk, written before any
# page that points at them). One page of 500 costs 40 tokens, a lead by id 2: from 10 leads on the
# list spends at most twice the tokens for one request instead of ten or more, and the leads it
# serves answer the run's later pages at no cost (the small account's activities and notes point
# at 17 archived leads: 17 requests in the walks and 17 again in the catch-up, now one list each).
LEADS_LIST_MIN = 10
LEADS_ARCHIVED = V1_PATHS["leads_archived"]


def _batchable(pair: Pair) -> bool:
    # only canonical positive integer ids go into `ids=` (any other id is asked by id on its own:
    # the source's answer to it stays its own, never a whole batch refused)
    kind, sid = pair
    return kind in BATCH_PATHS and sid.isdigit() and sid == str(int(sid)) and int(sid) > 0


def questions(pairs: Iterable[Pair], batch_min: int | None = None) -> list[list[Pair]]:
    """The requests that answer `pairs` (distinct, none answered yet): per kind of `BATCH_PATHS`
    with at least `batch_min` (default `BATCH_MIN`) ids, one question per `IDS_MAX` ids (one list
    request each; two for deals whose active list leaves some out); at least `LEADS_LIST_MIN` leads
    (and `batch_min`), one question (`_listed_leads`); every other pair one question of its own
    (`GET` by id)."""
    batch_min = BATCH_MIN if batch_min is None else batch_min
    by_kind: dict[str, list[Pair]] = {}
    out: list[list[Pair]] = []
    leads: list[Pair] = []
    for pair in pairs:
        if _batchable(pair):
            by_kind.setdefault(pair[0], []).append(pair)
        elif pair[0] == "leads":
            leads.append(pair)
        else:
            out.append([pair])
    if len(leads) >= max(batch_min, LEADS_LIST_MIN):
        out.append(sorted(leads))  # one question: the archived leads' list (`_listed_leads`)
    else:
        out.extend([p] for p in leads)
    for group in by_kind.values():
        if len(group) < max(batch_min, 2):
            out.extend([p] for p in group)
            continue
        group.sort(key=lambda p: int(p[1]))
        out.extend(group[i : i + IDS_MAX] for i in range(0, len(group), IDS_MAX))
    return out


def ask_source(client: Getter, pairs: Iterable[Pair], key: tuple[str, int], cancel: Any = None,
               answers: SourceAnswers = ANSWERS, threads: int | None = None) -> dict[Pair, bool]:
    """Whether each parent exists at the source, each asked once in this run (`SourceAnswers`):
    a kind's parents together through its v2 list's `ids` (`BATCH_PATHS`, `questions`; an id the
    list leaves out does not exist, one it serves does), the others by id (404 -> False, a record
    -> True). Any other failure (rate limit, server error after the client's retries) propagates
    and the page is retried like any failed fetch; the parents of a failed question are left to be
    asked again. Never call this holding a database connection or transaction.

    Up to `threads` (default `PROBE_THREADS`) questions are sent at once (a page of notes
    pointing at 25 deleted parents would otherwise wait for 25 round trips in a row), paced by the
    same budget, and a kind of several lists asks them at once (`_request`). When one question
    fails, the questions not yet sent are not sent and the first failure propagates."""
    pairs = list(pairs)
    out = answers.get(key, pairs)
    # the questions of two requests (deals: both lists) first, so none waits for a free thread
    todo = sorted(questions(p for p in dict.fromkeys(pairs) if p not in out), key=_requests_of, reverse=True)
    threads = PROBE_THREADS if threads is None else threads
    if len(todo) <= 1 or threads <= 1:
        for question in todo:
            out.update(_ask(client, question, key, cancel, answers))
        return out
    with ThreadPoolExecutor(max_workers=min(threads, len(todo)), thread_name_prefix="probe") as pool:
        futures = [pool.submit(_ask, client, question, key, cancel, answers) for question in todo]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
    failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    for f in futures:
        out.update(f.result())
    return out


def _ask(client: Getter, question: list[Pair], key: tuple[str, int], cancel: Any,
         answers: SourceAnswers) -> dict[Pair, bool]:
    """A question's answers: the parents no other lane thread is asking are asked of the source by
    this thread (one request, or a list's `ids`), the others awaited from the thread asking them
    (two pages on one deleted organization ask once: test_references' count); a parent whose
    asker failed is taken again."""
    out: dict[Pair, bool] = {}
    pending = list(question)
    while pending:
        mine: list[Pair] = []
        theirs: list[tuple[Pair, threading.Event]] = []
        for pair in pending:
            waiting = answers.take(key, pair)
            if waiting is None:
                mine.append(pair)
            else:
                theirs.append((pair, waiting))
        if mine:
            try:
                found = _request(client, mine, cancel)
            except BaseException:
                for pair in mine:
                    answers.drop(key, pair)
                raise
            for pair in mine:
                answers.put(key, pair, found[pair])
            for pair in found.keys() - set(mine):  # served beside them (`_listed_leads`): remembered
                answers.put(key, pair, found[pair])
            out.update((pair, found[pair]) for pair in mine)
        pending = []
        for pair, waiting in theirs:
            waiting.wait()
            known = answers.get(key, [pair])
            if pair in known:
                out[pair] = known[pair]
            else:
                pending.append(pair)  # the asker failed: take it again
    return out


def _requests_of(question: list[Pair]) -> int:
    """The requests a question makes (`_request`): one by id, else one per list of its kind."""
    return len(BATCH_PATHS.get(question[0][0], ("",))) if len(question) > 1 else 1


def _request(client: Getter, pairs: list[Pair], cancel: Any) -> dict[Pair, bool]:
    """Ask the source about `pairs` (one kind when more than one): by id for one, leads through
    their archived list (`_listed_leads`), else through the
    kind's lists' `ids` (`BATCH_PATHS`) - an id a list serves exists, one no list serves does not.
    A kind of several lists (deals: active and archived) asks them all at once with every id: one
    round trip, not two in a row, for the same requests whenever the first list leaves an id out
    (a parent the ledger misses is seldom an active deal: deleted or archived), one list request
    more when it serves them all. A list row whose id cannot be read (a malformed row: no id, a
    non-numeric one) may be any of the ids left: those are then asked by id, so the answers are
    the ones `GET` by id gives."""
    if len(pairs) == 1:
        return {pairs[0]: _exists(client, pairs[0], cancel)}
    kind = pairs[0][0]
    if kind == "leads":
        return _listed_leads(client, pairs, cancel)
    ids = {sid for _, sid in pairs}
    paths = BATCH_PATHS[kind]
    if len(paths) == 1:
        answers = [_served(client, paths[0], ids, cancel)]
    else:
        with ThreadPoolExecutor(max_workers=len(paths), thread_name_prefix="probe-list") as pool:
            futures = [pool.submit(_served, client, path, ids, cancel) for path in paths]
            wait(futures)
        answers = [f.result() for f in futures]  # the first list's failure, if any, propagates
    left = ids.difference(*(served for served, _ in answers))
    unreadable = any(unsure for _, unsure in answers)
    out = {pair: pair[1] not in left for pair in pairs}
    if unreadable:
        for pair in pairs:
            if pair[1] in left:
                out[pair] = _exists(client, pair, cancel)
    return out


def _listed_leads(client: Getter, pairs: list[Pair], cancel: Any) -> dict[Pair, bool]:
    """Whether these leads exist, from the archived leads' list (`LEADS_ARCHIVED`) read from its
    start, v1 offset pages of `PAGE`, until it served every one of them or its pages cost what
    asking them by id would (at least one page); the leads it did not serve are asked by id (an
    active lead written after the leads' walk, a deleted one: absent from both lists). The answer
    also holds every other lead the pages served (True: the run remembers them for later pages,
    whose archived leads are then answered without a request)."""
    wanted = {sid for _, sid in pairs}
    found: dict[Pair, bool] = {}
    pages = max(1, -(-len(wanted) * token_cost(PARENT_PATHS["leads"]) // token_cost(LEADS_ARCHIVED)))
    start = 0
    for _ in range(pages):
        body = client.get(LEADS_ARCHIVED, {"start": start, "limit": PAGE}, cancel=cancel)
        rows = rows_of(body, LEADS_ARCHIVED)
        for row in rows:
            value = row.get("id") if isinstance(row, dict) else None
            if isinstance(value, str) and value.strip():
                found[("leads", value.strip().lower())] = True
        extra = body.get("additional_data")
        paging = extra.get("pagination") if isinstance(extra, dict) else None
        more = isinstance(paging, dict) and paging.get("more_items_in_collection") is True
        if not more or not rows or wanted <= {sid for _, sid in found}:
            break
        following = paging.get("next_start") if isinstance(paging, dict) else None
        start = following if isinstance(following, int) and following > start else start + len(rows)
    for pair in pairs:
        if pair not in found:
            found[pair] = _exists(client, pair, cancel)
    return found


def _exists(client: Getter, pair: Pair, cancel: Any) -> bool:
    """`GET` the parent by id (`PARENT_PATHS`): a record -> True, 404 -> False."""
    kind, sid = pair
    try:
        client.get(PARENT_PATHS[kind].format(sid), cancel=cancel)
    except NotFound:
        return False
    return True


def _served(client: Getter, path: str, ids: set[str], cancel: Any) -> tuple[set[str], bool]:
    """Which of `ids` (at most `IDS_MAX`) the v2 list at `path` serves, asked through `ids`, and
    whether it served a row whose id cannot be read; a next cursor (a server paging below the ids'
    count) is followed."""
    params: dict[str, Any] = {"ids": ",".join(sorted(ids, key=int)), "limit": IDS_MAX}
    served: set[str] = set()
    unreadable = False
    while True:
        body = client.get(path, params, cancel=cancel)
        rows = rows_of(body, path)
        for row in rows:
            sid = _raw_id(row)
            if sid is None or not sid.isdigit():
                unreadable = True
            else:
                served.add(str(int(sid)))
        extra = body.get("additional_data")
        cursor = extra.get("next_cursor") if isinstance(extra, dict) else None
        if not cursor or cursor == params.get("cursor"):
            return served & ids, unreadable
        params = {**params, "cursor": cursor}


CATCHUP_KIND = "catchup"
def probe_of(ctx: TaskContext, client: Getter, *, kind: str | None = None,
             walked: Sequence[write.Prepared] | None = None) -> write.Probe:
    """The engine's probe for a Pipedrive page: parents unknown to the ledger, of kinds this run
    imports and the source answers by id, asked once per run through the budgeted `client` - and
    once more in the catch-up: "exists" is only true when asked (a parent created and deleted while
    the run walked answered it, and a row the catch-up writes must not stay a placeholder on it).

    `kind`: the page's listing kind (default the task's). A walk before the catch-up leaves the
    parents its catch-up settles (`walk_settles`) to it: answered None (`write.WAITS_FOR_WALK`), no request.
    `walked`: the page (mapped) is the catch-up's listing of `kind`: the parents its walk settles
    (`settled_by_walk`: gone, or served by a list the run walks only for that) are answered, no request."""
    key = answers_key(ctx)
    listing = kind or ctx.task.kind
    catchup = ctx.task.kind == CATCHUP_KIND

    def probe(pairs: list[Pair]) -> dict[Pair, bool | None]:
        asked = askable(ctx.run, pairs, {}, earlier_kinds(ctx, pairs))
        out: dict[Pair, bool | None] = {}
        if walked is not None:
            out.update(settled_by_walk(ctx, listing, walked, asked))
        elif not catchup:
            out.update((p, None) for p in asked if walk_settles(ctx.run, listing, p[0]))
        rest = [p for p in asked if p not in out]
        if rest:
            out.update(ask_source(client, rest, key, ctx.cancel))
        return out

    return probe


def answers_key(ctx: TaskContext) -> tuple[str, int]:
    """Where the run's answers about parents are kept (`SourceAnswers`): the database and run,
    apart for the catch-up, which asks again what the run's walks asked."""
    scope = f"{ctx.db.url}#{CATCHUP_KIND}" if ctx.task.kind == CATCHUP_KIND else ctx.db.url
    return scope, ctx.run.id


class MappedPages:
    """Pages mapped ahead of their task (`map_ahead`, `probe_ahead`), kept for the task that writes
    the very same rows (`write_page`) to take instead of mapping them again (a page of 500 rows:
    50-100 ms of CPU). A page is known by its rows' identity (the row objects the listing's answer
    holds, shared by the page asked ahead and the task that takes it). Each page is mapped once:
    its answer reaches every walker that asked for it (`reserve`: the first maps it), and a page
    its task has taken (or found absent) is not mapped ahead any more; a task taking a page being
    mapped waits for that mapping (at most `WAIT` seconds). The oldest past `KEPT` dropped."""

    KEPT = 16
    WAIT = 5.0
    MAPPING = "mapping"  # a page's state while the thread that reserved it maps it
    GONE = "gone"  # taken, or its mapping failed

    def __init__(self) -> None:
        # id(first row) -> (first row, rows, the mapping or MAPPING or GONE)
        self._pages: OrderedDict[int, tuple[Any, int, Any]] = OrderedDict()
        self._changed = threading.Condition()

    def _set(self, rows: Sequence[Any], state: Any) -> None:
        self._pages[id(rows[0])] = (rows[0], len(rows), state)
        self._pages.move_to_end(id(rows[0]))
        while len(self._pages) > self.KEPT:
            self._pages.popitem(last=False)
        self._changed.notify_all()

    def _state(self, rows: Sequence[Any]) -> Any:
        entry = self._pages.get(id(rows[0]))
        return entry[2] if entry is not None and entry[0] is rows[0] and entry[1] == len(rows) else None

    def reserve(self, rows: Sequence[Any]) -> bool:
        """True for the first caller about these very rows (it maps them, then `put`s the mapping, or
        `drop`s the page when that fails), False once they are being mapped, kept or taken."""
        if not rows:
            return False
        with self._changed:
            if self._state(rows) is not None:
                return False
            self._set(rows, self.MAPPING)
            return True

    def put(self, rows: Sequence[Any], prepared: list[write.Prepared]) -> None:
        """Keep `prepared`, the mapping of `rows` (a page, every row mapped from its first)."""
        if rows:
            with self._changed:
                self._set(rows, prepared)

    def drop(self, rows: Sequence[Any]) -> None:
        """The mapping of `rows` failed: its task maps them itself."""
        if rows:
            with self._changed:
                self._set(rows, self.GONE)

    def take(self, rows: Sequence[Any]) -> list[write.Prepared] | None:
        """The mapping kept for these very rows (the same objects, as many), once, waiting for one
        under way; else None (the taker maps the page itself). Either way the page is not mapped
        ahead after this."""
        if not rows:
            return None
        with self._changed:
            self._changed.wait_for(lambda: self._state(rows) is not self.MAPPING, timeout=self.WAIT)
            state = self._state(rows)
            self._set(rows, self.GONE)
        return state if isinstance(state, list) else None


MAPPED = MappedPages()


def map_ahead(rows: Sequence[Any], mapper: Mapper) -> list[write.Prepared] | None:
    """Map a listed page (its `rows`, by `mapper`) now, for the task that writes the very same rows
    to take (`MAPPED`, `write_page`); returns the mapping, or None when the page is being mapped,
    kept or taken already (`MappedPages.reserve`: never mapped twice). Pure CPU: no database, no
    request. Raises as the mapper does (the page is then left to its task)."""
    if not MAPPED.reserve(rows):
        return None
    try:
        prepared = write.map_page(rows, mapper, malformed=MalformedRow, raw_id=_raw_id, raw_key=unreadable_key)
    except BaseException:
        MAPPED.drop(rows)
        raise
    MAPPED.put(rows, prepared)
    return prepared


def probe_ahead(ctx: TaskContext, client: Getter, rows: Sequence[Any], mapper: Mapper, kind: str | None = None) -> None:
    """Ask the source now about the parents of a listed page (its `rows` of listing `kind`, default
    the task's, mapped by `mapper`) that a later task of `ctx.run` will write (`write_listed_page`):
    the ones its probe would ask (not those left to the catch-up: `walk_settles`), answered once for
    the run (`ask_source`), so that task finds them answered. Only once the phases of the page's
    parents are closed (else a parent still to be written would be asked). The mapping is kept for
    that task (`MAPPED`). Raises as `ask_source` does."""
    prepared = map_ahead(rows, mapper)
    if prepared is None:
        return  # mapped (and so asked about) by another arrival of the same page
    listing = kind or ctx.task.kind
    unknown = write.unknown_parents(ctx, prepared)
    pairs = [p for p in askable(ctx.run, unknown, {}, earlier_kinds(ctx, unknown)) if not walk_settles(ctx.run, listing, p[0])]
    if pairs:
        ask_source(client, pairs, answers_key(ctx))


def write_page(
    ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, *, kind: str | None = None, client: Getter | None = None,
    optimistic: bool = True, walked: str | None = None,
) -> PageResult:
    """Map a page here (`write.map_page` with Pipedrive's mappers and key rules), then hand it to
    the engine once (`write.write_mapped_page`): references resolved in one query, windows.

    `kind`: the ledger kind (default: the task kind's, `kinds.ledger_kind`). With a `client`, the
    page's parents that the ledger does not know are asked of the source first (`probe_of`).
    `walked`: the listing kind of a catch-up's page (its walk settles parents: `settled_by_walk`).
    `optimistic=False`: every row per row (the baseline)."""
    prepared = MAPPED.take(rows) if ctx.offset == 0 else None  # mapped ahead (`probe_ahead`)
    if prepared is None:
        prepared = write.map_page(rows, mapper, start=ctx.offset, malformed=MalformedRow, raw_id=_raw_id,
                                  raw_key=unreadable_key)
    probe = None
    if client is not None:
        probe = probe_of(ctx, client, kind=walked, walked=prepared if walked is not None else None)
    return write.write_mapped_page(ctx, prepared, kind=kind or ledger_kind(ctx.task.kind), probe=probe,
                                   optimistic=optimistic)


def write_listed_page(ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, client: Getter) -> PageResult:
    """A listing's page (`write_page`) whose missing parents are checked at the source through the
    provider's budgeted `client`: parents deleted there leave their rows imported, links empty."""
    return write_page(ctx, rows, mapper, client=client)


# --- field definitions -----------------------------------------------------------------------


def normal_definition(entity: str, item: dict[str, Any], position: int) -> dict[str, Any]:
    """A v2 (`field_code`, `field_name`) or v1 (`key`, `name`) field definition, normalised."""
    key = item.get("field_code") or item.get("key")
    name = item.get("field_name") or item.get("name")
    ftype = item.get("field_type")
    if not isinstance(key, str) or not key or not isinstance(name, str) or not isinstance(ftype, str):
        raise MalformedRow(f"{entity} field definition without key, name or type: {str(item)[:80]}")
    options = item.get("options")
    if options is not None and not isinstance(options, list):
        raise MalformedRow(f"{entity} field {key} has options that are not a list")
    is_custom = item.get("is_custom_field")
    if is_custom is None:  # v1: custom fields are the editable ones with a 40-hex key
        is_custom = bool(item.get("edit_flag")) and len(key) == 40
    return {
        "id": f"{entity}:{key}",
        "entity": entity,
        "field_key": key,
        "name": name,
        "field_type": ftype,
        "options": [{"id": o.get("id"), "label": o.get("label")} for o in options or [] if isinstance(o, dict)] or None,
        "subfields": item.get("subfields"),
        "is_custom": bool(is_custom),
        "position": int(item.get("order_nr", position)) if isinstance(item.get("order_nr", position), int) else position,
    }
