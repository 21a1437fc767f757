"""The source's inventory: every id Pipedrive lists now, and the catch-up phase built on it.

`source_ids(provider, settings, kind, options)` walks a kind's cheapest full listing - the list
endpoint itself, 500 rows a call (Pipedrive has no id-only listing: v1 and v2 lists both carry
whole rows) - and yields `(source id, version)`, the version being the string the ledger keeps
(`mapping.source_version`: `update_time` as served, users' `modified`). Each request is counted
into `options["cost"]` (`requests`, and `tokens` at the endpoint's `x-token-cost`, `TOKEN_COSTS`).
`emails` lists the deals (both lists, with `email_messages_count`) and the mail of each deal that
has any; `fields` and the catch-up kind are not listed (NotImplementedError).

**Walking a list that changes under it.** v2 lists are walked by cursor in id order: a cursor
names the last row served, so deletions and updates elsewhere do not move it. v1 lists (users,
leads, archived leads, notes) have only offsets, and a row deleted before the current offset
shifts every later row one place back (the issue's 699 of 700 notes). The walk here is
sequential and overlapping (`v1_step`): each page is asked from OVERLAP rows (at most half the
last page) before where the last one ended and must contain one of the last ids served; the rows after it are new. When
none is there - more than OVERLAP rows vanished before the offset meanwhile - it steps back a
page and looks again (at offset 0 everything it serves counts as new). Rows inserted before the
offset shift the other way and are only served twice. So a row present for the whole walk is
served at least once.

**The catch-up phase** (kind `catchup`, the plan's last phase; a sync has it too). A full run's
walks cover the snapshot; what moved while they walked - a row updated from one `update_time`
span into another the walker had passed, a note pushed across an offset boundary by a deletion,
a deal archived between the active and the archived lists, deletions, merges - is found here by
one inventory walk per kind, parents first (users, pipelines, stages, organizations, persons,
deals + archived deals, leads + archived leads, one after another in one chain of tasks; then
activities and notes, which nothing links to, at once in a task each: `LAST_LEVEL`). A page's rows are
compared with the ledger in one query: rows the ledger lacks, holds only as a placeholder, holds
at an older version or holds as deleted are written through the engine's write path (created,
or updated in place with the ledger's history: `ledger.write_once`); the rest cost nothing more.
Every id served is recorded in `migration_inventory`. When a ledger kind's lists are done, a
`deletes` task takes the kind's live ledger entries the inventory did not see, asks the source
for each (`GET` by id: 1-2 tokens): 404 is a deletion (or a merge: Pipedrive's merged id answers
404 and its children were re-pointed to the survivor, whose update moved them into this walk)
and is marked with `ledger.mark_deleted`; a row that answers is written as served (it moved
between lists while the walk passed). Changed deals with more mail than the product holds for
them (`email_messages_count` against crm.emails) get email tasks of ten deals (`emails.py`), so
mail is fetched only for deals whose mail changed (and only in runs that import mail); these
tasks take over the run's own mail placeholders (mail the emails phase skipped because its deal,
created meanwhile, was not written yet).

**A sync** (`runs.start_sync`, mode 'sync') is this phase: the provider seeds nothing else but
the field definitions, and the catch-up brings every change and deletion since the last succeeded
run's snapshot. Why one listing and not an `updated_since` listing plus an id listing: deletions
can only be found by a full id listing (Pipedrive has no list of deleted rows), and Pipedrive's
lists serve whole rows with their `update_time`, so that listing already carries every changed
row; an `updated_since` listing as well would list the changed rows twice (one call per kind at
least). With the run option `detect_deletes: false` a sync lists only what changed instead:
`updated_since` = the sync's `since` minus the snapshot margin on the v2 lists, notes and active
leads (`SINCE_KINDS`); archived leads, users, pipelines and stages take no such filter and are
listed whole (short lists, except archived leads: the API leaves no choice); no deletes tasks.
Instead, per ledger kind, the rows the ledger holds as skipped that this listing did not serve are
asked by id and written as served (`retake_skipped`): a skip is not final - the parent it waited
for may have been written since, while the row itself did not change. (A full listing serves
every skipped row the source still has, and `needs_write` takes placeholders over.)
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_core import ledger
from engine_core.context import TaskContext
from engine_core.db import Conn, query
from engine_core.errors import PageFailed
from engine_core.models import Run, Stats, Successor, TaskOutcome
from engine_core.source import snapshot_margin
from engine_core.providers.pipedrive import contents, lines, mapping, record_lists, writers
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.paging import Page, settle_refusals
from engine_core.providers.pipedrive.errors import ItemRefused, NotFound
from engine_core.providers.pipedrive.kinds import (FAN_OUT_COSTS, LAST_LEVEL, PAGE, PARAMS, SINCE_KINDS, SINGLE_PATHS,
                                                   TOKEN_COSTS, V1_PATHS, V2_PATHS, VERSION_FIELD, ledger_kind)
from engine_core.providers.pipedrive.kinds import CATCHUP_ORDER as ORDER
from engine_core.providers.pipedrive.kinds import page_of
from engine_core.providers.pipedrive.mail import message_of
from engine_core.providers.pipedrive.stripes import rfc3339

CATCHUP = "catchup"
OVERLAP = 25  # rows each v1 page re-asks before the last one's end (deletions it absorbs)
DEALS_PER_TASK = 10
# Pages a catch-up task walks (across its lists) before it hands on to a successor (`run_page`): a
# hand-over is a finish, a claim and a new task whose first page is fetched in line (~50 ms on the
# small account's chain, whose 11 pages took two tasks at 10: A/B of full small runs, catch-up phase
# median 1.27 -> 1.17 s at load 5-8); stops are still seen after every page.
PAGES_PER_TASK = 25


def token_cost(path: str) -> int:
    """The tokens one GET of `path` costs (a deal's mail listing 20, a record or a mail body by id
    1 in v2 and 2 in v1)."""
    if path in TOKEN_COSTS:
        return TOKEN_COSTS[path]
    if path.endswith("/mailMessages"):
        return TOKEN_COSTS["mailMessages"]
    for suffix, cost in FAN_OUT_COSTS.items():  # a record's participants, followers, changelog
        if path.endswith(suffix):
            return cost
    if path.endswith("/download"):
        return TOKEN_COSTS["download"]
    return TOKEN_COSTS["v2 single"] if path.startswith("/api/v2/") else TOKEN_COSTS["v1 single"]


class CountingClient:
    """The provider's client as one task uses it: every request it asks for is counted (thread-safe:
    mail bodies are fetched on other threads), `requests` and `tokens` at the endpoint's cost, so a
    task's stats say what it spent at the source (the rollup sums them per run: a sync's cost). A
    request the client retries counts once (the source may have charged the failed attempts too)."""

    def __init__(self, client: PipedriveClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self.requests = 0
        self.tokens = 0

    def _count(self, path: str, n: int = 1) -> None:
        with self._lock:
            self.requests += n
            self.tokens += n * token_cost(path)

    def get(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """`PipedriveClient.get`, counted; raises as it does."""
        self._count(path)
        return self._client.get(path, params, **kw)

    def list_v1(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Page:
        """`PipedriveClient.list_v1` (one offset-paged v1 page), counted; raises as it does."""
        self._count(path)
        return self._client.list_v1(path, params, **kw)

    def list_v2(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> Page:
        """`PipedriveClient.list_v2` (one cursor-paged v2 page), counted - unless the page was
        held for this request after another task paid for it (`Page.kept`); raises as it does."""
        self._count(path)
        page = self._client.list_v2(path, params, **kw)
        if page.kept:
            self._count(path, -1)
        return page

    def iter_v1(self, path: str, params: Mapping[str, Any] | None = None, *, start: int = 0, **kw: Any) -> Iterator[Page]:
        """Every v1 page from offset `start` on, following `additional_data.pagination`
        (`next_start`) until `more_items_in_collection` is false; each page counted."""
        while True:
            page = self.list_v1(path, params, start=start, **kw)
            yield page
            if not page.more or page.next_start is None:
                return
            start = page.next_start

    def iter_v2(self, path: str, params: Mapping[str, Any] | None = None, *, cursor: str | None = None, **kw: Any) -> Iterator[Page]:
        """Every v2 page from `cursor` on, following `additional_data.next_cursor` until it is
        null; each page counted."""
        while True:
            page = self.list_v2(path, params, cursor=cursor, **kw)
            yield page
            if not page.more:
                return
            cursor = page.next_cursor

    def mail_messages(self, deal_id: int, *args: Any, **kw: Any) -> Page:
        """`PipedriveClient.mail_messages` (a page of a deal's mail listing), counted at its
        token cost (`TOKEN_COSTS["mailMessages"]`)."""
        self._count("/mailMessages")
        return self._client.mail_messages(deal_id, *args, **kw)

    def download(self, path: str, **kw: Any) -> Any:
        """`PipedriveClient.download` (a file's bytes, streamed), counted at its token cost."""
        self._count(path)
        return self._client.download(path, **kw)

    def mail_body(self, message_id: int, *args: Any, **kw: Any) -> Any:
        """`PipedriveClient.mail_body` (one message with its body), counted."""
        self._count("/v1/mailbox/mailMessages/{id}")
        return self._client.mail_body(message_id, *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@dataclass
class Meter:
    """The client, counting every request into `cost` (`requests`, `tokens`)."""

    client: PipedriveClient
    cost: dict[str, int] = field(default_factory=dict)
    cancel: Any = None
    # items whose sub-resource the source refused while the token reads the account: "deal 12" ->
    # (the reason, the source ids the product holds under it), for verify to tell them unreachable
    unreachable: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    held: Callable[[str], list[str]] | None = None  # a deal's source id -> the mail ids the product holds

    def _count(self, path: str) -> None:
        self.cost["requests"] = int(self.cost.get("requests", 0)) + 1
        self.cost["tokens"] = int(self.cost.get("tokens", 0)) + token_cost(path)

    def list_v1(self, path: str, params: Mapping[str, Any] | None, start: int, limit: int = PAGE) -> Page:
        """One v1 page of `limit` rows (default `PAGE`) from offset `start`, counted into `cost`."""
        self._count(path)
        return self.client.list_v1(path, params, start=start, limit=limit, cancel=self.cancel)

    def list_v2(self, path: str, params: Mapping[str, Any] | None, cursor: str | None) -> Page:
        """One v2 page of `PAGE` rows from `cursor` (None: the first), counted into `cost`."""
        self._count(path)
        return self.client.list_v2(path, params, cursor=cursor, limit=PAGE, cancel=self.cancel)

    def get(self, path: str, params: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """One GET of `path` (a record by id, a record's list), counted into `cost`."""
        self._count(path)
        kw["cancel"] = kw.get("cancel") or self.cancel
        return self.client.get(path, params, **kw)

    def item_list_v1(self, path: str, params: Mapping[str, Any] | None, start: int) -> Page:
        """A page of one item's sub-resource (`PipedriveClient.item_list_v1`: 403/404 raise `ItemRefused`)."""
        self._count(path)
        return self.client.item_list_v1(path, params, start=start, limit=PAGE, cancel=self.cancel)


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


def list_step(meter: Meter, kind: str, at: Mapping[str, Any], since: str | None = None) -> Step:
    """One page of `kind`'s inventory walk from position `at` (a v2 cursor or a v1 offset), with
    the kind's fixed query (`PARAMS`) and `updated_since=since` where the list takes it
    (`SINCE_KINDS`, RFC 3339 UTC); raises as the client does."""
    params = dict(PARAMS.get(kind) or {})
    if since and kind in SINCE_KINDS:
        params["updated_since"] = since
    if kind in V2_PATHS:
        return v2_step(meter, V2_PATHS[kind], params, at)
    return v1_step(meter, V1_PATHS[kind], params, at, page_of(kind))


def ask_ahead(client: Any, kind: str, at: Mapping[str, Any], since: str | None = None) -> None:
    """Ask now, in the background, for the page `list_step(.., kind, at, since)` will ask for
    (`prefetch.Prefetch`: the catch-up's next task takes it while this one writes)."""
    params = dict(PARAMS.get(kind) or {})
    if since and kind in SINCE_KINDS:
        params["updated_since"] = since
    if kind in V2_PATHS:
        client.prefetch_v2(V2_PATHS[kind], params, cursor=at.get("cursor"), limit=PAGE)
    else:
        client.prefetch_v1(V1_PATHS[kind], params, start=v1_asked(at)[0], limit=page_of(kind))


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
    for row in walk(meter, kind):
        sid = row_id(row)
        if sid is not None:
            yield sid, version_of(kind, row)


def _line_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    """Every deal product line the source serves now, with its version: both deal lists walked
    for the deal ids, then their lines `lines.IDS_PER_CALL` deals a call (cursor pages)."""
    deals = sorted({row["id"] for kind in ("deals", "deals_archived") for row in walk(meter, kind)
                    if isinstance(row.get("id"), int) and not isinstance(row.get("id"), bool)})
    for j in range(0, len(deals), lines.IDS_PER_CALL):
        at: dict[str, Any] | None = {}
        while at is not None:
            step = v2_step(meter, lines.PATH, {"deal_ids": deals[j : j + lines.IDS_PER_CALL]}, at)
            for row in step.rows:
                sid = row_id(row)
                if sid is not None:
                    yield sid, version_of(lines.KIND, row)
            at = step.after


def _content_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    """Every file whose bytes the source serves now, with "sha256:<hex>" of them as its version
    (the ledger's `file_contents` version): the files list walked, each file downloaded and
    hashed as the migration downloads it (`contents.fetch`: 20 tokens a try, a body broken off or
    of another length than the listed `file_size` asked again) - the kind is opt-in, and so is
    proving it. A file the source refuses (403 private, 404 purged) has no content to compare, nor
    has one whose every try broke off: it is told unreachable (`meter.unreachable`, "file <id>")
    with the reason, neither missing nor extra nor stale."""
    for row in walk(meter, "files"):
        sid = row_id(row)
        if sid is None or not sid.isdigit():
            continue
        size = row.get("file_size")
        expected = size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
        got = contents.fetch(_Downloads(meter), int(sid), UNLIMITED_BYTES, expected, meter.cancel)
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


@dataclass
class _Downloads:
    """The meter as `contents.fetch` uses it: every download try counted into the meter's cost."""

    meter: Meter

    def download(self, path: str, **kw: Any) -> Any:
        """`PipedriveClient.download` (a file's bytes, streamed), counted at its token cost."""
        self.meter._count(path)
        return self.meter.client.download(path, **kw)

    def confirm_token(self, **kw: Any) -> Any:
        """`PipedriveClient.confirm_token`: a 403 is the file's only while the token reads the account."""
        return self.meter.client.confirm_token(**kw)


def _mail_ids(meter: Meter) -> Iterator[tuple[str, str | None]]:
    deals: list[int] = []
    for kind in ("deals", "deals_archived"):
        for row in walk(meter, kind):
            count = row.get("email_messages_count")
            if isinstance(row.get("id"), int) and (count is None or (isinstance(count, int) and count > 0)):
                deals.append(row["id"])
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
            for item in page.rows:
                try:
                    sid = row_id(dict(message_of(item)))
                except mapping.MalformedRow:
                    continue
                if sid is not None:
                    yield sid, None
            start = page.next_start if page.more else None


# --- the catch-up phase -------------------------------------------------------------------------


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
    """The run's kinds the catch-up walks, in walking order."""
    return [k for k in ORDER if k in run.kinds]


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


def needs_write(entry: Mapping[str, Any] | None, version: str, run: Run | None = None) -> bool:
    """A listed row is written when the ledger lacks it, holds a placeholder (a skip or failure
    whose reason may no longer hold: a parent written since), holds an older version
    (`ledger.newer`) or holds it as deleted at the source. A matched row (the product's own
    contact or company) with a newer version is left alone unless the run's `overwrite_matched`:
    the product keeps its values, so writing it would only be refused again by every catch-up."""
    if entry is None or entry["action"] not in ("created", "matched"):
        return True
    if entry.get("deleted_at_source") is not None:
        return True
    if entry["action"] == "matched" and run is not None and not ledger.overwrite_matched(run):
        return False
    return ledger.newer(version, entry["source_version"])


def _remember_and_compare(conn: Conn, run: Run, kind: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Record the ids as seen by this run's inventory (`migration_inventory`) and return their
    ledger entries by source id, in one statement: one round trip a page, not four (begin,
    insert, select, commit); both happen or neither."""
    if not ids:
        return {}
    rows = conn.sql(
        "WITH seen AS (INSERT INTO migration_inventory (migration_id, kind, source_id)"
        " SELECT %(r)s, %(k)s, unnest(%(ids)s::text[]) ON CONFLICT DO NOTHING)"
        " SELECT source_id, action, source_version, deleted_at_source FROM migration_records"
        " WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND source_id = ANY(%(ids)s::text[])",
        {"r": run.id, "t": run.tenant_id, "s": run.source, "k": kind, "ids": list(ids)},
    )
    return {r["source_id"]: r for r in rows}


def _forget_older(conn: Conn, run: Run) -> None:
    """Inventories of the tenant's finished runs: nothing reads them any more."""
    conn.sql(
        "DELETE FROM migration_inventory i USING migrations m WHERE i.migration_id = m.id"
        " AND m.tenant_id = %(t)s AND m.source = %(s)s AND m.id <> %(r)s"
        " AND m.status IN ('succeeded', 'failed', 'stopped')",
        {"t": run.tenant_id, "s": run.source, "r": run.id},
    )


def _mail_wanted(conn: Conn, run: Run, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Deals among these written rows whose source mail count exceeds the product's."""
    counts = {row_id(r): r.get("email_messages_count") for r in rows if isinstance(r.get("id"), int)}
    counts = {sid: c for sid, c in counts.items() if sid and (c is None or (isinstance(c, int) and c > 0))}
    if not counts:
        return []
    held = {r["source_id"]: int(r["n"]) for r in conn.sql(
        "SELECT r.source_id, count(e.id) AS n FROM migration_records r"
        " LEFT JOIN crm.emails e ON e.deal_id = r.record_id AND e.tenant_id = r.tenant_id"
        " WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = 'deals'"
        " AND r.source_id = ANY(%(ids)s::text[]) GROUP BY r.source_id",
        {"t": run.tenant_id, "s": run.source, "ids": list(counts)})}
    return sorted(int(sid) for sid, c in counts.items() if c is None or c > held.get(sid, 0))


def mail_tasks(kind: str, page: int, deals: Sequence[int]) -> list[Successor]:
    """Mail tasks for the deals (source ids) a catch-up page found with mail to fetch,
    `DEALS_PER_TASK` deals each, retaking this run's own placeholders (`retake`)."""
    return [
        Successor(f"{CATCHUP}:mail:{kind}:p{page}:c{j // DEALS_PER_TASK}",
                  {"deals": list(deals[j : j + DEALS_PER_TASK]), "retake": True})
        for j in range(0, len(deals), DEALS_PER_TASK)
    ]


# Row outcomes (and `seen`) a catch-up task also counts per listing kind, as "<counter>@<kind>"
# (`PerKindStats`): the rollup adds them to that kind's figures (engine_core.rollup).
PER_KIND = frozenset({"seen", "imported", "matched", "already_here", "updated", "skipped", "failed"})


class PerKindStats(Stats):
    """A catch-up task's stats while it writes rows of one listing kind: every row outcome (and
    `seen`) is counted twice, under its own name and as "<counter>@<kind>" (e.g. `imported@deals`),
    so the rollup can credit the rows the catch-up wrote to the kind they belong to (a
    source's count is met by the kind's phase plus the catch-up; the ledger's claims of a kind =
    its phase's + the catch-up's). Both counts land in the same window's checkpoint."""

    def __init__(self, values: dict[str, int], kind: str) -> None:
        super().__init__(values)
        self.kind = kind

    def bump(self, key: str, n: int = 1) -> None:
        """Add `n` to `key`, and to `key@kind` too when `key` is a row outcome (`PER_KIND`)."""
        super().bump(key, n)
        if key in PER_KIND:
            super().bump(f"{key}@{self.kind}", n)

    def copy(self) -> PerKindStats:
        """An independent copy (the values before a window, restored when it fails)."""
        return PerKindStats(dict(self.values), self.kind)


def counted_as(ctx: TaskContext, kind: str, work: Any) -> Any:
    """Run `work()` with the task's row outcomes also counted under `kind` (`PerKindStats`)."""
    ctx.stats = PerKindStats(ctx.stats.values, kind)
    try:
        return work()
    finally:
        ctx.stats = Stats(ctx.stats.values)


def write_changed(ctx: TaskContext, client: PipedriveClient, mapper_of: Any, kind: str, lk: str,
                  rows: Sequence[dict[str, Any]], *, full: bool = False) -> list[dict[str, Any]]:
    """Record the rows as seen, write those the ledger does not hold at their version; returns
    the rows written. Outcomes are also counted per listing kind (`PerKindStats`); `full`: these
    rows are a page of the kind's whole list (not only what changed), so `listed@kind` and
    `unchanged@kind` are counted too (the source's count at the catch-up, for the rollup)."""
    listed = [(row_id(r), r) for r in rows if isinstance(r, dict)]
    ids = [sid for sid, _ in listed if sid is not None]
    with ctx.db.connection() as conn:
        entries = _remember_and_compare(conn, ctx.run, lk, ids)
    changed = [r for sid, r in listed if sid is None or needs_write(entries.get(sid), version_of(kind, r), ctx.run)]
    ctx.stats.bump("inventory_listed", len(listed))
    ctx.stats.bump("unchanged", len(listed) - len(changed))
    if full:
        ctx.stats.bump(f"listed@{kind}", len(listed))
        ctx.stats.bump(f"unchanged@{kind}", len(listed) - len(changed))
    if changed:
        ctx.offset = 0  # the page is listed again on a retry and compared again: never skip by offset

        def write() -> None:
            try:
                writers.write_page(ctx, changed, mapper_of(kind), kind=lk, client=client)
            except PageFailed:
                # raised once every window has committed: the few rows picked from this page (often
                # one malformed row failing again) failed alone, each with its reason in the ledger
                pass

        counted_as(ctx, kind, write)
    return changed


def run_page(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """Pages of the catch-up's inventory walk (module docstring): up to `PAGES_PER_TASK` pages in
    one task, walking on from a list's last page to the next list's first (a task a page would
    pay a claim, a finish, a top-up and the barrier's check per page). After each page but the task's last, the task moves its own cursor to the next page
    (`TaskContext.move_cursor`) in one transaction with the page's mail tasks and, after a ledger
    kind's last list, that kind's deletes task: a task that dies resumes at the page after the last
    one it finished, and the page it was on is listed and compared again (never skipped by offset)."""
    cursor = dict(ctx.task.cursor)
    kind = cursor["list"]
    lk = ledger_kind(kind)
    since = changed_since(ctx.run)
    kinds = catchup_kinds(ctx.run)
    if int(cursor.get("page", 0)) == 0 and kind == kinds[0]:
        with ctx.db.transaction() as tx:
            _forget_older(tx, ctx.run)
    meter = Meter(client, {}, ctx.cancel)
    walked = 0
    while True:
        page = int(cursor.get("page", 0))
        step = list_step(meter, kind, cursor, since)
        walked += 1
        if step.after is not None:
            ask_ahead(client, kind, step.after, since)
        else:
            for nxt in _after_list(ctx.run, kind):
                if nxt.cursor.get("list") is not None:  # the lists walked next (here, or in tasks of their own)
                    ask_ahead(client, nxt.cursor["list"], {}, since)
        if ctx.run.dry_run:
            ctx.stats.bump("inventory_listed", len(step.rows))
            written: list[dict[str, Any]] = []
        else:
            written = write_changed(ctx, client, mapper_of, kind, lk, step.rows, full=since is None)
        successors: list[Successor] = []
        if lk == "deals" and written and "emails" in ctx.run.kinds:
            with ctx.db.connection() as conn:
                deals = _mail_wanted(conn, ctx.run, written)
            if deals:
                ctx.stats.bump("mail_deals", len(deals))
                successors.extend(mail_tasks(kind, page, deals))
        if kind == "files" and step.after is None and contents.KIND in ctx.run.kinds and not ctx.run.dry_run:
            # the files list walked: the contents still to fetch (changed files, failed downloads)
            successors.append(Successor(contents.CATCHUP_DISCOVERY, {"contents": "discover"}))
        if lk == "deals" and written and lines.KIND in ctx.run.kinds:
            # a deal's products changed with it: its lines are listed again (lines.py)
            successors.extend(lines.catchup_tasks(kind, page, lines.written_deals(written)))
        successors.extend(record_lists.catchup_tasks(ctx.run.kinds, lk, kind, page, written))
        if step.after is None:
            after = _after_list(ctx.run, kind)
            first = next((s for s in after if s.cursor.get("list") is not None), None)
            if first is None or walked >= PAGES_PER_TASK:
                return TaskOutcome(tuple(successors + after))
            # the next list in this same task; the deletes task of a ledger kind done goes on the lane
            successors += [s for s in after if s is not first]
            following_page = first
        else:
            following_page = page_task(kind, page + 1, step.after)
            if walked >= PAGES_PER_TASK:
                return TaskOutcome(tuple(successors + [following_page]))
        ctx.move_cursor(following_page.cursor, successors=successors)
        cursor = dict(following_page.cursor)
        kind = cursor["list"]
        lk = ledger_kind(kind)
        ctx.stop_point()  # after the move: a stop resumes at the next page, this page's successors made


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
            gone: Sequence[str], present: Sequence[dict[str, Any]]) -> None:
    """Write the rows that answered as served; mark the ones gone deleted at the source."""
    if present:
        write_changed(ctx, client, mapper_of, lk, lk, present)
    if gone:
        with ctx.db.transaction() as tx:
            record_lists.mark_dependents_deleted(tx, ctx.run, lk, list(gone))  # a deal's participants, ...
            if lk == "deals":
                lines.mark_lines_of_deleted_deals(tx, ctx.run, gone)  # a deal's product lines
            ctx.stats.values["deleted_at_source"] = ledger.mark_deleted(tx, ctx.run, lk, list(gone))


def retake_skipped(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """A ledger kind's skipped rows this catch-up's listing did not serve (a sync listing only what
    changed): each is asked by id (1-2 tokens) and written as served - a skip whose reason no
    longer holds (its parent written since) ends imported, one that still holds is skipped again
    with its reason; a row gone at the source (404) keeps its placeholder and is marked deleted at
    the source. Failed rows are not asked: a malformed row stays malformed until it changes, and
    the listing brings it then."""
    lk = ctx.task.cursor["deletes"]
    run = ctx.run
    rows = ctx.db.sql(query("catchup_unseen_skipped"), {"t": run.tenant_id, "s": run.source, "k": lk, "r": run.id})
    gone, present = ask_by_id(ctx, client, lk, [r["source_id"] for r in rows])
    ctx.stats.values["skipped_asked"] = len(rows)
    _settle(ctx, client, mapper_of, lk, gone, present)
    return TaskOutcome()


def run_deletes(ctx: TaskContext, client: PipedriveClient, mapper_of: Any) -> TaskOutcome:
    """A ledger kind's entries (written, skipped or failed; not yet marked) the inventory did not
    see: 404 at the source -> marked deleted;
    a row that answers moved between lists meanwhile and is written as served. (With the cursor's
    `placeholders`: `retake_skipped` instead.)"""
    if ctx.task.cursor.get("placeholders"):
        return retake_skipped(ctx, client, mapper_of)
    lk = ctx.task.cursor["deletes"]
    run = ctx.run
    rows = ctx.db.sql(query("catchup_unseen_live"), {"t": run.tenant_id, "s": run.source, "k": lk, "r": run.id})
    gone, present = ask_by_id(ctx, client, lk, [r["source_id"] for r in rows])
    ctx.stats.values["delete_candidates"] = len(rows)
    _settle(ctx, client, mapper_of, lk, gone, present)
    return TaskOutcome()
