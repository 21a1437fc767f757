"""The source's inventory: every id Pipedrive lists now, walked so that no row hides.

`source_ids(meter, kind)` walks a kind's cheapest full listing - the list endpoint itself, 500
rows a call (Pipedrive has no id-only listing: v1 and v2 lists both carry whole rows) - and yields
`(source id, version)`, the version being the string the ledger keeps (`mapping.source_version`:
`update_time` as served, users' `modified`). Each request is counted into the meter's cost
(`meter.py`). `emails` lists the deals (both lists, with `email_messages_count`) and the mail of
each deal that has any; `file_contents` downloads each file as the migration does
(`contents.fetch`) and hashes it; `fields` and the catch-up kind are not listed
(NotImplementedError). Verify reads it (`Provider.source_ids`); the catch-up phase
(`catchup.py`) walks the same lists page by page (`list_step`), its pages read ahead, every list
at once (`ReadAhead`).

**Walking a list that changes under it.** v2 lists are walked by cursor in id order: a cursor
names the last row served, so deletions and updates elsewhere do not move it. v1 lists (users,
leads, archived leads, notes, files) have only offsets, and a row deleted before the current
offset shifts every later row one place back. The walk here is sequential and overlapping
(`v1_step`): each page is asked from OVERLAP rows (at most half the last page) before where the
last one ended and must contain one of the last ids served; the rows after it are new. When
none is there - more than OVERLAP rows vanished before the offset meanwhile - it steps back a
page and looks again (at offset 0 everything it serves counts as new). Rows inserted before the
offset shift the other way and are only served twice. So a row present for the whole walk is
served at least once.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engine_core.providers.pipedrive import contents, lines, mapping, record_lists
from engine_core.providers.pipedrive.errors import ItemRefused
from engine_core.providers.pipedrive.kinds import (NEWEST_FIRST, PAGE, PARAMS, SINCE_KINDS, V1_PATHS, V2_PATHS,
                                                   VERSION_FIELD, page_of)
from engine_core.providers.pipedrive.mail import message_or_item, sound_message_id
from engine_core.providers.pipedrive.meter import Meter
from engine_core.providers.pipedrive.paging import settle_refusals
from engine_core.providers.pipedrive.prefetch import answer_of

log = logging.getLogger(__name__)

OVERLAP = 25  # rows each v1 page re-asks before the last one's end (deletions it absorbs)


def row_id(row: Any) -> str | None:
    """A listed row's source id as the ledger keys it: an integer id as its decimal string, a
    string id (a lead's UUID) stripped and lower-cased; None when the row has no usable id
    (missing, empty, a boolean, not a dict)."""
    value = row.get("id") if isinstance(row, dict) else None
    if value is None or isinstance(value, bool) or str(value).strip() == "":
        return None
    return str(value).strip().lower() if isinstance(value, str) else str(value)


def version_of(kind: str, row: Mapping[str, Any]) -> str:
    """The row's version as the ledger keeps it (`mapping.source_version`)."""
    return mapping.source_version(row, VERSION_FIELD.get(kind, "update_time"))


# --- walking one list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One page of a walk: the rows new to it and where the walk goes on (`after`, None: the end)."""

    rows: tuple[dict[str, Any], ...]
    after: dict[str, Any] | None


def v1_asked(at: Mapping[str, Any]) -> tuple[int, int]:
    """(the offset a v1 walk's page asks for, the overlap it keeps) for `at` (`v1_step`)."""
    start, tail = int(at.get("start", 0)), at.get("tail") or []
    # never more than half the rows the last page served: a server capping its pages still
    # moves the walk on by at least the other half
    overlap = min(OVERLAP, max(1, int(at.get("served", OVERLAP * 2)) // 2))
    return (max(0, start - overlap) if tail else start), overlap


def v1_step(meter: Meter, path: str, params: Mapping[str, Any] | None, at: Mapping[str, Any], size: int = PAGE) -> Step:
    """One overlapping page of a v1 walk (module docstring). `at`: {"start": offset after the
    rows served so far, "tail": the last OVERLAP ids served}; `size`: rows a page asks for."""
    tail = list(at.get("tail") or [])
    asked, overlap = v1_asked(at)
    page = meter.list_v1(path, params, asked, size)
    ids = [mapping.sound_id(r) for r in page.rows]  # only sound ids line the pages up (`mapping.sound_id`)
    new = list(page.rows)
    if tail:
        seen = set(tail)
        found = max((i for i, sid in enumerate(ids) if sid in seen), default=None)
        if found is None and asked > 0:
            # more rows vanished before the offset than the overlap holds: look a page earlier
            return Step((), {"start": max(0, asked - size + overlap), "tail": tail, "served": at.get("served", size)})
        if found is not None:
            new = new[found + 1 :]
    if not page.more:
        return Step(tuple(new), None)
    end = asked + len(page.rows) if page.rows else (page.next_start or asked + 1)
    kept = [sid for sid in ids if sid is not None][-OVERLAP:] or tail
    return Step(tuple(new), {"start": end, "tail": kept, "served": len(page.rows) or 1})


def v2_step(meter: Meter, path: str, params: Mapping[str, Any] | None, at: Mapping[str, Any]) -> Step:
    """One page of a v2 walk in id order by cursor (a cursor names the last row served)."""
    page = meter.list_v2(path, params, at.get("cursor"))
    return Step(page.rows, {"cursor": page.next_cursor} if page.more and page.next_cursor else None)


def path_of(kind: str) -> str:
    """The list endpoint of `kind`: its v2 path when the v2 API has one, else its v1 path;
    raises KeyError for a kind with neither."""
    return V2_PATHS[kind] if kind in V2_PATHS else V1_PATHS[kind]


def query_of(kind: str, since: str | None = None) -> dict[str, Any]:
    """The query of `kind`'s inventory walk (cursor or offset aside): the kind's fixed query
    (`PARAMS`), `updated_since=since` where the list takes it (`SINCE_KINDS`), and - for a list
    that does not but sorts by update time - newest first (`NEWEST_FIRST`)."""
    params = dict(PARAMS.get(kind) or {})
    if since and kind in SINCE_KINDS:
        params["updated_since"] = since
    if since and kind in NEWEST_FIRST:
        params["sort"] = NEWEST_FIRST[kind]
    return params


def older_than(rows: Sequence[Mapping[str, Any]], since: str) -> bool:
    """Whether a row among `rows` was last updated before `since` (RFC 3339); a row without a
    readable `update_time` is not."""
    moment = mapping.timestamp({"t": since}, "t")
    for row in rows:
        try:
            updated = mapping.timestamp(row, "update_time")
        except mapping.MalformedRow:
            continue
        if updated is not None and moment is not None and updated < moment:
            return True
    return False


def list_step(meter: Meter, kind: str, at: Mapping[str, Any], since: str | None = None) -> Step:
    """One page of `kind`'s inventory walk from position `at` (a v2 cursor or a v1 offset), with
    the walk's query (`query_of`; `since` RFC 3339 UTC); raises as the client does. A list walked
    newest first ends at the first page holding a row older than `since`: every row after it is
    older still, so unchanged."""
    params = query_of(kind, since)
    if kind in V2_PATHS:
        return v2_step(meter, V2_PATHS[kind], params, at)
    step = v1_step(meter, V1_PATHS[kind], params, at, page_of(kind))
    if "sort" in params and since and step.after is not None and older_than(step.rows, since):
        return Step(step.rows, None)
    return step


def ask_ahead(client: Any, kind: str, at: Mapping[str, Any], since: str | None = None) -> None:
    """Ask now, in the background, for the page `list_step(.., kind, at, since)` will ask for
    (`prefetch.Prefetch`: the catch-up's next task takes it while this one writes)."""
    params = query_of(kind, since)
    if kind in V2_PATHS:
        client.prefetch_v2(V2_PATHS[kind], params, cursor=at.get("cursor"), limit=PAGE)
    else:
        client.prefetch_v1(V1_PATHS[kind], params, start=v1_asked(at)[0], limit=page_of(kind))


# --- reading every list of a walk at once --------------------------------------------------------

AHEAD = 3  # pages of one list a `ReadAhead` reads before its walker has taken the earlier ones
THREADS = 8  # lists a `ReadAhead` reads at once at most (one thread a list up to this)
IDLE = 60.0  # seconds without a page taken after which a `ReadAhead` reads nothing more
POSITION = ("cursor", "start", "tail", "served")  # the fields of a cursor that say where a walk stands


def position(at: Mapping[str, Any]) -> str:
    """Where a walk stands (`Step.after`, or a catch-up cursor holding it) as one string: the
    v2 cursor or the v1 offset, tail and rows served; `{}` (a list's first page) is "{}"."""
    return json.dumps({k: at[k] for k in POSITION if k in at}, sort_keys=True, default=str)


StepFn = Callable[[Meter, str, Mapping[str, Any], "str | None"], Step]


class ReadAhead:
    """The pages of several lists read at once, each list's pages one after another, for a walker
    that takes them in its own order (the catch-up's chain: `catchup.run_page`). A list named in
    `follows` (list -> the list before it) is read once that one is read to its end, as a walk of
    one after the other would (a deal archived meanwhile is then in the archived deals' list).

    Each list is walked from its first page by the same step as its walker's (`step`, default
    `list_step`), so the walker's request for a page (kind and position) is one asked already: it
    takes the `Step` (waiting while it is in flight) instead of asking the source. At most `ahead`
    pages of a list are read and not yet taken; a list's reading waits for its walker there, which
    bounds what is held. A page is taken once. Nothing is counted here: the walker counts each
    page it takes as the request it stands for. A list whose page failed is read no further (its
    walker asks the source itself, with the client's retries: `reading` turns false); so is every
    list once `idle` seconds passed with no page taken, or after `close`. Pages nobody takes (the
    walker ran in another process, the run stopped) are at most `ahead` a list. `arrived(kind,
    step)` runs on the reading thread after each page is read (what it raises is dropped: it only
    asks ahead)."""

    def __init__(self, client: Any, kinds: Sequence[str], since: str | None = None, *, step: StepFn | None = None,
                 follows: Mapping[str, str] | None = None, ahead: int = AHEAD, threads: int = THREADS,
                 idle: float = IDLE, clock: Callable[[], float] = time.monotonic,
                 arrived: Callable[[str, Step], None] | None = None) -> None:
        self.since = since
        self.ahead = ahead
        self.idle = idle
        self.clock = clock
        self.asked = self.taken = 0
        self._meter = Meter(client, {})
        self._step: StepFn = step or list_step
        self._lock = threading.Lock()
        self._pages: dict[tuple[str, str], Future] = {}
        self._held: dict[str, int] = {k: 0 for k in kinds}
        self._parked: dict[str, Mapping[str, Any]] = {}
        self._ended: set[str] = set()  # read to the last page, or failed
        self._failed: set[str] = set()
        self._follows = {k: before for k, before in (follows or {}).items() if k in self._held and before in self._held}
        self._last = clock()
        self._closed = False
        self._arrived = arrived
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(threads, len(kinds))), thread_name_prefix="readahead")
        for kind in kinds:
            if kind not in self._follows:
                self._read(kind, {})

    def reading(self, kind: str) -> bool:
        """Whether `kind`'s pages are (still) read here: its walker asks nothing ahead itself."""
        with self._lock:
            return not self._closed and kind in self._held and kind not in self._failed

    def settled(self, kinds: Sequence[str]) -> bool:
        """Whether no page of `kinds` is being read now: each list is read to its end (or failed,
        or not read here) or waits for its walker to take a page (`ahead` held)."""
        with self._lock:
            return self._closed or all(k not in self._held or k in self._ended or k in self._parked for k in kinds)

    def take(self, kind: str, at: Mapping[str, Any], cancel: threading.Event | None = None) -> Step | None:
        """The step read for `kind` at `at` (waiting while it is in flight), once; None when it
        was not read (or taken already, or its request failed, or `cancel` was set meanwhile):
        the walker asks the source itself."""
        with self._lock:
            idle = not self._closed and self.clock() - self._last > self.idle
            if idle:
                self._stop()
            future = None if self._closed else self._pages.pop((kind, position(at)), None)
        if idle:  # left idle: its threads are let go
            self._pool.shutdown(wait=False, cancel_futures=True)
        if future is None:
            return None
        with self._lock:
            self._held[kind] -= 1
            self._last = self.clock()
            parked = self._parked.pop(kind, None)
        if parked is not None:
            self._read(kind, parked)
        answered, step = answer_of(future, cancel)
        if not answered:  # the walker asks the source itself
            return None
        with self._lock:
            self.taken += 1
            done = not self._pages and self._ended >= set(self._held)
        if done:  # every list read to its end and taken: its threads are let go
            self._pool.shutdown(wait=False)
        return step

    def close(self) -> None:
        """Read nothing more and drop what is held (requests in flight end unread)."""
        with self._lock:
            self._stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _stop(self) -> None:
        self._closed = True
        self._pages.clear()
        self._parked.clear()

    def _read(self, kind: str, at: Mapping[str, Any]) -> None:
        with self._lock:
            if self._closed or kind in self._ended:
                return
            if self.clock() - self._last > self.idle:
                self._stop()
                return
            if self._held[kind] >= self.ahead:
                self._parked[kind] = at
                return
            future: Future = Future()
            self._pages[(kind, position(at))] = future
            self._held[kind] += 1
            self.asked += 1
        try:
            self._pool.submit(self._fetch, kind, at, future)
        except RuntimeError:  # closed meanwhile, or the interpreter is shutting down
            self._end(kind, failed=True)
            future.set_exception(RuntimeError("not read"))

    def _fetch(self, kind: str, at: Mapping[str, Any], future: Future) -> None:
        try:
            step = self._step(self._meter, kind, at, self.since)
        except BaseException as e:  # noqa: BLE001 - kept for the walker, who asks again
            self._end(kind, failed=True)
            future.set_exception(e)
            return
        future.set_result(step)
        if step.after is None:
            for following in self._end(kind, failed=False):
                self._read(following, {})
        else:
            self._read(kind, step.after)
        if self._arrived is not None:
            try:
                self._arrived(kind, step)
            except Exception:  # noqa: BLE001 - asking ahead is only a cache: the walker asks for itself
                log.debug("a page's arrival hook failed", exc_info=True)

    def _end(self, kind: str, *, failed: bool) -> list[str]:
        """Mark `kind` read to its end (or failed); returns the lists that follow it, to read now.
        The lists following a failed one are not read either (their walker reads them in order)."""
        with self._lock:
            ended, following = [kind], [k for k, before in self._follows.items() if before == kind]
            while failed and ended:
                k = ended.pop()
                self._ended.add(k)
                self._failed.add(k)
                ended += [f for f, before in self._follows.items() if before == k]
            if not failed:
                self._ended.add(kind)
            return [] if failed else following


def walk(meter: Meter, kind: str) -> Iterator[dict[str, Any]]:
    """Every row of a kind's list, each present for the whole walk at least once."""
    at: dict[str, Any] | None = {}
    while at is not None:
        step = list_step(meter, kind, at)
        yield from step.rows
        at = step.after


# --- source_ids ---------------------------------------------------------------------------------


def source_ids(meter: Meter, kind: str) -> Iterator[tuple[str, str | None]]:
    """Every id the source lists now for a plan kind, with its version (module docstring)."""
    if kind == "emails":
        yield from _mail_ids(meter)
        return
    if kind == lines.KIND:
        yield from _line_ids(meter)
        return
    if kind in record_lists.FAMILIES:  # every record's list: as costly as the kind's phase
        listed_as = {"deals": ("deals", "deals_archived")}
        records = ((of, row["id"]) for of in record_lists.FAMILIES[kind].of for k in listed_as.get(of, (of,))
                   for row in walk(meter, k) if isinstance(row.get("id"), int) and not isinstance(row.get("id"), bool))
        yield from record_lists.source_ids(meter, kind, records)
        return
    if kind == contents.KIND:
        yield from _content_ids(meter)
        return
    if kind not in V2_PATHS and kind not in V1_PATHS:
        raise NotImplementedError(f"the pipedrive provider has no id listing for {kind!r}")
    for row in walk(meter, kind):  # a row without a readable id: under the key its run keeps it by
        yield (row_id(row) if mapping.sound_id(row) else mapping.unreadable_key(row)), version_of(kind, row)


def _line_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    """Every deal product line the source serves now, with its version: both deal lists walked
    for the deal ids, then their lines `lines.IDS_PER_CALL` deals a call (cursor pages). A line
    without a readable id is listed under the key its run kept it by (`mapping.unreadable_key`)."""
    deals = sorted({row["id"] for kind in ("deals", "deals_archived") for row in walk(meter, kind)
                    if isinstance(row.get("id"), int) and not isinstance(row.get("id"), bool)})
    for j in range(0, len(deals), lines.IDS_PER_CALL):
        at: dict[str, Any] | None = {}
        while at is not None:
            step = v2_step(meter, lines.PATH, {"deal_ids": deals[j : j + lines.IDS_PER_CALL]}, at)
            for row in step.rows:
                sid = row_id(row) if mapping.sound_id(row) else mapping.unreadable_key(row)
                yield sid, version_of(lines.KIND, row)
            at = step.after


def _content_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    """Every file whose bytes the source serves now, with "sha256:<hex>" of them as its version
    (the ledger's `file_contents` version): the files list walked, each file downloaded and
    hashed as the migration downloads it (`contents.fetch`: 20 tokens a try, a body broken off or
    of another length than the listed `file_size` asked again) - the kind is opt-in, and so is
    proving it. A file the source refuses (403 private, 404 purged) has no content to compare, nor
    has one whose every try broke off: it is told unreachable (`meter.unreachable`, "file <id>")
    with the reason, neither missing nor extra nor stale. A file listed without a readable id has
    nothing to download by: listed under the key its `files` row was kept by
    (`mapping.unreadable_key`), without a version (verify counts it with that row)."""
    for row in walk(meter, "files"):
        sid = row_id(row)
        if sid is None or not sid.isdigit() or not mapping.sound_id(row):
            yield mapping.unreadable_key(row), None
            continue
        size = row.get("file_size")
        expected = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
        got = contents.fetch(meter, int(sid), UNLIMITED_BYTES, expected, meter.cancel)
        if got.spool is not None:
            got.spool.close()
        if got.sha256 is None:
            meter.unreachable[f"file {sid}"] = (_download_failure(got), [sid])
            continue
        yield sid, f"sha256:{got.sha256}"


UNLIMITED_BYTES = 1 << 62  # verify hashes a file of any size (the store's limit is the migration's choice)


def _download_failure(got: contents.Fetched) -> str:
    """Why verify has no content for a file: the HTTP status the source refused it with, or
    the download's last failure."""
    refused = {"forbidden": 403, "missing": 404}.get(got.status)
    if refused is not None:
        return f"the source answered HTTP {refused} to the file's download"
    return got.reason or f"the file's download ended {got.status}"


def _mail_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    """Every mail message of every deal listed with mail (`email_messages_count` above 0 or
    unknown), version None; a deal whose mail listing the source refuses (403 while the token
    reads the account) is told unreachable with the mail the product holds under it.

    A deal listed with mail but without a readable id has no mail listing to ask (it is asked by
    the deal's id): it is listed once, under the key its run kept the deal's mail by ("deal " +
    `mapping.unreadable_key`, `emails.note_unreachable_mail`), so verify counts it as the run
    does - one record kept apart as failed, said among the rows without a readable id."""
    deals: list[int] = []
    kept: set[str] = set()
    for kind in ("deals", "deals_archived"):
        for row in walk(meter, kind):
            count = row.get("email_messages_count")
            if not (count is None or (isinstance(count, int) and not isinstance(count, bool) and count > 0)):
                continue
            if isinstance(row.get("id"), int) and mapping.sound_id(row):
                deals.append(row["id"])
            elif (key := "deal " + mapping.unreadable_key(row)) not in kept:  # both lists may serve it
                kept.add(key)
                yield key, None
    for deal in sorted(set(deals)):
        path = f"/v1/deals/{deal}/mailMessages"
        start: int | None = 0
        while start is not None:
            try:
                page = meter.item_list_v1(path, None, start)
            except ItemRefused as e:
                if e.status == 403:  # the deal's outcome, unless the token itself is refused
                    settle_refusals(meter.client, [e], cancel=meter.cancel)
                    meter.unreachable[f"deal {deal}"] = (
                        f"the source answered HTTP {e.status} to the deal's mail listing",
                        meter.held(str(deal)) if meter.held is not None else [])
                break  # 404: deleted since listed
            for item in page.rows:  # one without a readable id: under the key its run keeps it by
                yield sound_message_id(item) or mapping.unreadable_key(message_or_item(item)), None
            start = page.next_start if page.more else None
