"""The retry decision is pure: which failures retry, how long to wait, and what a 429 asks for.

Pins `should_retry`, `backoff` (exponential, capped, equal jitter, exact values), the 429 wait order
(`Retry-After` -> `x-ratelimit-reset` -> default) and the burst/daily split.
"""
from __future__ import annotations

import email.utils

import httpx
import pytest

from engine_core.providers.pipedrive.retry import (
    backoff,
    parse_daily_wait,
    parse_retry_after,
    rate_limit_scope,
    seconds_to_utc_midnight,
    should_retry,
)
from engine_core.providers.pipedrive.errors import (
    AuthError,
    BadResponse,
    Cancelled,
    DailyLimitReached,
    NotFound,
    RateLimited,
    RequestRejected,
    TransientHTTPError,
)

NOW = 1_780_000_000.0  # a fixed wall clock for date arithmetic


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        (TransientHTTPError(status=503), True),
        (RateLimited(1.0, "burst"), True),
        (DailyLimitReached(3600.0), False),
        (AuthError(status=401), False),
        (NotFound(status=404), False),
        (RequestRejected(status=400), False),
        (BadResponse(malformed=True), True),
        (BadResponse("success is false"), False),
        (Cancelled(), False),
        (httpx.ReadTimeout("timed out"), True),
        (httpx.ConnectError("refused"), True),
        (httpx.RemoteProtocolError("peer closed connection without sending complete message body"), True),
        (httpx.UnsupportedProtocol("ftp"), False),
        (ValueError("a bug"), False),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (408, True),
        (429, True),
        (400, False),
        (401, False),
        (404, False),
        (200, False),
    ],
)
def test_should_retry_by_kind(error: BaseException | int, retry: bool) -> None:
    assert should_retry(error, 0, 5) is retry


def test_should_retry_stops_at_max_retries() -> None:
    error = TransientHTTPError(status=502)
    assert [should_retry(error, attempt, 3) for attempt in range(5)] == [True, True, True, False, False]
    assert should_retry(error, 0, 0) is False


def test_backoff_exact_sequence() -> None:
    jitters = [0.0, 0.5, 0.25, 0.0, 0.999, 0.5, 0.0, 0.5]
    waits = [backoff(attempt, jitter=j) for attempt, j in enumerate(jitters)]
    # step = min(30, 0.5 * 2**attempt); wait = step/2 + step/2 * jitter
    assert waits == pytest.approx([0.25, 0.75, 1.25, 2.0, 7.996, 12.0, 15.0, 22.5])


def test_backoff_is_capped_and_bounded() -> None:
    assert backoff(50, jitter=0.0) == 15.0
    assert backoff(10_000, jitter=0.999999) < 30.0
    assert backoff(3, base=1.0, cap=5.0, jitter=0.0) == 2.5
    with pytest.raises(ValueError):
        backoff(0, jitter=1.0)


def test_retry_after_seconds_wins() -> None:
    headers = {"Retry-After": "3", "x-ratelimit-reset": "1"}
    assert parse_retry_after(headers, now=NOW) == 3.0


def test_retry_after_http_date() -> None:
    headers = {"retry-after": email.utils.formatdate(NOW + 7, usegmt=True)}
    assert parse_retry_after(headers, now=NOW) == pytest.approx(7.0)


def test_reset_header_then_default() -> None:
    assert parse_retry_after({"x-ratelimit-reset": "1.5"}, now=NOW) == 1.5
    assert parse_retry_after({"retry-after": "soon", "x-ratelimit-reset": "2"}, now=NOW) == 2.0
    assert parse_retry_after({}, now=NOW) == 2.0
    assert parse_retry_after({}, default=4.0, now=NOW) == 4.0
    assert parse_retry_after({"retry-after": "-5"}, now=NOW) == 0.0
    assert parse_retry_after(httpx.Headers({"X-RateLimit-Reset": "1"}), now=NOW) == 1.0


def test_daily_wait_ignores_the_burst_reset() -> None:
    assert parse_daily_wait({"retry-after": "120", "x-ratelimit-reset": "2"}, now=NOW) == 120.0
    assert parse_daily_wait({"x-daily-ratelimit-reset": "50"}, now=NOW) == 50.0
    # nothing said: the budget is per UTC day
    assert parse_daily_wait({"x-ratelimit-reset": "2"}, now=NOW) == seconds_to_utc_midnight(NOW)
    assert 0 < seconds_to_utc_midnight(NOW) <= 86_400


def test_scope_daily_by_header_or_body() -> None:
    assert rate_limit_scope({"x-daily-ratelimit-token-remaining": "0"}) == "daily"
    assert rate_limit_scope({"x-daily-ratelimit-token-remaining": "12"}) == "burst"
    assert rate_limit_scope({}, "Daily token budget exceeded") == "daily"
    assert rate_limit_scope({}, "Request over limit") == "burst"
    assert rate_limit_scope({"x-ratelimit-remaining": "0"}) == "burst"
