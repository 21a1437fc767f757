"""What a full run will cost at the source, before it starts (`migrate plan TENANT`).

`estimate(client, kinds=..., share=..., burst_limit=...)` counts each list's rows with a few cheap
calls, then applies the engine's own listing rules to those counts:

Counting (what the plan itself spends: `Estimate.spent`). A v2 list: one page of 500 sorted by
`update_time` (`listing.discover`'s first request): when it is the list's last, the count is
exact; else the descending probe's newest update and the page's pace give an estimate
(`stripes.estimate_rows`, up to the newest update instead of now). A v1 list: its first page;
when there is more, pages of one row at offsets 500 x 2^k find the last page, and that page read
whole gives the exact count (about 2 log2(pages) calls of the list's cost). Mail: the two deal lists
walked with `email_messages_count` (deals with mail and their messages, exact; only when `emails`
is planned). Opt-in kinds (participants, followers, deal history, file contents): one call per
record they fan out over, from the counts above.

The engine's requests per kind, from those counts (`striped`: `stripes.STRIPE_MIN_PAGES`, a v2
list sized as its discovery will size it, `sized_by_discovery`): a list one walker walks (up to
that many pages, v1; fewer pages' rows, v2), one call per page
(500 rows, 100 for files); a striped v2 list two probes, one call per 500 rows and a partial page
per stripe (4); a striped v1 list one call per page and the three stripes' empty last pages; the
deals summary only when active deals are striped (a walked list counts itself); field lists 7, the company once; deal products one call per 100 deals; the
catch-up one walk of every list; mail one listing per deal with mail and one body per message
(plus the discovery's walk of both deal lists); file contents one download per file (files are
listed 100 a call). Parent probes: none where the run leaves a missing parent to its catch-up's
walk (`walk_proof.left_to_catchup`: every parent of the kinds the catch-up walks, when the run
takes the parent's lists); else one request a page per parent kind the page links to
(`Kind.depends_on` among the probed kinds) - an upper estimate that holds on an account with
deleted parents (the sandbox's 2%); an account without any spends none. The deals the catch-up
writes for the first time (their person or organization missing after the walks: the sample's
share) have their product lines listed by it, one call per 100 deals.

Tokens are each request's `x-token-cost` (`kinds.TOKEN_COSTS`). Days: tokens / (the account's
`x-daily-ratelimit-token-limit` x the engine's daily share), per kind and in total (None when the
source sends no daily limit). Wall time: the longer of the burst floor (requests / (burst limit
per 2 s)) and the round trips: each kind's requests x the median round trip of their class, as the
counting itself measured it (lists, parent probes by id or `ids=`, a deal's mail listing and up to
five mail bodies of the deal with the most mail), over the requests a run keeps in flight
(`IN_FLIGHT_PER_SLOT` x the lane width). The counting is paced to half the burst limit
(`PACE_SHARE`), so it does not meet the burst the company's other integrations share.
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx

from engine_core.config import Settings
from engine_core.providers.pipedrive import kinds as K
from engine_core.providers.pipedrive import stripes, walk_proof, writers
from engine_core.providers.pipedrive.client import tls_context
from engine_core.providers.pipedrive.errors import ItemRefused
from engine_core.providers.pipedrive.retry import rate_observation
from engine_core.providers.pipedrive.meter import token_cost
from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.mapping import MalformedRow

PAGE = K.PAGE
IDS_PER_CALL = 100  # `deal_ids` / `ids` cap
BODY_TOKENS = 2  # a mail body by id (v1 single)
V1_EMPTY_ENDS = 3  # a striped v1 list: three of its four stripes end on an empty page
STRIPE_PARTIALS = 4  # a striped v2 list: each stripe ends on a partial page
PROBES = 2  # a striped v2 list's discovery: the two probes
BURST_WINDOW_SECONDS = 2.0
# The counting's own pace: half the burst limit, the rest left to the company's other integrations
# (82 unpaced requests met the 80-per-2-s burst on a source without latency).
PACE_SHARE = 0.5
# Requests a run keeps in flight per lane slot, on average: a slot's task asks up to four at a time
# (`record_lists`/`emails` FETCH_THREADS) in rounds that wait for their slowest. Measured on the small
# sandbox account with realistic latency: 1,464 requests whose round trips, at the medians the plan
# measured, add up to about 1,200 s took 150 s with four lane slots (8 in flight).
IN_FLIGHT_PER_SLOT = 2.0
MAIL_BODY_SAMPLES = 5
# the round trip a class of requests is taken at when the counting measured none of it
FALLBACK_CLASS = {"single": "list", "mail listing": "list", "body": "single"}


@dataclass
class KindCost:
    """One kind's figures: `rows` (counted or estimated: `exact`), the run's `requests` and
    `tokens` at the source, `days` at the engine's daily share (None: no daily limit known),
    `opt_in` (a kind a run leaves out unless asked) and `seconds` (its requests' round trips added
    up, at the medians the counting measured). `unit`: what `rows` counts ("rows"; "field lists" for
    `fields`, whose definitions are only known once the lists are read: the run's figure counts
    definitions)."""

    kind: str
    rows: int
    exact: bool
    requests: int = 0
    tokens: int = 0
    days: float | None = None
    opt_in: bool = False
    seconds: float = 0.0  # its requests' round trips added up, at the measured medians (`round_trips`)
    unit: str = "rows"


@dataclass
class Estimate:
    """A run's cost before it starts: per kind (`kinds`, planned; `opt_in`, each opt-in kind's
    price if it were added), the totals of the planned kinds, days at the daily share, wall
    seconds (the longer of the burst floor and the round trips over `in_flight`), the median round
    trip per request class the counting measured (`round_trips`, seconds), and what counting cost
    (`spent`: requests, tokens)."""

    kinds: list[KindCost]
    opt_in: list[KindCost]
    daily_limit: int | None
    share: float
    burst_limit: int
    spent: dict[str, int] = field(default_factory=dict)
    sync_floor: KindCost | None = None  # a sync of the planned kinds when nothing changed (`estimate`)
    round_trips: dict[str, float] = field(default_factory=dict)
    in_flight: float = 1.0

    @property
    def requests(self) -> int:
        """Requests of the planned kinds."""
        return sum(k.requests for k in self.kinds)

    @property
    def tokens(self) -> int:
        """Tokens of the planned kinds."""
        return sum(k.tokens for k in self.kinds)

    @property
    def days(self) -> float | None:
        """Days of the planned kinds' tokens at the daily share (None: no daily limit known)."""
        return days_of(self.tokens, self.daily_limit, self.share)

    @property
    def burst_seconds(self) -> float:
        """Seconds the planned requests take at the burst limit (the burst floor)."""
        return self.requests * BURST_WINDOW_SECONDS / max(self.burst_limit, 1)

    @property
    def trip_seconds(self) -> float:
        """Seconds the planned requests' round trips take with `in_flight` of them at a time."""
        return sum(k.seconds for k in self.kinds) / max(self.in_flight, 1.0)

    @property
    def wall_seconds(self) -> float:
        """The run's wall time at the source: the longer of the burst floor and the round trips."""
        return max(self.burst_seconds, self.trip_seconds)


def days_of(tokens: int, daily_limit: int | None, share: float) -> float | None:
    """`tokens` in days of `daily_limit` x `share`; None without a limit."""
    if not daily_limit or share <= 0:
        return None
    return tokens / (daily_limit * share)


class Counter:
    """The client the counting goes through: counts its own requests and tokens, times each
    answered request by class ("list", "single", "mail listing", "body"; `trips`, seconds), and
    paces them to `burst_limit` x PACE_SHARE per BURST_WINDOW_SECONDS (0: unpaced). `clock` and
    `sleep` are time.monotonic and time.sleep unless a test gives its own."""

    def __init__(self, client: Any, burst_limit: int = 0, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.requests = 0
        self.tokens = 0
        self.trips: dict[str, list[float]] = {}
        self.pace = max(1, int(burst_limit * PACE_SHARE)) if burst_limit > 0 else 0
        self.sent: deque[float] = deque()
        self.clock, self.sleep = clock, sleep

    def _call(self, kind: str, tokens: int, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """`fn(*args, **kw)` once the pace allows, counted and timed as `kind`."""
        while self.pace:
            now = self.clock()
            while self.sent and self.sent[0] <= now - BURST_WINDOW_SECONDS:
                self.sent.popleft()
            if len(self.sent) < self.pace:
                self.sent.append(now)
                break
            self.sleep(self.sent[0] + BURST_WINDOW_SECONDS - now + 0.001)
        self.requests += 1
        self.tokens += tokens
        started = self.clock()
        out = fn(*args, **kw)
        self.trips.setdefault(kind, []).append(self.clock() - started)
        return out

    def list_v2(self, path: str, params: dict[str, Any], **kw: Any) -> Any:
        """One v2 page, counted."""
        return self._call("list", K.TOKEN_COSTS[path], self.client.list_v2, path, params, **kw)

    def get(self, path: str, params: Any = None, **kw: Any) -> Any:
        """One GET (a parent by id, or a list's `ids=`), counted at its cost."""
        return self._call("single", token_cost(path), self.client.get, path, params, **kw)

    def list_v1(self, path: str, params: dict[str, Any] | None = None, **kw: Any) -> Any:
        """One v1 page, counted."""
        return self._call("list", K.TOKEN_COSTS[path], self.client.list_v1, path, params, **kw)

    def mail_messages(self, deal_id: int, limit: int) -> Any:
        """The first `limit` of a deal's mail messages (no bodies), counted."""
        return self._call("mail listing", K.TOKEN_COSTS["mailMessages"], self.client.mail_messages, deal_id, 0, limit)

    def mail_body(self, message_id: int) -> Any:
        """One mail message with its body, counted."""
        return self._call("body", BODY_TOKENS, self.client.mail_body, message_id)

    def round_trips(self) -> dict[str, float]:
        """The median round trip per class (seconds), a class not measured taken at another's
        (`FALLBACK_CLASS`: a body at a GET by id, the rest at a list page)."""
        out = {k: statistics.median(v) for k, v in self.trips.items() if v}
        for kind in ("list", "single", "mail listing", "body"):
            seen: set[str] = set()
            other = kind
            while other not in out and other in FALLBACK_CLASS and other not in seen:
                seen.add(other)
                other = FALLBACK_CLASS[other]
            out.setdefault(kind, out.get(other, 0.0))
        return out


def count_v2(c: Counter, path: str) -> tuple[int, bool, tuple[Any, ...]]:
    """(rows of a v2 list, exact, its first page's rows): exact when its first sorted page holds
    it, else estimated from that page's pace up to the newest update (module docstring)."""
    first = c.list_v2(path, dict(stripes.SORTED), limit=PAGE)
    if not first.more or not first.next_cursor:
        return len(first.rows), True, first.rows
    oldest, _ = stripes.first_time(first.rows)
    newest_page = c.list_v2(path, {"sort_by": "update_time", "sort_direction": "desc"}, limit=5)
    newest, _ = stripes.first_time(newest_page.rows)
    if oldest is None or newest is None:
        return len(first.rows) + 1, False, first.rows
    rows = stripes.estimate_rows(first.rows, oldest, newest)
    return max(rows or 0, len(first.rows) + 1), False, first.rows


def sized_by_discovery(first: Sequence[Any], now: datetime | None = None) -> int:
    """The rows the engine's discovery will take a v2 list longer than its first page for
    (`listing.discover`: that page's pace up to the run's snapshot, about now), which decides
    whether it stripes; a page that tells no pace counts as large (the discovery then stripes)."""
    oldest, _ = stripes.first_time(first)
    sized = stripes.estimate_rows(first, oldest, now or datetime.now(timezone.utc)) if oldest is not None else None
    return sys.maxsize if sized is None else sized


def count_v1(c: Counter, path: str, size: int = PAGE) -> tuple[int, bool, tuple[Any, ...]]:
    """(rows of a v1 list, exact, its first page's rows): the first page, then one-row pages at 500 x 2^k to find the last
    page, bisected, and that page read whole."""
    first = c.list_v1(path, start=0, limit=size)
    if not first.more:
        return len(first.rows), True, first.rows

    def has(page: int) -> bool:
        return bool(c.list_v1(path, start=page * size, limit=1).rows)

    low, high = 1, 2  # page `low` has rows (page 1: the first said more); find a page without
    while has(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if has(mid) else (low, mid)
    last = c.list_v1(path, start=low * size, limit=size)
    return low * size + len(last.rows), True, first.rows


def count_mail(c: Counter) -> tuple[int, int]:
    """(deals with mail, their messages) from both deal lists' `email_messages_count`; then the
    deal with the most mail is listed and up to MAIL_BODY_SAMPLES of its bodies read, for their
    round trips (`Counter.trips`; a body the token may not read is passed over)."""
    deals = messages = 0
    most: tuple[int, Any] = (0, None)
    for path in (K.BY_NAME["deals"].path, K.BY_NAME["deals_archived"].path):
        cursor = None
        while True:
            page = c.list_v2(path, {"include_fields": "email_messages_count"}, cursor=cursor, limit=PAGE)
            for row in page.rows:
                n = row.get("email_messages_count") if isinstance(row, dict) else None
                if isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    deals += 1
                    messages += n
                    if n > most[0]:
                        most = (n, row.get("id"))
            if not page.more or not page.next_cursor:
                break
            cursor = page.next_cursor
    if isinstance(most[1], int):
        sample_mail(c, most[1])
    return deals, messages


def sample_mail(c: Counter, deal_id: int) -> None:
    """One listing of `deal_id`'s mail and up to MAIL_BODY_SAMPLES bodies from it, timed by `c`
    (a deal or body the source refuses is passed over: the samples are for round trips only)."""
    try:
        page = c.mail_messages(deal_id, MAIL_BODY_SAMPLES)
    except ItemRefused:
        return
    for row in page.rows[:MAIL_BODY_SAMPLES]:
        data = row.get("data") if isinstance(row, dict) else None
        message_id = data.get("id") if isinstance(data, dict) else None
        if isinstance(message_id, int) and not isinstance(message_id, bool):
            try:
                c.mail_body(message_id)
            except ItemRefused:
                continue


def pages(rows: int, per: int = PAGE) -> int:
    """List calls for `rows` (at least one)."""
    return max(1, math.ceil(rows / per))


def striped(kind: K.Kind, rows: int, sized: int | None = None) -> bool:
    """Whether the engine stripes a list of `rows` (`stripes.STRIPE_MIN_PAGES`): a v1 list of more
    pages than one walker walks, a v2 list (with time filters) longer than a page whose discovery
    sizes it (`sized`, `sized_by_discovery`; None: `rows`) at that many pages' rows or more."""
    if kind.api == K.V1:
        return pages(rows, K.page_of(kind.name)) > stripes.STRIPE_MIN_PAGES
    return kind.striped and rows > PAGE and (rows if sized is None else sized) >= stripes.stripe_min_rows()


def listing(kind: K.Kind, rows: int, sized: int | None = None) -> int:
    """The requests the engine's listing of a kind makes for `rows` (module docstring; `sized`:
    `striped`'s)."""
    n = pages(rows, K.page_of(kind.name))
    if not striped(kind, rows, sized):
        return n
    if kind.api == K.V1:
        return n + V1_EMPTY_ENDS
    return PROBES + n + STRIPE_PARTIALS


SAMPLE_IDS = 300  # parent ids the samples ask about, per parent kind (`ids=` lists of 100; by id for leads: 40)
SAMPLE_GETS = 40


def parent_refs(kind: str, rows: Sequence[Any]) -> tuple[int, dict[str, set[str]]]:
    """(rows mapped, the parents they name per parent ledger kind) of a sample of `kind`'s rows, as
    the engine's mapper reads them (`Mapped.parents`)."""
    mapper = K.MAPPERS.get(kind)
    out: dict[str, set[str]] = {}
    mapped = 0
    if mapper is None:
        return 0, out
    book = FieldBook()
    for row in rows:
        try:
            m = mapper(row, "plan", book)
        except (MalformedRow, KeyError, TypeError, ValueError):
            continue
        mapped += 1
        for ref in m.parents:
            out.setdefault(ref.parent_kind, set()).add(ref.source_id)
    return mapped, out


def missing_ids(c: Counter, parent: str, ids: set[str]) -> set[str]:
    """Which of `ids` (a sample, capped) the source does not have, asked as the engine's probe
    asks (`writers.questions`: an `ids=` list, or by id)."""
    kind = K.BY_NAME.get(parent)
    if kind is None or parent not in K.PARENT_PATHS or not ids:
        return set()
    cap = SAMPLE_IDS if kind.batch_paths else SAMPLE_GETS
    pairs = [(parent, sid) for sid in sorted(ids)[:cap]]
    answers: dict[tuple[str, str], bool] = {}
    for question in writers.questions(pairs):
        answers.update(writers._request(c, question, None))
    return {sid for (_, sid), exists in answers.items() if not exists}


def probe_cost(kind: K.Kind, rows: int, sample: tuple[int, dict[str, set[str]]], missing: dict[str, set[str]],
               asked: dict[str, set[str]], planned: Sequence[str]) -> tuple[int, int]:
    """(requests, tokens) of a kind's parent probes over its pages. The run asks each missing parent
    once (`writers.SourceAnswers`): of the parents the kind's sample names that the source lacks
    (`missing`), those no earlier kind asked (`asked`, updated here), scaled from the sample to the
    kind's rows, are asked page by page - one `ids=` list a page for two or more (two for deals:
    the archived list too), a GET by id for one (leads always by id); a page's count is taken as
    Poisson with the kind's mean per page."""
    mapped, refs = sample
    if not mapped:
        return 0, 0
    requests = tokens = 0.0
    n_pages = pages(rows)
    for parent, ids in refs.items():
        entry = K.BY_NAME.get(parent)
        if entry is None or parent not in planned or parent not in K.PARENT_PATHS:
            continue
        if walk_proof.left_to_catchup(planned, kind.name, parent):
            continue  # the catch-up's walk settles it, no request
        gone = ids & missing.get(parent, set())
        new = gone - asked.setdefault(parent, set())
        asked[parent] |= gone
        total = len(new) * max(rows, mapped) / mapped  # the kind's new missing parents, scaled to its rows
        if total <= 0:
            continue
        single = K.TOKEN_COSTS["v1 single" if entry.api == K.V1 else "v2 single"]
        if not entry.batch_paths:
            requests += total
            tokens += total * single
            continue
        # a page's new missing parents of this kind, Poisson with the page's mean: one by id, or a list
        mean = total / n_pages
        one = mean * math.exp(-mean)
        more = max(0.0, 1.0 - math.exp(-mean) - one)
        requests += n_pages * (one + more * len(entry.batch_paths))
        tokens += n_pages * (one * single + more * sum(K.TOKEN_COSTS[p] for p in entry.batch_paths))
    return round(requests), round(tokens)


def waiting_share(sample: tuple[int, dict[str, set[str]]], missing: dict[str, set[str]], planned: Sequence[str]) -> float:
    """The share of a kind's sampled rows (`parent_refs`' count) naming a parent the source lacks
    (`missing`), of a planned kind: an upper bound (a row naming two counts once per parent)."""
    mapped, refs = sample
    if not mapped:
        return 0.0
    named = sum(len(ids & missing.get(parent, set())) for parent, ids in refs.items() if parent in planned)
    return min(1.0, named / mapped)


def estimate(client: Any, *, kinds: Sequence[str], share: float, burst_limit: int,
             daily_limit: int | None = None, lane_width: int | None = None,
             counter: Counter | None = None, walked: Sequence[str] | None = None) -> Estimate:
    """The cost of a full run of `kinds` (module docstring). `walked`: the kinds the run's catch-up
    walks (None: `kinds`; a resumed run's own kinds when `kinds` are only those of its phases not
    closed, since its catch-up walks every list of the run). `client`: the provider's
    `PipedriveClient` (its requests are the counting's, `Estimate.spent`); `share`: the engine's
    daily share (MIGRATE_DAILY_TOKEN_SHARE); `burst_limit`: requests per 2 s; `daily_limit`: the
    account's `x-daily-ratelimit-token-limit` (None: not known); `lane_width`: the run's lane
    slots (None: MIGRATE_LANE_WIDTH's); `counter`: the `Counter` to count through (a test's clock),
    else one over `client` paced at `burst_limit`. Raises as the client does."""
    c = counter if counter is not None else Counter(client, burst_limit)
    planned = list(kinds)
    rows: dict[str, tuple[int, bool]] = {}
    listed = [k for k in K.KINDS if k.paging in (K.OFFSET, K.CURSOR)]
    samples: dict[str, tuple[int, dict[str, set[str]]]] = {}
    sizes: dict[str, int] = {}  # a v2 list's rows as its discovery will size them (`sized_by_discovery`)
    for k in listed:
        n, exact, first = count_v2(c, k.path) if k.api == K.V2 else count_v1(c, k.path, K.page_of(k.name))
        rows[k.name] = (n, exact)
        if k.api == K.V2 and n > PAGE:
            sizes[k.name] = sized_by_discovery(first)
        samples[k.name] = parent_refs(k.name, first)
    named: dict[str, set[str]] = {}
    for name, (_, refs) in samples.items():
        if name in planned:
            for parent, ids in refs.items():
                named.setdefault(parent, set()).update(ids)
    missing = {parent: missing_ids(c, parent, ids) for parent, ids in named.items() if parent in planned}
    asked: dict[str, set[str]] = {}
    mail_deals, messages = count_mail(c) if "emails" in planned else (0, 0)
    deal_count = rows["deals"][0] + rows["deals_archived"][0]
    trip = c.round_trips()
    out: list[KindCost] = [KindCost("start", 1, True, 1, K.TOKEN_COSTS["v1 single"], seconds=trip["single"])]
    field_paths = [*K.V2_FIELD_LISTS.values(), *K.V1_FIELD_LISTS.values()]
    costs: dict[str, KindCost] = {}
    for k in K.KINDS:
        if k.name == "fields":
            costs[k.name] = KindCost(k.name, len(field_paths), True, len(field_paths),
                                     sum(K.FIELD_LIST_COSTS[p] for p in field_paths),
                                     seconds=len(field_paths) * trip["list"], unit="field lists")
        elif k.name in rows:
            n, exact = rows[k.name]
            req = listing(k, n, sizes.get(k.name))
            tok = req * k.cost
            if k.name in K.SUMMARY_PATHS and striped(k, n, sizes.get(k.name)):
                req, tok = req + 1, tok + K.TOKEN_COSTS[K.SUMMARY_PATHS[k.name]]
            preq, ptok = probe_cost(k, n, samples[k.name], missing, asked, planned)
            costs[k.name] = KindCost(k.name, n, exact, req + preq, tok + ptok,
                                     seconds=req * trip["list"] + preq * trip["single"])
        elif k.paging == K.BATCH:
            req = pages(deal_count, IDS_PER_CALL)
            costs[k.name] = KindCost(k.name, deal_count, rows["deals"][1], req, req * k.cost, seconds=req * trip["list"])
        elif k.name == "emails":
            walk = pages(rows["deals"][0]) + pages(rows["deals_archived"][0])
            req = walk + mail_deals + messages
            tok = (pages(rows["deals"][0]) * K.BY_NAME["deals"].cost + pages(rows["deals_archived"][0])
                   * K.BY_NAME["deals_archived"].cost + mail_deals * k.cost + messages * BODY_TOKENS)
            costs[k.name] = KindCost(k.name, messages, True, req, tok, seconds=walk * trip["list"]
                                     + mail_deals * trip["mail listing"] + messages * trip["body"])
        elif k.paging == K.DOWNLOAD:  # file contents: one download per file
            files = rows.get("files", (0, True))
            costs[k.name] = KindCost(k.name, files[0], files[1], files[0], files[0] * k.cost,
                                     seconds=files[0] * trip["single"])
        elif k.paging == K.FAN_OUT:  # an opt-in per-record list: one call per record it fans out over
            over = deal_count if k.name != "followers" else deal_count + rows["persons"][0] + rows["organizations"][0]
            costs[k.name] = KindCost(k.name, over, False, over, over * k.cost, seconds=over * trip["list"])
        costs[k.name].opt_in = not k.default if k.name in costs else False
    if "fields" not in planned and any(n in K.ENTITY_OF_KIND for n in planned):
        # no `fields` kind, yet a kind with custom fields maps them by the definitions: the run reads
        # every field list once before its first such page (`provider._fields_ahead`)
        book = costs["fields"]
        out[0].requests, out[0].tokens = out[0].requests + book.requests, out[0].tokens + book.tokens
        out[0].seconds += book.seconds
    # the catch-up walks the run's lists, and the lists it walks only to settle parents (`proof_lists`)
    walks = list(walked) if walked is not None else planned
    proof = walk_proof.proof_lists(walks)
    catchup_kinds = [n for n in K.CATCHUP_ORDER if (n in walks or n in proof) and n in rows]
    catchup = KindCost("catchup", sum(rows[n][0] for n in catchup_kinds if n in walks),
                       all(rows[n][1] for n in catchup_kinds))
    walk = [0, 0]  # a sync's walk: the run's lists only (it asks the source instead)
    for n in catchup_kinds:
        calls = pages(rows[n][0], K.page_of(n))
        catchup.requests += calls
        catchup.tokens += calls * K.BY_NAME[n].cost
        if n in planned:
            walk = [walk[0] + calls, walk[1] + calls * K.BY_NAME[n].cost]
    if "deal_products" in walks and "deals" in catchup_kinds:
        # the deals written by the catch-up (a parent missing after the walks): their lines, 100 a call
        late = round(rows["deals"][0] * waiting_share(samples["deals"], missing, walks))
        catchup.requests += pages(late, IDS_PER_CALL) if late else 0
        catchup.tokens += (pages(late, IDS_PER_CALL) if late else 0) * K.BY_NAME["deal_products"].cost
    catchup.seconds = catchup.requests * trip["list"]
    out += [costs[n] for n in planned if n in costs] + [catchup]
    opt_in = [costs[k.name] for k in K.KINDS if not k.default and k.name in costs and k.name not in planned]
    for kc in (*out, *opt_in):
        kc.days = days_of(kc.tokens, daily_limit, share)
    # a sync of the same kinds when nothing changed: the start, the field lists and the catch-up's
    # one walk of every list (whole: it finds deletions by what a list no longer serves); mail,
    # fan-outs and probes come on top as more changed
    floor = KindCost("sync", 0, True, out[0].requests + costs["fields"].requests * ("fields" in planned)
                     + walk[0], out[0].tokens + costs["fields"].tokens * ("fields" in planned) + walk[1])
    floor.days = days_of(floor.tokens, daily_limit, share)
    width = lane_width if lane_width is not None else Settings.from_env().lane_width
    return Estimate(out, opt_in, daily_limit, share, burst_limit, {"requests": c.requests, "tokens": c.tokens},
                    sync_floor=floor, round_trips=trip, in_flight=IN_FLIGHT_PER_SLOT * width)


# The account a run's progress is weighed at before its own counts are known (`reference_requests`):
# the seeds' customer, as the sandbox's "seed-customer" scale builds it (~400,000 rows; 90,000 emails
# on 30,788 deals with mail; 8% of deals and 20% of leads archived).
REFERENCE_ROWS: dict[str, int] = {
    "users": 60, "pipelines": 5, "stages": 30, "organizations": 40000, "products": 600, "persons": 110000,
    "deals": 57040, "deals_archived": 4960, "leads": 14400, "leads_archived": 3600, "activities": 100000,
    "notes": 70000, "files": 12000,
}
REFERENCE_MAIL = (30788, 90000)  # (deals with mail, their messages)
# A written row's wall time in requests' wall time: the email phase keeps ~37 requests/s at a burst
# limit of 80 per 2 s, the list phases write ~500 rows/s with realistic latency (bench/README.md:
# "email phase", "entity path"), so a row costs about what 0.075 requests do. Without it the list
# phases, which are bound by their writes, not their few list pages, would weigh almost nothing.
ROW_IN_REQUESTS = 37 / 500


def reference_weights() -> dict[str, float]:
    """What each kind (and "catchup") costs a run at the REFERENCE_ROWS account, in requests: the
    engine's requests by the same rules as `estimate` (without parent probes), plus each written
    row at ROW_IN_REQUESTS. `migrate status` weighs a run's phases by these (a phase's share of
    the run is its kinds' share: mail about four fifths of a default run, as the plan shows).
    Every kind of the provider has a weight of at least 1."""
    rows = dict(REFERENCE_ROWS)
    deals = rows["deals"] + rows["deals_archived"]
    mail_deals, messages = REFERENCE_MAIL
    out: dict[str, float] = {}
    for k in K.KINDS:
        if k.name == "fields":
            out[k.name] = len(K.V2_FIELD_LISTS) + len(K.V1_FIELD_LISTS)
        elif k.name in rows:
            requests = listing(k, rows[k.name]) + (1 if k.name in K.SUMMARY_PATHS and striped(k, rows[k.name]) else 0)
            out[k.name] = requests + rows[k.name] * ROW_IN_REQUESTS
        elif k.paging == K.BATCH:
            out[k.name] = pages(deals, IDS_PER_CALL) + deals * ROW_IN_REQUESTS
        elif k.name == "emails":
            walk = pages(rows["deals"]) + pages(rows["deals_archived"])
            out[k.name] = walk + mail_deals + messages + messages * ROW_IN_REQUESTS
        elif k.paging == K.DOWNLOAD:
            out[k.name] = rows["files"] * (1 + ROW_IN_REQUESTS)
        elif k.paging == K.FAN_OUT:
            over = deals if k.name != "followers" else deals + rows["persons"] + rows["organizations"]
            out[k.name] = over * (1 + ROW_IN_REQUESTS)
        else:
            out[k.name] = 1.0
    out[K.CATCHUP] = float(sum(pages(rows[n], K.page_of(n)) for n in K.CATCHUP_ORDER if n in rows))
    return {name: round(max(1.0, n), 1) for name, n in out.items()}


def observed_limits(base_url: str, token: str) -> tuple[int | None, int | None]:
    """(daily token limit, burst limit) the source's headers say, from one `/v1/users/me` (2
    tokens): `x-daily-ratelimit-token-limit`, `x-ratelimit-limit`; None where a header is absent."""
    with httpx.Client(base_url=base_url, headers={"x-api-token": token}, timeout=30.0, verify=tls_context()) as http:
        seen = rate_observation(http.get("/v1/users/me").headers)
    return seen.daily_limit, seen.limit
