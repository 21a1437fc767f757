"""How a Pipedrive listing task reads its page: the v2 discovery's `update_time` probes and the
walkers it seeds, a v1 or v2 task's page and its successors, the successors' pages asked ahead, and
the deal lists' own count. Sources only: what a page's rows become is `writers.py`'s and the engine's.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from engine_core.models import Run, Successor
from engine_core.providers.pipedrive import kinds, stripes
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import BadResponse, NotFound
from engine_core.providers.pipedrive.stripes import estimate_rows, first_time as _first_time

PROBE_LIMIT = 5  # a probe wants one row with a time; a few in case the first have none


# The source's own count, where the API gives one: only the deals summaries do (`data.total_count`,
# v1 spec `getDealsSummary` / `getArchivedDealsSummary`; "all not archived" / "all archived" deals).
def source_total(client: PipedriveClient, path: str, cancel: Any = None) -> int | None:
    """`data.total_count` of a deals summary (an int >= 0); None when the source does not serve the
    summary (404). Raises BadResponse when it answers without a sound `total_count`."""
    try:
        body = client.get(path, cancel=cancel)
    except NotFound:
        return None
    data = body.get("data")
    total = data.get("total_count") if isinstance(data, dict) else None
    if not isinstance(total, int) or isinstance(total, bool) or total < 0:
        raise BadResponse("data.total_count is not a count", method="GET", path=path, status=200)
    return total


@dataclass(frozen=True)
class Discovery:
    """What the `update_time` probes of a v2 list found: the oldest and newest update time (None
    when no row has one), whether the list has any row, whether a probe met a row whose
    `update_time` is null, the requests made, `whole`: the number of rows when the first probe's
    page (sorted, `PAGE` rows) held the whole list (None when it went on), and `walk`: the list is
    too short to stripe, one walker goes on from that page (`stripes.STRIPE_MIN_PAGES`)."""

    oldest: datetime | None
    newest: datetime | None
    rows: bool
    nulls: bool
    requests: int
    whole: int | None = None
    walk: bool = False

    @property
    def spans(self) -> list[tuple[str | None, str | None]]:
        """[since, until) RFC 3339 spans covering the found update times (`stripes.time_spans`)."""
        return stripes.time_spans(self.oldest, self.newest)


def probe(client: PipedriveClient, path: str, direction: str, cancel: Any = None,
          bounds: Mapping[str, str] | None = None, *, cursor: str | None = None) -> tuple[datetime | None, bool, bool, int]:
    """Walk a v2 list sorted by `update_time` in `direction` (from `cursor`: None, its start)
    until a row with an update time, or the end: (that time or None, any row seen, a null-time
    row seen, requests). Empty pages with a `next_cursor` are walked through: only a null
    `next_cursor` ends a list. `bounds`: the run's `updated_since` / `updated_until` (a bounded
    probe meets no null-time row)."""
    limit, requests, seen, nulls = PROBE_LIMIT, 0, False, False
    params = {"sort_by": "update_time", "sort_direction": direction, **(bounds or {})}
    while True:
        page = client.list_v2(path, params, cursor=cursor, limit=limit, cancel=cancel)
        requests += 1
        seen = seen or bool(page.rows)
        moment, met = _first_time(page.rows)
        nulls = nulls or met
        if moment is not None:
            return moment, seen, nulls, requests
        if not page.more or not page.next_cursor:
            return None, seen, nulls, requests
        cursor = page.next_cursor
        if page.rows:
            limit = stripes.PAGE  # a page without a timed row: walk on in the largest pages


def discover(client: PipedriveClient, path: str, cancel: Any = None, bounds: Mapping[str, str] | None = None) -> Discovery:
    """Both ends of a v2 list's `update_time`. Null-time rows sort at one end (which one depends on
    the server), so they come before any timed row in one of the two probes (`stripes` docstring).
    A full run's probes are unbounded (they must meet the null-time rows), whatever its snapshot.

    The ascending probe asks a whole page (`PAGE` rows: a list call costs the same tokens at any
    limit), held for a walker that asks the same (`stripes.v2_whole_seed`). When that page is the
    list's last, it is the whole list: `whole` is its row count. When the list is estimated below
    `stripes.stripe_min_rows()` (`estimate_rows`, up to `bounds`' `updated_until` or now), `walk`: one walker
    goes on from that page. Either way no descending probe is made; else the page is dropped and
    the descending probe finds the newest update for the stripes."""
    probe_bounds = {k: v for k, v in (bounds or {}).items() if k == "updated_since"}
    asked = {**stripes.SORTED, **probe_bounds}
    first = client.list_v2(path, asked, limit=stripes.PAGE, cancel=cancel, keep=True)
    if not first.more or not first.next_cursor:
        oldest, nulls = _first_time(first.rows)
        return Discovery(oldest, None, rows=bool(first.rows), nulls=nulls, requests=1, whole=len(first.rows))
    oldest, nulls_a = _first_time(first.rows)
    if oldest is not None:
        until = (bounds or {}).get("updated_until")
        upto = datetime.fromisoformat(until.replace("Z", "+00:00")) if until else datetime.now(timezone.utc)
        estimate = estimate_rows(first.rows, oldest, upto)
        if estimate is not None and estimate < stripes.stripe_min_rows():
            return Discovery(oldest, None, rows=True, nulls=nulls_a, requests=1, walk=True)
    client.forget_v2(path, asked, limit=stripes.PAGE)
    req_a = 1
    if oldest is None:  # a first page without a timed row (empty, or null-time rows): walk on to one
        oldest, seen, more_nulls, more_requests = probe(client, path, "asc", cancel, probe_bounds, cursor=first.next_cursor)
        nulls_a, req_a = nulls_a or more_nulls, req_a + more_requests
        if not seen and not first.rows:
            return Discovery(None, None, rows=False, nulls=False, requests=req_a)
    newest, _, nulls_d, req_d = probe(client, path, "desc", cancel, probe_bounds)
    return Discovery(oldest, newest, rows=True, nulls=nulls_a or nulls_d, requests=req_a + req_d)


def discovery_seeds(kind: str, found: Discovery, lower: str | None = None, upper: str | None = None) -> list[Successor]:
    """The walkers a discovery seeds: none for a list empty to its end; one walker in the
    discovery's order from its first page for a list that page held or that is too short to
    stripe (`Discovery.whole`, `.walk`; counting the list's rows for a kind whose count the run
    compares, `kinds.COUNTED`, when the first page did not hold it); else one per span (held inside the run's bounds,
    `stripes.bounded_spans`) and the null walker when a probe met a null-time row and the run is
    not a sync (`stripes.v2_stripe_seeds`)."""
    if not found.rows:
        return []
    if found.whole is not None or found.walk:
        return [stripes.v2_whole_seed(kind, lower, upper, count=found.walk and kind in kinds.COUNTED)]
    spans = stripes.bounded_spans(found.spans, lower, upper) if (lower or upper) else found.spans
    return stripes.v2_stripe_seeds(kind, spans, nulls=found.nulls and lower is None)


@dataclass(frozen=True)
class Listed:
    """One listing task's page, decided but not written: the rows the task writes, how many rows it
    listed but leaves to other walkers (the null walker's timed rows), the task it hands on to,
    and `total`: on a counting walker's last page (`stripes.v2_whole_seed`), the rows the whole
    list held (None elsewhere)."""

    rows: tuple[dict[str, Any], ...]
    passed: int
    successors: tuple[Successor, ...]
    total: int | None = None


# Pages of a v2 walk asked ahead of the task that walks it: each page asked ahead asks its successor
# when it arrives, this many pages deep, so a walk's round trips overlap the pages being written
# instead of one starting as each task starts. A page nobody takes costs its request; at most this
# many a walker (plus the page its discovery holds).
AHEAD = 2


Arrived = Callable[[tuple[dict[str, Any], ...], bool], None]


def ask_ahead(client: Any, kind: str, successors: tuple[Successor, ...], depth: int = AHEAD,
              arrived: Arrived | None = None, *, once: bool = False) -> None:
    """Ask for the successor walkers' pages now, while this task writes its own
    (`prefetch.Prefetch`): the request `list_v1_task` / `list_v2_task` will make for each. A v2
    walker's page asks its own successor's when it arrives, `depth` pages deep in all (`AHEAD`).
    `arrived(rows, last)`: called as each such page arrives, with the rows its task will write and
    whether it is its walker's last page (nothing handed on). `once`: a page its task took already
    is not asked again (`Prefetch.ask`)."""
    for s in successors:
        if kind in stripes.V1_PATHS:
            size = kinds.page_of(kind)
            start, _ = stripes.v1_span(s.cursor, size)
            client.prefetch_v1(stripes.V1_PATHS[kind], start=start, limit=stripes.v1_limit(s.cursor, size),
                               then=_on_arrival(client, kind, s.cursor, depth - 1, arrived), once=once)
        elif kind in stripes.V2_PATHS and not s.cursor.get("discover"):
            client.prefetch_v2(stripes.V2_PATHS[kind], stripes.v2_params(s.cursor), cursor=s.cursor.get("cursor"),
                               limit=stripes.PAGE, then=_on_arrival(client, kind, s.cursor, depth - 1, arrived),
                               once=once)


def _on_arrival(client: Any, kind: str, cursor: dict[str, Any], depth: int, arrived: Arrived | None) -> Any:
    """When the page of the walker at `cursor` arrives: hand its rows to `arrived` and, `depth`
    pages deep, ask its successors' pages (`ask_ahead`) as `list_v2_task` / `list_v1_task` hand on
    - by the page's `next_cursor` or pagination, none at the list's end. None when there is
    nothing to do."""
    if depth < 1 and arrived is None:
        return None

    def on_page(body: dict[str, Any]) -> None:
        extra = body.get("additional_data")
        extra = extra if isinstance(extra, dict) else {}
        if kind in stripes.V1_PATHS:
            data = body.get("data")
            successors = _v1_handed_on(kind, cursor, extra, len(data) if isinstance(data, list) else 0)
            more = bool(successors)
        else:
            nxt = extra.get("next_cursor")
            more = isinstance(nxt, str) and bool(nxt) and nxt != cursor.get("cursor")
            successors = (stripes.v2_next(kind, cursor, nxt, len(body.get("data") or ())),) if more else ()
        if depth >= 1 and successors:
            ask_ahead(client, kind, successors, depth, arrived, once=True)
        rows = body.get("data")
        if arrived is not None and isinstance(rows, list):
            arrived(kept_rows(cursor, tuple(rows)), not more)
    return on_page


def _v1_handed_on(kind: str, cursor: dict[str, Any], extra: dict[str, Any], rows: int) -> tuple[Successor, ...]:
    """The tasks a v1 page hands on to, from its `additional_data` as `PipedriveClient.list_v1`
    reads it (none when it does not say how to go on)."""
    pagination = extra.get("pagination") if isinstance(extra.get("pagination"), dict) else extra
    size = kinds.page_of(kind)
    start, _ = stripes.v1_span(cursor, size)
    more = bool(pagination.get("more_items_in_collection"))
    next_start = pagination.get("next_start")
    if next_start is None:
        next_start = start + rows
    if more and (not isinstance(next_start, int) or next_start <= start):
        return ()
    return stripes.v1_successors(kind, cursor, more=more, next_start=next_start if more else None, page=size)


def kept_rows(cursor: dict[str, Any], rows: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
    """The rows of a listed page its task writes: a v2 null walker's null-time rows, a sorted
    walker's rows before its bound, every other walker's all."""
    if stripes.is_null_walker(cursor):
        return tuple(r for r in rows if stripes.has_null_time(r))
    if cursor.get("sorted"):
        return tuple(r for r in rows if stripes.is_before(r, cursor.get("before")))
    return rows


def ask_next_phase(client: Any, run: Run, phase: int, seeds_of: Callable[[Run, str], list[Successor]],
                   arrived: Callable[[str], Arrived | None] | None = None) -> None:
    """Ask the first pages of the next phase's v1 lists now (`ask_ahead` with `seeds_of`: the
    provider's `seed_cursors`), for a walker whose last page this is: they have no discovery to
    ask them early, so the phase boundary would otherwise wait for their first round trip. A page
    nobody takes (the next phase runs in another process, or this phase's tail outlasts the store's
    `ttl`) costs one page per kind and walker end at most; the store asks a page once while held.
    `arrived(kind)`: the `ask_ahead` hook for that kind's pages."""
    if phase + 1 >= len(run.plan):
        return
    for kind in run.plan[phase + 1]:
        if kind in stripes.V1_PATHS:
            ask_ahead(client, kind, tuple(seeds_of(run, kind)), arrived=arrived(kind) if arrived else None)


def ask_discoveries(client: Any, run: Run, phase: int) -> None:
    """Ask the first request of each discovery of the phase after `phase` now (`discover`'s sorted
    page, through the client's `Prefetch`; once a run: a page its discovery took is not asked
    again), so that discovery - which runs early, while `phase` ends (`barrier.seed_phase`) - finds
    its first page here and its walker's next pages start a round trip sooner. A full run's
    discoveries only: a sync seeds none. A page nobody takes within the store's `ttl` (the phase
    between outlasts it, on a large account) costs one page a kind."""
    if run.is_sync or phase + 1 >= len(run.plan):
        return
    for kind in run.plan[phase + 1]:
        if kind in stripes.V2_PATHS and kind not in stripes.UNSTRIPED:
            client.prefetch_v2(stripes.V2_PATHS[kind], dict(stripes.SORTED), limit=stripes.PAGE, once=True)


def list_v1_task(client: PipedriveClient, kind: str, cursor: dict[str, Any], cancel: Any = None) -> Listed:
    """A v1 task's page: asked up to its span's end, handed on by the API's pagination fields
    (`stripes.v1_successors`), never by the number of rows that came back; one walker walks the
    list's first spans and seeds the stripes as it proves long (`stripes.v1_next`). Pages are the kind's
    `page_size` (`kinds.page_of`)."""
    size = kinds.page_of(kind)
    start, _ = stripes.v1_span(cursor, size)
    page = client.list_v1(stripes.V1_PATHS[kind], start=start, limit=stripes.v1_limit(cursor, size), cancel=cancel)
    return Listed(page.rows, 0, stripes.v1_successors(kind, cursor, more=page.more, next_start=page.next_start, page=size))


def list_v2_task(client: PipedriveClient, kind: str, cursor: dict[str, Any], cancel: Any = None) -> Listed:
    """A v2 walker's page; a page with no rows and a `next_cursor` is not the end. The null walker
    lists the whole collection and keeps only its null-time rows (the rest are the spans'). A
    counting walker's last page gives the list's count (`Listed.total`)."""
    page = client.list_v2(stripes.V2_PATHS[kind], stripes.v2_params(cursor), cursor=cursor.get("cursor"), limit=stripes.PAGE, cancel=cancel)
    rows = kept_rows(cursor, page.rows)
    successors = (stripes.v2_next(kind, cursor, page.next_cursor, len(page.rows)),) if page.more and page.next_cursor else ()
    total = int(cursor["count"]) + len(page.rows) if "count" in cursor and not successors else None
    return Listed(rows, len(page.rows) - len(rows), successors, total)

