"""Pipedrive over HTTP: one request with a retry policy, pages of both pagination styles, mail.

Paths are given exactly as the published spec's servers place them: v2 under `/api/v2/...`
(cursor pagination) and v1 under `/v1/...` (offset pagination); the base URL is the host root
(`https://api.pipedrive.com`, or the sandbox's `http://127.0.0.1:PORT`).

The API token travels only in the `x-api-token` header: never in a URL, a log line, an exception
message or `repr()`; text the server echoes back is scrubbed of it before it reaches a message.

The retry decision is pure (`should_retry`, `backoff`, `parse_retry_after`, `parse_daily_wait`,
`rate_limit_scope`) and tested with exact sequences; the client only wires them together:

* transient failures (5xx, 408, timeouts, dropped connections, cut-off bodies) retry with
  exponential backoff and injected jitter, up to `max_retries`, then raise `TransientHTTPError`;
* a burst 429 waits the parsed wait (bounded) and retries, counting toward `max_retries`;
* a daily 429 raises `DailyLimitReached` at once (the budget is spent for hours; the worker parks).

Every attempt first takes a rate-limit slot from the shared `Budget` (or from a `Reservation` the
caller took for a fetch round), and every response's rate-limit headers are handed back to it.
One client is shared by the fetch threads of a process: `httpx.Client` is thread-safe and the pool
is sized for 16+ concurrent requests (four lane threads x four fetch threads).
"""
from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import httpx
import orjson

from engine_core.errors import RateLimitParked, TaskStopped
from engine_core.progress import source_metrics
from engine_core.source import RateObservation
from engine_core.providers.pipedrive.errors import (
    AuthError,
    BadResponse,
    BodyUnavailable,
    BurstLimited,
    Cancelled,
    DailyLimitReached,
    ItemRefused,
    NotFound,
    PipedriveError,
    RateLimited,
    RequestRejected,
    Scope,
    TransientHTTPError,
)

log = logging.getLogger(__name__)

MAX_PAGE = 500  # the API's largest page, v1 and v2 alike
DOWNLOAD_CHUNK = 1 << 20  # bytes a streamed download hands over at a time (the file store's chunk)
RETRY_STATUSES = frozenset({408, 500, 502, 503, 504})
DEFAULT_BURST_WAIT = 2.0  # one burst window, when a 429 names no wait at all
MAX_BURST_WAIT = 30.0  # a burst window is 2 s; anything longer is a confused header, not a plan
RATE_HEADER_PREFIXES = ("x-ratelimit-", "x-daily-ratelimit-", "x-daily-requests-left")
# The transport failures worth another attempt: timeouts, resets/drops, bodies cut short.
TRANSIENT_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


# --- the pure retry decision -------------------------------------------------------------------


def should_retry(error_or_status: BaseException | int, attempt: int, max_retries: int) -> bool:
    """Whether a failed attempt is worth another; `attempt` counts the retries already made (0 first).

    A bare status cannot tell a burst 429 from a daily one: pass the typed error when there is one.
    """
    if attempt >= max_retries:
        return False
    if isinstance(error_or_status, int) and not isinstance(error_or_status, bool):
        return error_or_status == 429 or error_or_status in RETRY_STATUSES
    error = error_or_status
    if isinstance(error, (DailyLimitReached, Cancelled)):
        return False
    if isinstance(error, RateLimited):
        return error.scope == "burst"
    if isinstance(error, TransientHTTPError):
        return True
    if isinstance(error, BadResponse):
        return error.malformed
    return isinstance(error, TRANSIENT_TRANSPORT)


def backoff(attempt: int, *, base: float = 0.5, cap: float = 30.0, jitter: float) -> float:
    """Seconds before retry `attempt` (0 first): exponential, capped, half of it scaled by jitter.

    "Equal jitter": the step is min(cap, base * 2**attempt); the wait is step/2 + step/2 * jitter,
    so it never collapses to zero and never exceeds the cap. `jitter` is a draw in [0, 1).
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    step = min(cap, base * 2.0 ** min(max(attempt, 0), 62))
    return step / 2.0 + step / 2.0 * jitter


def _header(headers: Mapping[str, str], name: str) -> str | None:
    if isinstance(headers, httpx.Headers):
        return headers.get(name)
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def _seconds(raw: str | None, now: float) -> float | None:
    """A header's wait in seconds: a number, or an HTTP date (Retry-After allows both)."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return max(0.0, when.timestamp() - now)
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return max(0.0, value)


def parse_retry_after(
    headers: Mapping[str, str], *, default: float = DEFAULT_BURST_WAIT, now: float | None = None
) -> float:
    """The wait a burst 429 asks for: `Retry-After`, then `x-ratelimit-reset` (seconds), then default."""
    now = time.time() if now is None else now
    for name in ("retry-after", "x-ratelimit-reset"):
        seconds = _seconds(_header(headers, name), now)
        if seconds is not None:
            return seconds
    return default


def seconds_to_utc_midnight(now: float) -> float:
    """Pipedrive's daily budget is counted per UTC day."""
    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    midnight = (moment + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1.0, midnight.timestamp() - now)


def parse_daily_wait(headers: Mapping[str, str], *, now: float | None = None) -> float:
    """The wait until the daily budget resets: `Retry-After`, then `x-daily-ratelimit-reset`, then
    the next UTC midnight. (`x-ratelimit-reset` is the burst window's, so it is not used here.)"""
    now = time.time() if now is None else now
    for name in ("retry-after", "x-daily-ratelimit-reset"):
        seconds = _seconds(_header(headers, name), now)
        if seconds is not None:
            return seconds
    return seconds_to_utc_midnight(now)


def rate_limit_scope(headers: Mapping[str, str], body: str = "") -> Scope:
    """A 429 is the daily budget's when the headers say no daily tokens remain or the body says so."""
    remaining = _header(headers, "x-daily-ratelimit-token-remaining")
    if remaining is not None:
        try:
            if float(remaining) <= 0:
                return "daily"
        except ValueError:
            pass
    lowered = body.lower()
    if "daily" in lowered or "token budget" in lowered:
        return "daily"
    return "burst"


# --- values and collaborators ------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows and where the next page starts (cursor for v2, offset for v1)."""

    rows: tuple[dict[str, Any], ...] = ()
    next_cursor: str | None = None
    next_start: int | None = None
    more: bool = False
    kept: bool = False  # served from an answer another task already paid for (`Prefetch.hold`)


class SlotBudget(Protocol):
    """What the client needs from `engine_core.budget.Budget`."""

    def acquire(self, cancel: threading.Event | None = None) -> None:
        """Take one request slot, blocking until its time; raises BudgetCancelled when `cancel` is
        set, RateLimitParked when the daily budget is parked."""
        ...

    def observe(self, seen: RateObservation) -> None:
        """Keep what a response's rate-limit headers said (`x-ratelimit-*`, `x-daily-requests-left`)."""
        ...

    def note_rate_limited(self, scope: Scope, retry_after: float) -> None:
        """A 429 or a spent daily budget: every worker sharing the account pauses `retry_after` seconds."""
        ...


class SlotHolder(SlotBudget, Protocol):
    """Slots reserved ahead (`Budget.reserve(n)`): spending one needs no database. A request made
    with one asks it, not the client's budget, for everything else too (a retry's slot, what the
    headers said, a 429), so a fetch thread never reaches the database itself."""

    def spend(self, cancel: threading.Event | None = None) -> None:
        """Spend one reserved slot (a fresh one from the budget when none is left); raises as `acquire`."""
        ...


@dataclass(frozen=True)
class _Failure:
    error: PipedriveError
    cause: BaseException | None = field(default=None)


# --- the client ---------------------------------------------------------------------------------



class Prefetch:
    """Listing pages asked ahead: a task that knows the request its successor will make
    (the walk's next page) asks it on a background thread while it writes its own page, and the
    successor's identical request takes the answer instead of going to the source.

    Only a cache: a successor's checkpoint, cursor and ledger are its own, and a page nobody took
    (the successor ran in another process, the run stopped) is dropped after `ttl` seconds or
    when `keep` newer ones are held. One store per run and database in a process (the provider's
    clients of one run share it, whichever lane thread runs the successor), so a page never
    crosses runs. An answer is taken once: a retried task asks the source again. A failed
    prefetch is forgotten and the successor asks the source itself, with the client's retries.
    The background request goes through the same budget as any other (and is counted in the
    successor's stats when taken)."""

    def __init__(self, *, keep: int = 16, ttl: float = 20.0, threads: int = 4, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.ttl = ttl
        self.clock = clock
        self.asked = self.taken = self.held = 0
        self._lock = threading.Lock()
        self._pages: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, Future]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prefetch")

    @staticmethod
    def key(path: str, query: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
        """A request's identity: its path and its query as sorted (name, value) strings, so two
        equal queries built in another order find the same page."""
        return path, tuple(sorted((str(k), str(v)) for k, v in query.items()))

    def ask(self, client: PipedriveClient, path: str, query: Mapping[str, Any]) -> None:
        """Start `client`'s GET of `path` with `query` now, unless it is asked already."""
        key = self.key(path, query)
        with self._lock:
            self._expire()
            if key in self._pages:
                return
            future: Future = Future()
            self._pages[key] = (self.clock(), future)
            self.asked += 1
        try:
            self._pool.submit(self._fetch, client, path, dict(query), future)
        except RuntimeError:  # the interpreter is shutting down: nothing asked ahead
            with self._lock:
                self._pages.pop(key, None)

    @staticmethod
    def _fetch(client: PipedriveClient, path: str, query: dict[str, Any], future: Future) -> None:
        try:
            future.set_result(client._call(path, query, cancel=None, ahead=True))
        except BaseException as e:  # noqa: BLE001 - kept for the taker, who asks again
            future.set_exception(e)

    def hold(self, path: str, query: Mapping[str, Any], body: dict[str, Any]) -> None:
        """Hold `body`, an answer already received and paid for, for one later identical request
        (a discovery's page that is the whole list, for the walker it seeds). The taker's page
        says `kept` (its task does not count the request again); expires like any page."""
        kept = Envelope(body)
        kept.kept = True
        future: Future = Future()
        future.set_result(kept)
        with self._lock:
            self._expire()
            self._pages[self.key(path, query)] = (self.clock(), future)
            self.held += 1

    def forget(self, path: str, query: Mapping[str, Any]) -> None:
        """Drop the page held or asked for this request, if any."""
        with self._lock:
            self._pages.pop(self.key(path, query), None)

    def take(self, path: str, query: Mapping[str, Any], cancel: threading.Event | None) -> dict[str, Any] | None:
        """The answer asked ahead for this exact request (waiting for it while in flight), once;
        None when none was asked, it expired, it failed, or `cancel` was set while waiting."""
        key = self.key(path, query)
        with self._lock:
            self._expire()
            entry = self._pages.pop(key, None)
        if entry is None:
            return None
        future = entry[1]
        while True:
            try:
                body = future.result(timeout=0.2)
            except TimeoutError:
                if cancel is not None and cancel.is_set():
                    return None
                continue
            except BaseException:  # noqa: BLE001 - the taker asks the source itself
                return None
            if not getattr(body, "kept", False):
                with self._lock:
                    self.taken += 1
            return body

    def _expire(self) -> None:
        now = self.clock()
        while self._pages:
            key, (at, _) = next(iter(self._pages.items()))
            if now - at <= self.ttl and len(self._pages) <= self.keep:
                break
            self._pages.popitem(last=False)


_prefetch_stores: OrderedDict[tuple[str, int], Prefetch] = OrderedDict()
_prefetch_lock = threading.Lock()
PREFETCH_RUNS_KEPT = 8


def prefetch_store(scope: tuple[str, int]) -> Prefetch:
    """The process's store of pages asked ahead for one run (`scope`: database URL, run id)."""
    with _prefetch_lock:
        store = _prefetch_stores.get(scope)
        if store is None:
            store = _prefetch_stores[scope] = Prefetch()
            while len(_prefetch_stores) > PREFETCH_RUNS_KEPT:
                _, old = _prefetch_stores.popitem(last=False)
                old._pool.shutdown(wait=False)
        _prefetch_stores.move_to_end(scope)
        return store


_TLS: ssl.SSLContext | None = None
_TLS_LOCK = threading.Lock()


def tls_context() -> ssl.SSLContext:
    """The process's TLS context for the source, built once the way httpx builds its default
    (`httpx.create_ssl_context()`: certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR). Building one
    reads the CA bundle - about 15 ms of CPU - and every client made one: a client per lane per run,
    plus one per identity and snapshot request. A context is safe to share across threads."""
    global _TLS
    with _TLS_LOCK:
        if _TLS is None:
            _TLS = httpx.create_ssl_context()
        return _TLS


class PipedriveClient:
    """A thread-safe Pipedrive API client: token in a header, typed errors, paced by a Budget."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        budget: SlotBudget | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        max_retries: int = 5,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        cancel: threading.Event | None = None,
        max_burst_wait: float = MAX_BURST_WAIT,
        wall_clock: Callable[[], float] = time.time,
        prefetch: Prefetch | None = None,
    ) -> None:
        if not token or any(c.isspace() for c in token):
            raise ValueError("a Pipedrive API token is required (non-empty, no whitespace)")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.max_burst_wait = max_burst_wait
        self._token = token
        self._budget = budget
        self._sleep = sleep
        self._rng = rng
        self._cancel = cancel
        self._wall = wall_clock
        self._prefetch = prefetch
        self._proof_lock = threading.Lock()
        self._token_proved_at: float | None = None
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"x-api-token": token, "accept": "application/json"},
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            transport=transport,
            # 4 lane threads x 4 fetch threads = 16 requests in flight; room for retries on top.
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=32),
            follow_redirects=False,
            verify=tls_context(),
        )

    def __repr__(self) -> str:
        return f"PipedriveClient(base_url={self.base_url!r})"

    def close(self) -> None:
        """Close the HTTP connection pool; the client sends nothing after."""
        self._http.close()

    def __enter__(self) -> PipedriveClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- public API ---------------------------------------------------------------------------

    def get(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
    ) -> dict[str, Any]:
        """One GET with the retry policy; returns the whole JSON envelope (`success`, `data`, ...)."""
        return self._call(path, params, cancel=cancel, reservation=reservation)

    def list_v2(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        cursor: str | None = None,
        limit: int = MAX_PAGE,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
        keep: bool = False,
    ) -> Page:
        """One page of a v2 listing (cursor pagination: `additional_data.next_cursor`). `keep`:
        the answer is also held for the next identical request (`Prefetch.hold`; without a store,
        nothing is held; `forget_v2` drops it)."""
        query = _v2_query(path, params, cursor, limit)
        body = self._call(path, query, cancel=cancel, reservation=reservation)
        if keep and self._prefetch is not None:
            self._prefetch.hold(path, query, body)
        rows = _rows(body, path)
        extra = body.get("additional_data")
        next_cursor = extra.get("next_cursor") if isinstance(extra, dict) else None
        if next_cursor is not None and not isinstance(next_cursor, str):
            raise BadResponse("next_cursor is not a string", method="GET", path=path, status=200)
        if next_cursor and next_cursor == cursor:
            raise BadResponse("the next cursor repeats this page's", method="GET", path=path, status=200)
        return Page(rows=rows, next_cursor=next_cursor or None, more=bool(next_cursor), kept=bool(getattr(body, "kept", False)))

    def list_v1(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        start: int = 0,
        limit: int = MAX_PAGE,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
    ) -> Page:
        """One page of a v1 listing (offset pagination: `additional_data.pagination`)."""
        query = _v1_query(path, params, start, limit)
        body = self._call(path, query, cancel=cancel, reservation=reservation)
        rows = _rows(body, path)
        extra = body.get("additional_data")
        extra = extra if isinstance(extra, dict) else {}
        # The spec's schemas disagree: most nest it under `pagination`, some list it flat.
        pagination = extra.get("pagination") if isinstance(extra.get("pagination"), dict) else extra
        more = bool(pagination.get("more_items_in_collection"))
        if not more:
            return Page(rows=rows, next_start=None, more=False)
        next_start = pagination.get("next_start")
        if next_start is None:
            next_start = start + len(rows)
        if not isinstance(next_start, int) or next_start <= start:
            raise BadResponse("next_start does not advance", method="GET", path=path, status=200)
        return Page(rows=rows, next_start=next_start, more=True)

    def prefetch_v2(self, path: str, params: Mapping[str, Any] | None = None, *, cursor: str | None = None,
                    limit: int = MAX_PAGE) -> None:
        """Ask now, on a background thread, the page `list_v2` with these arguments will ask for
        (`Prefetch`); nothing without a store. Raises ValueError on arguments `list_v2` refuses."""
        if self._prefetch is not None:
            self._prefetch.ask(self, path, _v2_query(path, params, cursor, limit))

    def forget_v2(self, path: str, params: Mapping[str, Any] | None = None, *, cursor: str | None = None,
                  limit: int = MAX_PAGE) -> None:
        """Drop the answer held for the request `list_v2` with these arguments makes (`keep`):
        nobody will ask it."""
        if self._prefetch is not None:
            self._prefetch.forget(path, _v2_query(path, params, cursor, limit))

    def prefetch(self, path: str, params: Mapping[str, Any] | None = None) -> None:
        """`prefetch_v2` for the request `get(path, params)` will make."""
        if self._prefetch is not None:
            self._prefetch.ask(self, path, dict(params or {}))

    def prefetch_v1(self, path: str, params: Mapping[str, Any] | None = None, *, start: int = 0,
                    limit: int = MAX_PAGE) -> None:
        """`prefetch_v2` for the page `list_v1` with these arguments will ask for."""
        if self._prefetch is not None:
            self._prefetch.ask(self, path, _v1_query(path, params, start, limit))

    def iter_v2(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        cursor: str | None = None,
        limit: int = MAX_PAGE,
        cancel: threading.Event | None = None,
    ) -> Iterator[Page]:
        """Every page of a v2 listing from `cursor` on."""
        while True:
            page = self.list_v2(path, params, cursor=cursor, limit=limit, cancel=cancel)
            yield page
            if not page.more:
                return
            cursor = page.next_cursor

    def iter_v1(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        start: int = 0,
        limit: int = MAX_PAGE,
        cancel: threading.Event | None = None,
    ) -> Iterator[Page]:
        """Every page of a v1 listing from `start` on."""
        while True:
            page = self.list_v1(path, params, start=start, limit=limit, cancel=cancel)
            yield page
            if not page.more or page.next_start is None:
                return
            start = page.next_start

    def mail_messages(
        self,
        deal_id: int,
        start: int = 0,
        limit: int = MAX_PAGE,
        *,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
    ) -> Page:
        """A page of one deal's mail messages (no bodies); rows are the API's `{object, timestamp, data}`.
        Raises `ItemRefused` when the listing answers 403 or 404 (`item_list_v1`)."""
        path = f"/v1/deals/{_id(deal_id)}/mailMessages"
        return self.item_list_v1(path, None, start=start, limit=limit, cancel=cancel, reservation=reservation)

    def item_list_v1(
        self,
        path: str,
        params: Mapping[str, Any] | None = None,
        *,
        start: int = 0,
        limit: int = MAX_PAGE,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
    ) -> Page:
        """`list_v1` of one item's sub-resource (a deal's mail, products, followers, participants,
        flow): a 403 (private to another user) or a 404 (the item is gone) raises `ItemRefused`,
        the item's outcome; a 401 stays an `AuthError`. Before telling a 403 as the item's, a fan-out
        asks `settle_refusals` whether the token itself is refused."""
        with item_scope(path):
            return self.list_v1(path, params, start=start, limit=limit, cancel=cancel, reservation=reservation)

    def confirm_token(self, *, cancel: threading.Event | None = None) -> None:
        """Whether the token itself is still accepted: `/v1/users/me` (the account's own identity)
        answering is the proof; its 401 or 403 raises `AuthError`, the token's refusal. A proof is
        kept for TOKEN_PROOF_SECONDS (by the wall clock given), so a fan-out refused on many items
        asks once."""
        now = self._wall()
        with self._proof_lock:
            if self._token_proved_at is not None and 0 <= now - self._token_proved_at < TOKEN_PROOF_SECONDS:
                return
        self.me(cancel=cancel)
        with self._proof_lock:
            self._token_proved_at = now

    def me(self, *, cancel: threading.Event | None = None) -> dict[str, Any]:
        """The token's user with its company (`company_id`, `company_domain`): `/v1/users/me`.
        The dict also carries `_date`: the response's `Date` header (the source's clock when it
        answered; None when absent), so one request serves both the identity and a snapshot."""
        path = "/v1/users/me"
        body = self._call(path, None, cancel=cancel)
        data = body.get("data")
        if not isinstance(data, dict) or not isinstance(data.get("company_id"), int):
            raise BadResponse("data has no company_id", method="GET", path=path, status=200)
        return {**data, "_date": getattr(body, "date", None)}

    def mail_body(
        self,
        message_id: int,
        *,
        cancel: threading.Event | None = None,
        reservation: SlotHolder | None = None,
    ) -> MailMessage:
        """One mail message with its `body`: a `MailMessage` (the API's `data` object, a dict) whose
        `invalid_utf8` says how many invalid UTF-8 sequences of the response were replaced by U+FFFD.

        Raises `BodyUnavailable` (with the status) when the body answers 403 - a private message the
        token's user may not read - or 404 - a message deleted since its deal's listing: neither is
        retried, and neither is the task's failure (the caller imports the message without a body).
        A 401 stays an `AuthError`: that is the token, not the message.
        """
        path = f"/v1/mailbox/mailMessages/{_id(message_id)}"
        with item_scope(path, BodyUnavailable):
            body = self._call(path, {"include_body": 1}, cancel=cancel, reservation=reservation)
        data = body.get("data")
        if not isinstance(data, dict):
            raise BadResponse("data is not a mail message", method="GET", path=path, status=200)
        message = MailMessage(data)
        message.invalid_utf8 = getattr(body, "invalid_utf8", 0)
        return message

    # --- a file's bytes ----------------------------------------------------------------------

    @contextmanager
    def download(self, path: str, *, cancel: threading.Event | None = None,
                 chunk_bytes: int = DOWNLOAD_CHUNK) -> Iterator[Iterator[bytes]]:
        """A file's bytes, streamed: `with client.download("/v1/files/12/download") as chunks:`
        yields an iterator of byte chunks (at most `chunk_bytes` each) read from the connection as
        the caller asks for them, never the whole body in memory. Paced and retried like any
        request until the answer's status is known (429, 5xx, a connection lost before the
        body); a connection lost while the body is read raises TransientHTTPError from the
        iterator (the caller decides whether to ask again). 403 and 404 raise ItemRefused
        (`item_scope`: the file's outcome, not the token's), 401 AuthError."""
        _require_prefix(path, "/v1/")
        response = self._open_stream(path, cancel or self._cancel)
        try:
            yield self._stream_chunks(response, path, chunk_bytes)
        finally:
            response.close()

    def _open_stream(self, path: str, cancel: threading.Event | None) -> httpx.Response:
        """The open 200 response of a streamed GET, after the retry policy; raises as `_call`."""
        attempt = 0
        with item_scope(path):
            while True:
                self._check_cancel(cancel, path)
                self._take_slot(path, cancel, None, first=attempt == 0)
                error: PipedriveError | None = None
                try:
                    response = self._http.send(self._http.build_request("GET", path, headers={"accept": "*/*"}),
                                               stream=True)
                except TRANSIENT_TRANSPORT as e:
                    error = TransientHTTPError(method="GET", path=path, detail=type(e).__name__)
                else:
                    if response.status_code == 200:
                        self._observe(response.headers)
                        source_metrics.request(ok=True, rate_limited=False)
                        return response
                    try:
                        response.read()
                        self._interpret(response, path)
                        error = BadResponse(f"unexpected status {response.status_code}", method="GET", path=path,
                                            status=response.status_code)
                    except DailyLimitReached:
                        raise
                    except (RateLimited, TransientHTTPError, BadResponse) as e:
                        error = e
                    finally:
                        self._observe(response.headers)
                        response.close()
                source_metrics.request(ok=False, rate_limited=isinstance(error, RateLimited))
                if not should_retry(error, attempt, self.max_retries):
                    raise error
                wait = (min(max(error.retry_after, 0.0), self.max_burst_wait) if isinstance(error, RateLimited)
                        else backoff(attempt, jitter=self._rng()))
                log.warning("GET %s failed (%s); retry %d/%d in %.2fs", path, _short(error), attempt + 1,
                            self.max_retries, wait)
                self._wait(wait, cancel, path)
                attempt += 1

    @staticmethod
    def _stream_chunks(response: httpx.Response, path: str, chunk_bytes: int) -> Iterator[bytes]:
        try:
            yield from response.iter_bytes(chunk_bytes)
        except TRANSIENT_TRANSPORT as e:
            raise TransientHTTPError(method="GET", path=path, detail=f"{type(e).__name__} while reading the body") from e

    # --- the request loop ---------------------------------------------------------------------

    def _call(
        self,
        path: str,
        params: Mapping[str, Any] | None,
        *,
        cancel: threading.Event | None,
        reservation: SlotHolder | None = None,
        ahead: bool = False,
    ) -> dict[str, Any]:
        if not path.startswith("/") or "?" in path:
            raise ValueError("path must start with '/' and carry no query string (pass params)")
        query = dict(params or {})
        if any(k.lower() == "api_token" for k in query):
            raise ValueError("the API token goes in the x-api-token header, never in the URL")
        cancel = cancel or self._cancel
        if self._prefetch is not None and not ahead and reservation is None:
            body = self._prefetch.take(path, query, cancel)
            if body is not None:
                return body
        attempt = 0
        while True:
            self._check_cancel(cancel, path)
            # A reservation covers the first attempt only; a retry is a new request and a new slot.
            self._take_slot(path, cancel, reservation, first=attempt == 0)
            outcome = self._attempt(path, query, reservation)
            source_metrics.request(ok=not isinstance(outcome, _Failure),
                                   rate_limited=isinstance(outcome, _Failure) and isinstance(outcome.error, RateLimited))
            if not isinstance(outcome, _Failure):
                return outcome
            error = outcome.error
            # A page asked ahead is tried once: its taker asks again with the retries, and a
            # background thread never sleeps out backoffs after its run has ended (its pool's
            # threads are joined at the interpreter's exit).
            if ahead or not should_retry(error, attempt, self.max_retries):
                raise error from outcome.cause
            if isinstance(error, RateLimited):
                wait = min(max(error.retry_after, 0.0), self.max_burst_wait)
            else:
                wait = backoff(attempt, jitter=self._rng())
            log.warning("GET %s failed (%s); retry %d/%d in %.2fs", path, _short(error), attempt + 1, self.max_retries, wait)
            source_metrics.retrying(_short(error), wait)  # progress reports: retries in progress and why
            self._wait(wait, cancel, path)
            attempt += 1

    def _attempt(self, path: str, query: dict[str, Any], reservation: SlotHolder | None = None) -> dict[str, Any] | _Failure:
        try:
            response = self._http.get(path, params=query)
        except TRANSIENT_TRANSPORT as e:
            return _Failure(TransientHTTPError(method="GET", path=path, detail=type(e).__name__), e)
        except httpx.TransportError as e:  # a misconfiguration (bad URL scheme, proxy): not transient
            raise PipedriveError(method="GET", path=path, detail=type(e).__name__) from e
        log.debug("GET %s -> %d", path, response.status_code)
        try:
            return self._interpret(response, path, reservation)
        except (RateLimited, TransientHTTPError, BadResponse) as e:
            if isinstance(e, DailyLimitReached):
                raise
            return _Failure(e)
        finally:
            # After a 429 has been noted with its exact wait, so the headers' "no daily tokens left"
            # finds the budget already parked instead of guessing a reset of its own.
            self._observe(response.headers, reservation)

    def _interpret(self, response: httpx.Response, path: str, reservation: SlotHolder | None = None) -> dict[str, Any]:
        status = response.status_code
        if status == 429:
            detail = self._server_detail(response)
            if rate_limit_scope(response.headers, detail or "") == "daily":
                wait = parse_daily_wait(response.headers, now=self._wall())
                self._note_rate_limited("daily", wait, reservation)
                raise DailyLimitReached(wait, method="GET", path=path, detail=detail)
            wait = parse_retry_after(response.headers, now=self._wall())
            self._note_rate_limited("burst", wait, reservation)
            raise BurstLimited(wait, method="GET", path=path, detail=detail)
        if status in RETRY_STATUSES or status >= 500:
            raise TransientHTTPError(method="GET", path=path, status=status)
        if status in (401, 403):
            raise AuthError(method="GET", path=path, status=status, detail=self._server_detail(response))
        if status == 404:
            raise NotFound(method="GET", path=path, status=status)
        if 400 <= status < 500:
            raise RequestRejected(method="GET", path=path, status=status, detail=self._server_detail(response))
        if not 200 <= status < 300:
            raise BadResponse(f"unexpected status {status}", method="GET", path=path, status=status)
        try:
            body, invalid = _decode_json(response.content)
        except ValueError:
            # Valid UTF-8 that does not parse: most often a read cut short, worth another attempt.
            raise BadResponse("the body is not JSON", malformed=True, method="GET", path=path, status=status) from None
        if invalid:
            log.warning("GET %s: %d invalid UTF-8 sequence(s) replaced with U+FFFD", path, invalid)
        if not isinstance(body, dict) or "data" not in body:
            raise BadResponse("the body is not a Pipedrive envelope", method="GET", path=path, status=status)
        if body.get("success") is False:
            raise BadResponse(
                "success is false", method="GET", path=path, status=status, detail=self._scrub(str(body.get("error") or ""))[:200] or None
            )
        envelope = Envelope(body)
        envelope.invalid_utf8 = invalid
        envelope.date = response.headers.get("date")
        return envelope

    # --- collaborators ------------------------------------------------------------------------

    def _take_slot(self, path: str, cancel: threading.Event | None, reservation: SlotHolder | None, *, first: bool = True) -> None:
        try:
            if reservation is not None:
                if first:
                    reservation.spend(cancel)
                else:
                    reservation.acquire(cancel)
            elif self._budget is not None:
                self._budget.acquire(cancel)
        except DailyLimitReached:
            raise
        except RateLimitParked as e:
            # The budget is parked (our daily share used, or another worker saw the day spent):
            # park without calling the source, saying which.
            raise DailyLimitReached(e.wait_seconds, method="GET", path=path, status=None, detail=f"budget parked: {e}") from None
        except TaskStopped as e:
            if isinstance(e, Cancelled):
                raise
            raise Cancelled(method="GET", path=path) from None

    def _observe(self, headers: httpx.Headers, reservation: SlotHolder | None = None) -> None:
        budget = reservation or self._budget
        if budget is None:
            return
        if any(key.lower().startswith(RATE_HEADER_PREFIXES) for key in headers.keys()):
            budget.observe(rate_observation(headers))

    def _note_rate_limited(self, scope: Scope, wait: float, reservation: SlotHolder | None = None) -> None:
        budget = reservation or self._budget
        if budget is not None:
            budget.note_rate_limited(scope, wait)

    def _check_cancel(self, cancel: threading.Event | None, path: str) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled(method="GET", path=path)

    def _wait(self, seconds: float, cancel: threading.Event | None, path: str) -> None:
        """Sleep, but end early and raise `Cancelled` when the task is asked to stop."""
        if cancel is None:
            self._sleep(seconds)
            return
        self._check_cancel(cancel, path)
        if self._sleep is time.sleep:
            if cancel.wait(seconds):
                raise Cancelled(method="GET", path=path)
        else:
            self._sleep(seconds)
            self._check_cancel(cancel, path)

    def _server_detail(self, response: httpx.Response) -> str | None:
        """The server's own error text, short and scrubbed of the token."""
        try:
            body = response.json()
        except ValueError:
            text = response.text
        else:
            text = str(body.get("error") or body.get("message") or "") if isinstance(body, dict) else ""
        text = self._scrub(" ".join(text.split()))[:200]
        return text or None

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text


ITEM_REFUSALS = frozenset({403, 404})  # an item's sub-resource: private to another user, or gone
TOKEN_PROOF_SECONDS = 60.0  # how long `confirm_token`'s answer stands for a fan-out's later refusals


@contextmanager
def item_scope(path: str, kind: type[ItemRefused] = ItemRefused) -> Iterator[None]:
    """Requests of one item's sub-resource: their 403 and 404 raise `kind` (an `ItemRefused`, with
    the status and the server's reason), never the token's `AuthError` - one deal's mail private to
    another user must not stop a tenant's run. A 401 (the token refused) and every other error pass."""
    try:
        yield
    except (AuthError, NotFound) as e:
        if e.status in ITEM_REFUSALS:
            raise kind(method=e.method, path=e.path or path, status=e.status, detail=e.detail) from None
        raise


def settle_refusals(client: Any, refusals: Sequence[ItemRefused], *, cancel: threading.Event | None = None) -> None:
    """The rule for a fan-out's refused items (`item_list_v1`, `mail_body`): a 404 is the item's
    (gone since listed); a 403 is the item's unless the token itself is refused, which
    `client.confirm_token` asks of the account's own identity - its `AuthError` propagates and
    stops the run as any refused token does. Call it on the task's thread once a round is joined."""
    if any(r.status == 403 for r in refusals):
        client.confirm_token(cancel=cancel)


def _require_prefix(path: str, prefix: str) -> None:
    if not path.startswith(prefix):
        raise ValueError(f"{path!r} is not under {prefix}")


def _check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE}, got {limit}")
    return limit


def _id(value: int) -> int:
    """A path id as an integer, so nothing but digits reaches the path."""
    try:
        number = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError):
        number = -1
    if number < 0 or str(number) != str(value).strip():
        raise ValueError(f"not a Pipedrive id: {value!r}")
    return number


def _rows(body: dict[str, Any], path: str) -> tuple[dict[str, Any], ...]:
    data = body.get("data")
    if data is None:  # v1 answers an empty list with `data: null`
        return ()
    if not isinstance(data, list):
        raise BadResponse("data is not a list", method="GET", path=path, status=200)
    return tuple(data)


class Envelope(dict):
    """A decoded response envelope (`success`, `data`, ...), a plain dict to every caller, that also
    says how many invalid UTF-8 sequences the decoder replaced (`invalid_utf8`, 0 when none) and
    whether it was held for this request after another task paid for it (`kept`, `Prefetch.hold`)."""

    invalid_utf8: int = 0
    kept: bool = False
    date: str | None = None  # the response's `Date` header as served (the source's clock), or None


class MailMessage(dict):
    """A mail message as `mail_body` returns it: the API's `data` object plus `invalid_utf8`."""

    invalid_utf8: int = 0


_REPLACEMENT_BYTES = "\ufffd".encode()
# Bytes 0-9 -> "0", every other byte -> " ": a run of 19 digits is then one substring search.
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_NUMBER = b"0" * 19


class NonFinite(float):
    """A NaN or an infinity read from a body (`NaN`, `Infinity`, `-Infinity`, or a number too
    large for a double): a float to every reader. Only the standard library's reading produces
    one - such a body is not JSON, and orjson refuses it - and the type says so to the window's
    encoder (`ledger`'s orjson path calls its default for a float subclass and falls back to the
    standard library's encoding, `NaN` as before, which Postgres refuses: the window goes per row)."""


def _nonfinite_constant(name: str) -> float:
    return NonFinite(name)


def rate_observation(headers: Mapping[str, str]) -> RateObservation:
    """What Pipedrive's rate-limit headers say, as numbers: `x-ratelimit-limit/-remaining/-reset`
    (the burst window) and `x-daily-ratelimit-token-limit/-token-remaining/-reset` (the day's
    tokens). A header absent or unreadable is None; a reset must be a finite number >= 0."""
    h = {k.lower(): v for k, v in headers.items()}
    return RateObservation(
        limit=_header_int(h.get("x-ratelimit-limit")),
        remaining=_header_int(h.get("x-ratelimit-remaining")),
        reset=_header_seconds(h.get("x-ratelimit-reset")),
        daily_limit=_header_int(h.get("x-daily-ratelimit-token-limit")),
        daily_remaining=_header_int(h.get("x-daily-ratelimit-token-remaining")),
        daily_reset=_header_seconds(h.get("x-daily-ratelimit-reset")),
    )


def _header_int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _header_seconds(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _float(text: str) -> float:
    value = float(text)
    return NonFinite(value) if value - value != 0 else value


def _decode_json(content: bytes) -> tuple[Any, int]:
    """A response body -> (JSON value, number of invalid UTF-8 sequences replaced with U+FFFD).

    Pipedrive answers UTF-8 JSON (RFC 8259 requires it). Bytes that are not valid UTF-8 are a
    deterministic property of the stored data, not a transport accident: asking again returns
    the same bytes, so they are decoded once with replacement, never retried. The count is the
    replacement characters decoding added (those already in the text, encoded, are not counted).
    Raises ValueError when the decoded text is not JSON (a cut-off read: worth a retry).

    Read by orjson first (`json.loads` of the pages was ~12% of the engine's GIL time on
    the entity path; orjson reads them in half the time), and by the standard library, exactly as
    before, whenever orjson refuses the body: bytes that are not UTF-8, a byte-order mark, a lone
    surrogate escape, `NaN`/`Infinity`, too deep, not JSON. A body with a run of 19 digits goes to
    the standard library too: orjson reads an integer beyond 64 bits as a float, silently (a
    digit run in a text costs only the slower reading). Both give the same values otherwise
    (floats compared bit for bit over 300,000 random literals and every body of the bench's run).
    """
    if _LONG_NUMBER not in content.translate(_DIGITS):
        try:
            return orjson.loads(content), 0
        except orjson.JSONDecodeError:
            pass  # the standard library's reading below decides, with its own error
    return stdlib_decode_json(content)


def stdlib_decode_json(content: bytes) -> tuple[Any, int]:
    """`_decode_json` by the standard library alone (what it did before orjson, and does for any
    body orjson refuses): the same (value, invalid UTF-8 sequences replaced) and ValueError."""
    try:
        text = content.decode("utf-8")
        invalid = 0
    except UnicodeDecodeError:
        text = content.decode("utf-8", errors="replace")
        invalid = text.count("\ufffd") - content.count(_REPLACEMENT_BYTES)
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark is not part of the JSON
    return json.loads(text, parse_constant=_nonfinite_constant, parse_float=_float), invalid


def _short(error: PipedriveError) -> str:
    """An error as a retry's log line names it: "429 burst", "invalid JSON (HTTP 200)" (a cut-off
    or garbled body: "HTTP 200" alone would hide why it is retried), "HTTP 503", else its detail."""
    if isinstance(error, RateLimited):
        return f"429 {error.scope}"
    if isinstance(error, BadResponse) and error.malformed:
        return f"invalid JSON (HTTP {error.status})" if error.status is not None else "invalid JSON"
    if error.status is not None:
        return f"HTTP {error.status}"
    return error.detail or type(error).__name__


def _v2_query(path: str, params: Mapping[str, Any] | None, cursor: str | None, limit: int) -> dict[str, Any]:
    _require_prefix(path, "/api/v2/")
    query = dict(params or {})
    query["limit"] = _check_limit(limit)
    if cursor:
        query["cursor"] = cursor
    return query


def _v1_query(path: str, params: Mapping[str, Any] | None, start: int, limit: int) -> dict[str, Any]:
    _require_prefix(path, "/v1/")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    query = dict(params or {})
    query["start"] = start
    query["limit"] = _check_limit(limit)
    return query
