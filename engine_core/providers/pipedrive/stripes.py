"""Cursors and stripes: where each task of a kind starts, and the task it hands on to.

The rule every walk obeys: the API's own pagination fields decide whether there is more - v1's
`more_items_in_collection` / `next_start`, v2's `next_cursor`. Page arithmetic and time spans only
decide who walks which part; they never end a walk the API says goes on. A page shorter than asked
(a server capping `limit`), or with no rows at all, is not the end while those fields say more.

Stripe only a list large enough to gain, decided by the first pages asked anyway: a list is
striped from `STRIPE_MIN_PAGES` (8) pages on; below, one walker walks it page after page, every
page full but the last, nothing past the end. A v1 list's first task is span 0 alone, and one
walker walks spans 0 ... 7 while the API says more; the eighth, saying more, seeds the four
stripes (`v1_first`, `v1_next`): a list of up to eight pages costs one call a page, a longer one
three more (the empty last pages of the three stripes that do not hold the last row). A v2
discovery's ascending probe asks a whole page (`listing.discover`): when that page is the list's
last it is the whole list, and when the list is estimated below eight pages' rows from that page's
pace (`estimate_rows`, `stripe_min_rows`), one walker (`v2_whole_seed`) takes that very page (kept
by `prefetch.Prefetch.hold`) and goes on in its order, with no descending probe, no stripes and no
null walker; a deal list it walks counts its own rows on the way (no summary call). A striped
list pays the dropped first page, the descending probe, a partial last page per stripe and the
parent probes of those partial pages.

Why eight, measured with a sweep of `STRIPE_MIN_PAGES` (the entity path's six kinds and the
catch-up, 4 lanes, seed customer / 20: lists of 2 to 11 pages, sandbox `--latency realistic`,
interleaved rounds on a loaded two-core machine): never striping (12, above every list) took
36.4 s against 24.6-26.5 s striping from 2 or 4 pages (one quiet round), and 36-39 s against
33-37 s in two loaded sweeps; striping from 3, 4, 6 or 8 pages was the same wall within the
noise (medians 32.7-37.2 s, rounds 28-45 s), while requests fell 266 (from 4 pages) -> 245-254
(from 8) -> 211 (never): a list of up to eight pages is read while the phase before it writes
(its discovery runs early and its walker reads `listing.AHEAD` pages ahead), so its walk's round
trips stay off the critical path; the lists of ten and eleven pages were where one walker lost
(N = 12 against 8: +1.5 to +3.6 s in each sweep). The small account (lists of at
most three pages) no longer meets a stripe: files 6 -> 3 requests, deals 8 -> 7 (no summary).

Offset-paginated (v1) kinds - users, leads, leads_archived, notes, files - are striped by page
arithmetic, as in the seeds, once one walker has walked the first N spans (N = `STRIPE_MIN_PAGES`):
four stripes own the spans from N x 500, N x 500 + 500, ..., then each its span + 4 x 500, and so
on. A span's first task (cursor `{"start": S}`, key `kind:S`) asks `start=S, limit=500`; a full
page hands on to the next span (`v1_next`). A page shorter than asked with `more_items_in_collection: true` does not end the span: the task hands on to the
`next_start` the server gave, inside the same span (`{"start": n, "span": S}`, key `kind:n`), asking
only up to the span's end so it never reads the next stripe's rows; the sub-page that reaches the
span's end hands on to the next span. When `next_start` and the arithmetic disagree, `next_start`
wins inside a span (the server knows where its rows are); a `next_start` at or past the span's end
means the span is done (the rows past it are the next span's, whose own task reads them). Every
sub-page is a task of its own, so each page commits its windows with its own offset and a retried
sub-page resumes at that offset; its successor's key is its `next_start`, so a retry finds it
already there. Keys never collide: a sub-page starts strictly inside its span, never on a multiple
of 500. Cost: a server that caps at c rows a page costs 500 / c tasks a span instead of one.

Offsets shift: a row deleted before a span's start while the stripes walk moves every later row
one place back, so the row at the span's first offset is on neither span (a run can land 699 of
700 notes). The walks do not try to repair that; the run's catch-up phase walks each list again,
sequentially and overlapping (`inventory.v1_step`), and writes whatever the ledger lacks.

Cursor-paginated (v2) kinds - organizations, persons, deals, deals_archived, activities - have no
page arithmetic: a v2 cursor is opaque and only reachable by walking. They are striped by ranges of
`update_time`, the one range filter every v2 list accepts (`updated_since` inclusive,
`updated_until` exclusive). A discovery task per kind (`kind:discover`) probes the list sorted by
`update_time` ascending and descending (following `next_cursor` past empty pages, until a row with
an update time or the end), cuts [oldest, newest] into four equal spans and seeds one walker per
span (`kind:s<stripe>:p0`); each walker lists its span page by page in id order, carrying the v2
cursor, and creates its own next page (`kind:s<stripe>:p<n+1>`). The first span is open below
and the last ends at the run's snapshot (`bounded_spans`), so every row WITH an update time before the snapshot falls into exactly
one span, even one outside [oldest, newest]. A row updated while the run walks gets an update time
after the snapshot and leaves every span - it is in the catch-up phase's inventory walk
(`inventory.py`), which writes it as it is then (in an open-ended last stripe it would be lost
whenever that walker had passed its id, and a later run would find it only "already here"). Ids were the alternative, but v2 lists take no id
range (only `ids=` lists of 100), and time spans need no knowledge of the id space. Equal spans
are equal work when records arrive evenly; an account that grew fast recently has a heavier last
stripe, which still walks alongside the other three rather than after them.

Rows whose `update_time` is null are in no span: a filtered list never returns them. The probes
see them - a sort puts nulls at one end (Postgres: last ascending, first descending; other stores
the other way round), so one of the two probes meets them before any timed row, whichever end it
is - and when either probe saw one, discovery seeds one more walker (`kind:nulls:p0`) over the
UNFILTERED list that writes only the rows whose `update_time` is null; the rows with a time it
passes over are their spans' (counted as `covered_by_spans` in its stats, never written or seen
twice). The cost is one extra walk of the whole list, paid only by kinds that have null-time rows.
When discovery finds no timed row at all, or a single moment, the one stripe has neither bound and
is the unfiltered list itself, so it needs no null walker. The union of the stripes therefore is
the unfiltered list: every timed row in exactly one span, every null-time row in the null walker
(tests/pipedrive/test_listing_shapes.py proves it against the sandbox's shapes). What this does
not cover: a server that drops null-time rows from sorted lists altogether (neither probe could
see them); Pipedrive's and the sandbox's lists do not.

Pipelines and stages are v2 lists without time filters, and short: each has one walker over the
whole list (`kind:s0:p0`, the shape of a stripe with neither bound).
"""
from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

from engine_core.models import Successor
from engine_core.providers.pipedrive.mapping import MalformedRow, timestamp
from engine_core.providers.pipedrive.kinds import PAGE, UNSTRIPED, V1_PATHS, V2_PATHS  # noqa: F401 - read by the listing

STRIPES = 4


# --- v1: page arithmetic ---------------------------------------------------------------------


def v1_seeds(kind: str, stripes: int = STRIPES, page: int = PAGE, walked: int | None = None) -> list[Successor]:
    """The first span of each stripe, once the list is striped: `kind:<N x 500>`, ... `kind:<(N + 3) x
    500>` with cursor `{"start": n}` (N = `walked`, default `STRIPE_MIN_PAGES`: the spans before
    are the one walker's)."""
    first = max(1, STRIPE_MIN_PAGES if walked is None else walked)  # span 0 is always the walker's
    return [Successor(f"{kind}:{(first + i) * page}", {"start": (first + i) * page}) for i in range(stripes)]


def v1_first(kind: str) -> list[Successor]:
    """A v1 kind's first task: span 0 alone (`kind:0`, cursor `{"start": 0}`). One walker goes on
    span by span; the stripes start only as the list proves long enough (`v1_next`)."""
    return [Successor(f"{kind}:0", {"start": 0})]


def v1_next(kind: str, start: int, stripes: int = STRIPES, page: int = PAGE, walked: int | None = None) -> list[Successor]:
    """The spans after the span that begins at `start`, once it ended with the API saying more.

    The list's first N spans (`walked`, default `STRIPE_MIN_PAGES`) are one walker's, span after
    span; the N-th hands on to the four stripes' first spans (`v1_seeds`: N ... N + 3); a striped
    span hands on to its stripe's next, start + stripes x page. A list of at most N pages costs one
    call a page; a longer one three more (the three stripes that do not hold the last row end on
    an empty page)."""
    first = max(1, STRIPE_MIN_PAGES if walked is None else walked)  # span 0 is always the walker's
    index = start // page
    if index < first - 1:
        return [Successor(f"{kind}:{start + page}", {"start": start + page})]
    if index == first - 1:
        return v1_seeds(kind, stripes, page, first)
    nxt = start + stripes * page
    return [Successor(f"{kind}:{nxt}", {"start": nxt})]


def v1_successors(kind: str, cursor: dict[str, Any], *, more: bool, next_start: int | None,
                  stripes: int = STRIPES, page: int = PAGE, walked: int | None = None) -> tuple[Successor, ...]:
    """Every task a v1 page hands on to (`v1_after`): none, the same span's rest, or the next
    spans (`v1_next`: the walker's next, the stripes' first, or the stripe's next)."""
    return tuple(v1_after(kind, cursor, more=more, next_start=next_start, stripes=stripes, page=page, walked=walked))


def v1_span(cursor: dict[str, Any], page: int = PAGE) -> tuple[int, int]:
    """(start, span start) of a v1 task's cursor; a span's first task carries no `span` (its own
    start). Raises ValueError naming the cursor when the start lies outside its span."""
    try:
        start = int(cursor["start"])
        span = int(cursor.get("span", start))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"not a v1 listing cursor: {cursor!r}") from None
    if span < 0 or span % page or not span <= start < span + page:
        raise ValueError(f"v1 cursor start {start} is not inside a span of {page} rows starting at {span}")
    return start, span


def v1_limit(cursor: dict[str, Any], page: int = PAGE) -> int:
    """Rows a v1 task asks for: up to its span's end, so a sub-page never reads the next span's rows
    (a span's first task asks a full page)."""
    start, span = v1_span(cursor, page)
    return span + page - start


def v1_after(kind: str, cursor: dict[str, Any], *, more: bool, next_start: int | None, stripes: int = STRIPES,
             page: int = PAGE, walked: int | None = None) -> list[Successor]:
    """The tasks a v1 page hands on to, decided by the API's fields, not by how many rows came back.

    `more` / `next_start` are the page's `more_items_in_collection` / `next_start` (the client
    fills `next_start` in as start + rows served when the server omits it). No more: the walk
    ends. More, and `next_start` inside this span: the same span goes on there (key
    `kind:<next_start>`). More, and `next_start` at or past the span's end: the next spans
    (`v1_next`). Raises ValueError when the API says more but gives no `next_start` past this
    page's start.
    """
    if not more:
        return []
    start, span = v1_span(cursor, page)
    if next_start is None or next_start <= start:
        raise ValueError(f"more_items_in_collection without a next_start past {start}")
    if next_start < span + page:
        return [Successor(f"{kind}:{next_start}", {"start": next_start, "span": span})]
    return v1_next(kind, span, stripes, page, walked)


# --- v2: update_time spans -------------------------------------------------------------------


def v2_seeds(kind: str) -> list[Successor]:
    """A v2 kind's first tasks: one walker over the whole list for a list without time filters
    (`UNSTRIPED`), else its discovery task `kind:discover` (it seeds the stripes)."""
    if kind in UNSTRIPED:
        return v2_stripe_seeds(kind, [(None, None)])
    return [Successor(f"{kind}:discover", {"discover": True})]


def rfc3339(moment: datetime) -> str:
    """`moment` in UTC as the v2 time filters take it: `2024-01-02T03:04:05Z` (seconds)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def time_spans(oldest: datetime | None, newest: datetime | None, stripes: int = STRIPES) -> list[tuple[str | None, str | None]]:
    """[since, until) spans covering everything: the first open below, the last open above.

    Boundaries are whole seconds (the filters' resolution); spans never repeat a boundary, so a
    short history yields fewer stripes rather than empty ones.
    """
    if oldest is None or newest is None or newest <= oldest:
        return [(None, None)]
    start = oldest.replace(microsecond=0)
    width = (newest - start).total_seconds() + 1
    cuts: list[datetime] = []
    for i in range(1, stripes):
        cut = start + timedelta(seconds=int(width * i / stripes))
        if cut > start and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
    bounds: list[str | None] = [None, *(rfc3339(c) for c in cuts), None]
    return list(zip(bounds[:-1], bounds[1:]))


def bounded_spans(spans: list[tuple[str | None, str | None]], lower: str | None, upper: str | None) -> list[tuple[str | None, str | None]]:
    """`spans` held inside a run's bounds: the first span starts at `lower` (a sync's
    `since` minus the margin; None: open below) and the last ends at `upper` (the run's snapshot,
    exclusive; None: open above); cuts outside (lower, upper) are dropped. A row updated after the
    snapshot is in no span: the catch-up phase lists it (so a row updated while the walkers walk
    moves out of every span instead of into one a walker has passed)."""
    cuts = [c for _, c in spans[:-1] if c is not None]
    cuts = [c for c in cuts if (lower is None or _instant(c) > _instant(lower)) and (upper is None or _instant(c) < _instant(upper))]
    bounds: list[str | None] = [lower, *cuts, upper]
    return list(zip(bounds[:-1], bounds[1:]))


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


NULLS = "nulls"  # the stripe name of the walker over null-time rows
SORTED = {"sort_by": "update_time", "sort_direction": "asc"}  # the discovery's first request's order


def v2_stripe_seeds(kind: str, spans: list[tuple[str | None, str | None]], *, nulls: bool = False) -> list[Successor]:
    """One walker per span (`kind:s<i>:p0`), plus - when discovery met rows whose `update_time`
    is null and the spans are bounded - one walker over the unfiltered list for them
    (`kind:nulls:p0`). A single unbounded span is the unfiltered list already: no null walker."""
    seeds = [
        Successor(f"{kind}:s{i}:p0", {"stripe": i, "since": since, "until": until, "cursor": None, "page": 0})
        for i, (since, until) in enumerate(spans)
    ]
    if nulls and spans != [(None, None)]:
        seeds.append(Successor(f"{kind}:{NULLS}:p0", {"stripe": NULLS, "since": None, "until": None, "cursor": None, "page": 0}))
    return seeds


def v2_next(kind: str, cursor: dict[str, Any], next_cursor: str, rows: int = 0) -> Successor:
    """The walker's next page: same stripe and bounds, the API's `next_cursor`, page + 1. A
    counting walker's (`count` in its cursor: the rows its pages before listed) adds the `rows`
    this page listed."""
    page = int(cursor.get("page", 0)) + 1
    stripe = cursor["stripe"]
    key = f"{kind}:{NULLS}:p{page}" if stripe == NULLS else f"{kind}:s{stripe}:p{page}"
    nxt = {"stripe": stripe, "since": cursor.get("since"), "until": cursor.get("until"), "cursor": next_cursor, "page": page}
    if cursor.get("sorted"):
        nxt["sorted"] = True  # a cursor is only valid in the order it was made in
        nxt["before"] = cursor.get("before")
    if "count" in cursor:
        nxt["count"] = int(cursor["count"]) + rows
    return Successor(key, nxt)


def is_null_walker(cursor: dict[str, Any]) -> bool:
    """Whether the cursor is the null walker's (rows whose `update_time` is null)."""
    return cursor.get("stripe") == NULLS


def has_null_time(row: Any) -> bool:
    """A listed row no `updated_since`/`updated_until` filter returns: its `update_time` is null
    (or absent). A malformed time is not null: the server has a time for it, so a span has it."""
    return isinstance(row, dict) and row.get("update_time") in (None, "")


def v2_whole_seed(kind: str, since: str | None, before: str | None = None, *, count: bool = False) -> Successor:
    """The one walker of a list its discovery's first page held, or too short to stripe
    (`kind:s0:p0`): it asks exactly the discovery's request (sorted by `update_time` ascending,
    from `since`), so it takes the page the discovery kept (`prefetch.Prefetch.hold`) instead of
    asking again, and follows that order's cursor; null-time rows are in it (an unfiltered list)
    and no other walker is needed. `before`: the run's snapshot - rows updated at or after it
    are left to the catch-up (`is_before`), as a span's. `count`: the walker counts the rows its
    pages list (cursor `count`, carried by `v2_next`), and its last page says how many the whole
    list held - the list's own count, without a summary call."""
    cursor: dict[str, Any] = {"stripe": 0, "since": since, "until": None, "cursor": None, "page": 0,
                              "sorted": True, "before": before}
    if count:
        cursor["count"] = 0
    return Successor(f"{kind}:s0:p0", cursor)


def is_before(row: Any, before: str | None) -> bool:
    """Whether a whole-list walker writes `row`: no snapshot bound, a null-time row, or a row
    updated before the snapshot `before` (a later one is the catch-up's, as it is for a span)."""
    if before is None or has_null_time(row) or not isinstance(row.get("update_time"), str):
        return True
    try:
        return _instant(row["update_time"]) < _instant(before)
    except ValueError:
        return True


def v2_params(cursor: dict[str, Any]) -> dict[str, str]:
    """The filters of a v2 walker's cursor: `updated_since` (inclusive) and `updated_until`
    (exclusive) for the bounds it has (none: the unfiltered list), and the discovery's sort for the
    walker of a list that fit its first page (`v2_whole_seed`)."""
    params: dict[str, str] = {}
    if cursor.get("sorted"):
        params.update(SORTED)
    if cursor.get("since"):
        params["updated_since"] = cursor["since"]
    if cursor.get("until"):
        params["updated_until"] = cursor["until"]
    return params


# --- emails: discovery pages and tasks of ten deals --------------------------------------------

DEALS_PER_TASK = 10
MAIL_SOURCES: dict[str, str] = {"deals": "/api/v2/deals", "deals_archived": "/api/v2/deals/archived"}


def email_seeds() -> list[Successor]:
    """One discovery walker per deal list (active and archived deals carry mail alike). Each walks
    its whole list, unfiltered (null-time deals included), and hands on whenever the page carries a
    `next_cursor` - rows or none (`email_discovery_next`; the walk ends only on a null cursor)."""
    return [
        Successor(f"emails:discover:{source}:p0", {"discover": source, "cursor": None, "page": 0})
        for source in MAIL_SOURCES
    ]


def email_discovery_next(cursor: dict[str, Any], next_cursor: str) -> Successor:
    """The email discovery's next page of the deal list it walks (`source`: active or
    archived), keyed by page number so a retried page finds its successor already there."""
    page = int(cursor.get("page", 0)) + 1
    source = cursor["discover"]
    return Successor(f"emails:discover:{source}:p{page}", {"discover": source, "cursor": next_cursor, "page": page})


def email_tasks(cursor: dict[str, Any], deal_ids: list[int], per_task: int = DEALS_PER_TASK) -> list[Successor]:
    """Tasks of ten deals; the key names the discovery page and the chunk, so a retried discovery
    page finds its tasks already there."""
    source, page = cursor["discover"], int(cursor.get("page", 0))
    return [
        Successor(f"emails:{source}:p{page}:c{j // per_task}", {"deals": deal_ids[j : j + per_task]})
        for j in range(0, len(deal_ids), per_task)
    ]


# --- sizing a v2 list from the discovery's first page -------------------------------------------


def update_time(row: Any) -> datetime | None:
    """A listed row's `update_time` (None: null, absent or unreadable)."""
    try:
        return timestamp(row, "update_time")
    except MalformedRow:
        return None


def first_time(rows: Any) -> tuple[datetime | None, bool]:
    """(the update time of the first row that has one, whether a null-time row came before it)."""
    nulls = False
    for row in rows:
        if has_null_time(row):
            nulls = True
            continue
        moment = update_time(row)
        if moment is not None:
            return moment, nulls
    return None, nulls


# A list is striped from this many pages on (STRIPE_MIN_PAGES x PAGE rows for a v2 list, estimated
# from its discovery's first page: `estimate_rows`); below it one walker walks it (module docstring).
STRIPE_MIN_PAGES = 8


def stripe_min_rows() -> int:
    """The rows from which a v2 list is striped: `STRIPE_MIN_PAGES` pages of `PAGE`."""
    return STRIPE_MIN_PAGES * PAGE


def estimate_rows(rows: Any, oldest: datetime, upto: datetime) -> int | None:
    """The rows of a list whose first page sorted by `update_time` (`rows`, from `oldest`) holds
    `len(rows)` rows up to the page's last update time, if the rest arrive at that page's pace up to
    `upto` (the run's snapshot: no row is newer). An overestimate when the list's newest row is
    older than `upto`. None when the page spans no time (its rows tell no pace)."""
    last = next((t for t in (update_time(r) for r in reversed(rows) if not has_null_time(r)) if t is not None), None)
    if last is None or last <= oldest:
        return None
    return math.ceil(len(rows) * max((upto - oldest).total_seconds(), 0.0) / (last - oldest).total_seconds())
