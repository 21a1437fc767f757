"""When a request to Pipedrive is tried again and how long it waits: pure decisions from a
status, a typed error and the rate-limit headers, and the budget the client takes its slots from.

The retry decision is pure (`should_retry`, `backoff`, `parse_retry_after`, `parse_daily_wait`,
`rate_limit_scope`) and tested with exact sequences; the client (`client.py`) only wires them
together: transient failures retry with backoff, a burst 429 waits the parsed wait, a daily 429
raises at once. `rate_observation` reads the rate headers as numbers for the budget, which takes
numbers, never headers. `SlotBudget` / `SlotHolder`: what the client needs from the budget.
"""
from __future__ import annotations

import email.utils
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timezone
from typing import Protocol

import httpx

from engine_core.budget_row import seconds_to_utc_midnight
from engine_core.source import RateObservation
from engine_core.providers.pipedrive.errors import (
    BadResponse,
    Cancelled,
    DailyLimitReached,
    PipedriveError,
    RateLimited,
    Scope,
    TransientHTTPError,
)


RETRY_STATUSES = frozenset({408, 500, 502, 503, 504})
DEFAULT_BURST_WAIT = 2.0  # one burst window, when a 429 names no wait at all
MAX_BURST_WAIT = 30.0  # a burst window is 2 s; anything longer is a confused header, not a plan
RATE_HEADER_PREFIXES = ("x-ratelimit-", "x-daily-ratelimit-", "x-daily-requests-left")
# The transport failures worth another attempt: timeouts, resets/drops, bodies cut short.
TRANSIENT_TRANSPORT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


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
