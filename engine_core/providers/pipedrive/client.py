"""Pipedrive over HTTP: one request with a retry policy, pages of both pagination styles, mail.

Paths are given exactly as the published spec's servers place them: v2 under `/api/v2/...`
(cursor pagination) and v1 under `/v1/...` (offset pagination); the base URL is the host root
(`https://api.pipedrive.com`, or the sandbox's `http://127.0.0.1:PORT`).

The API token travels only in the `x-api-token` header: never in a URL, a log line, an exception
message or `repr()`; text the server echoes back is scrubbed of it before it reaches a message.

The retry decision is pure and tested with exact sequences (`retry.py`: `should_retry`, `backoff`,
`parse_retry_after`, `parse_daily_wait`, `rate_limit_scope`); the client only wires them together:

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

import logging
import random
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import httpx

from engine_core.errors import RateLimitParked, TaskStopped
from engine_core.progress import source_metrics
from engine_core.providers.pipedrive.decode import Envelope, MailMessage, _decode_json
from engine_core.providers.pipedrive.errors import (
    AuthError,
    BadResponse,
    BodyUnavailable,
    BurstLimited,
    Cancelled,
    DailyLimitReached,
    NotFound,
    PipedriveError,
    RateLimited,
    RequestRejected,
    Scope,
    TransientHTTPError,
)
from engine_core.providers.pipedrive.paging import (
    MAX_PAGE,
    Page,
    _id,
    _require_prefix,
    rows_of,
    _v1_query,
    _v2_query,
    item_scope,
)
from engine_core.providers.pipedrive.prefetch import Prefetch
from engine_core.providers.pipedrive.retry import (
    MAX_BURST_WAIT,
    RATE_HEADER_PREFIXES,
    RETRY_STATUSES,
    SlotBudget,
    SlotHolder,
    TRANSIENT_TRANSPORT,
    _Failure,
    _short,
    backoff,
    parse_daily_wait,
    parse_retry_after,
    rate_limit_scope,
    rate_observation,
    should_retry,
)

log = logging.getLogger(__name__)

DOWNLOAD_CHUNK = 1 << 20  # bytes a streamed download hands over at a time (the file store's chunk)
TOKEN_PROOF_SECONDS = 60.0  # how long `confirm_token`'s answer stands for a fan-out's later refusals

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
        rows = rows_of(body, path)
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
        rows = rows_of(body, path)
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
                    limit: int = MAX_PAGE, then: Callable[[dict[str, Any]], None] | None = None, once: bool = False) -> None:
        """Ask now, on a background thread, the page `list_v2` with these arguments will ask for
        (`Prefetch.ask`: `then(body)` once it is here; `once`: not when taken already); nothing
        without a store. Raises ValueError on arguments `list_v2` refuses."""
        if self._prefetch is not None:
            self._prefetch.ask(self, path, _v2_query(path, params, cursor, limit), then, once=once)

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
                    limit: int = MAX_PAGE, then: Callable[[dict[str, Any]], None] | None = None, once: bool = False) -> None:
        """`prefetch_v2` for the page `list_v1` with these arguments will ask for."""
        if self._prefetch is not None:
            self._prefetch.ask(self, path, _v1_query(path, params, start, limit), then, once=once)

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
