"""The client over a scripted MockTransport: each failure becomes its typed error, retries happen
with the exact waits the pure policy computes, the budget sees every attempt and every header, and
a stop request ends a wait early.
"""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from engine_core.errors import RateLimitParked, TaskStopped, TransientError
from engine_core.providers.pipedrive.client import PipedriveClient
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
    TransientHTTPError,
)
from tests.client.support import BASE, TOKEN, FakeBudget, Jitter, Script, make_client, ok, status

DEALS = "/api/v2/deals"


def test_token_travels_in_the_header_only() -> None:
    script = Script([ok([])])
    client, _ = make_client(script)
    client.get(DEALS, {"limit": 1})
    (request,) = script.requests
    assert request.headers["x-api-token"] == TOKEN
    assert TOKEN not in str(request.url)
    assert "authorization" not in request.headers
    assert str(request.url) == f"{BASE}{DEALS}?limit=1"


def test_get_returns_the_envelope() -> None:
    client, sleeps = make_client(Script([ok({"id": 1}, additional_data={"x": 1})]))
    assert client.get("/v1/users/1") == {"success": True, "data": {"id": 1}, "additional_data": {"x": 1}}
    assert sleeps == []


def test_transient_statuses_retry_with_exact_backoff() -> None:
    script = Script([status(503), status(500), status(502), ok([])])
    client, sleeps = make_client(script, rng=Jitter([0.0, 0.5, 0.25]))
    client.get(DEALS)
    assert len(script.requests) == 4
    assert sleeps == pytest.approx([0.25, 0.75, 1.25])


def test_transient_exhausted_raises_transient_http_error() -> None:
    script = Script([status(503)])
    client, sleeps = make_client(script, max_retries=2, rng=Jitter([0.5, 0.5]))
    with pytest.raises(TransientHTTPError) as info:
        client.get(DEALS)
    assert isinstance(info.value, TransientError)
    assert len(script.requests) == 3
    assert sleeps == pytest.approx([0.375, 0.75])
    assert "GET /api/v2/deals" in str(info.value) and "503" in str(info.value)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ReadTimeout("timed out"),
        httpx.ConnectTimeout("timed out"),
        httpx.ConnectError("connection refused"),
        httpx.ReadError("connection reset by peer"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.RemoteProtocolError("peer closed connection without sending complete message body (incomplete chunked read)"),
    ],
)
def test_transport_failures_are_transient(failure: Exception) -> None:
    script = Script([failure, ok([])])
    client, sleeps = make_client(script)
    client.get(DEALS)
    assert sleeps == [0.25]
    script = Script([failure])
    client, _ = make_client(script, max_retries=1)
    with pytest.raises(TransientHTTPError) as info:
        client.get(DEALS)
    assert type(failure).__name__ in str(info.value)
    assert len(script.requests) == 2


def test_burst_429_waits_the_retry_after_and_tells_the_budget() -> None:
    budget = FakeBudget()
    script = Script([status(429, headers={"retry-after": "1.5", "x-ratelimit-remaining": "0"}), ok([])])
    client, sleeps = make_client(script, budget=budget)
    client.get(DEALS)
    assert sleeps == [1.5]
    assert budget.limited == [("burst", 1.5)]
    assert budget.acquired == 2  # a retry is a new request and a new slot


def test_burst_wait_falls_back_to_reset_then_default_and_is_bounded() -> None:
    script = Script([status(429, headers={"x-ratelimit-reset": "0.8"}), status(429), status(429, headers={"retry-after": "999"}), ok([])])
    client, sleeps = make_client(script)
    client.get(DEALS)
    assert sleeps == [0.8, 2.0, 30.0]


def test_burst_429_counts_toward_max_retries() -> None:
    script = Script([status(503), status(429, headers={"retry-after": "1"})])
    client, sleeps = make_client(script, max_retries=3, rng=Jitter([0.5]))
    with pytest.raises(RateLimited) as info:
        client.get(DEALS)
    assert info.value.scope == "burst" and info.value.retry_after == 1.0
    assert isinstance(info.value, BurstLimited) and isinstance(info.value, TransientError)  # released, retried
    assert not isinstance(info.value, RateLimitParked)
    assert len(script.requests) == 4
    assert sleeps == [0.375, 1.0, 1.0]


@pytest.mark.parametrize(
    "response",
    [
        status(429, headers={"retry-after": "3600", "x-daily-ratelimit-token-remaining": "0"}),
        status(429, headers={"retry-after": "3600"}, body={"success": False, "error": "Daily token budget exceeded"}),
    ],
)
def test_daily_429_parks_at_once(response: httpx.Response) -> None:
    budget = FakeBudget()
    script = Script([response, ok([])])
    client, sleeps = make_client(script, budget=budget)
    with pytest.raises(DailyLimitReached) as info:
        client.get(DEALS)
    error = info.value
    assert isinstance(error, RateLimitParked) and isinstance(error, RateLimited)
    assert not isinstance(error, TransientError)  # parked, never retried with backoff
    assert error.wait_seconds == error.retry_after == 3600.0 and error.scope == "daily"
    assert len(script.requests) == 1 and sleeps == []
    assert budget.limited == [("daily", 3600.0)]


def test_parked_budget_stops_the_request_before_it_is_sent() -> None:
    script = Script([ok([])])
    client, _ = make_client(script, budget=FakeBudget(parked=42.0))
    with pytest.raises(DailyLimitReached) as info:
        client.get(DEALS)
    assert info.value.wait_seconds == 42.0
    assert script.requests == []


@pytest.mark.parametrize(
    ("code", "error"),
    [(401, AuthError), (403, AuthError), (404, NotFound), (400, RequestRejected), (410, RequestRejected)],
)
def test_client_errors_are_not_retried(code: int, error: type[PipedriveError]) -> None:
    script = Script([status(code)])
    client, sleeps = make_client(script)
    with pytest.raises(error) as info:
        client.get("/v1/deals/7/mailMessages", {"start": 0})
    assert len(script.requests) == 1 and sleeps == []
    assert f"HTTP {code}" in str(info.value) and "GET /v1/deals/7/mailMessages" in str(info.value)
    assert "start=0" not in str(info.value)
    if error is AuthError:  # names the variable to fix (a fresh user's revoked token said only "the API token")
        assert "PIPEDRIVE_API_TOKEN" in str(info.value), str(info.value)


def test_malformed_json_retries_then_is_a_bad_response(caplog) -> None:
    garbage = httpx.Response(200, content=b'{"success": true, "data": [', headers={"content-type": "application/json"})
    script = Script([garbage, ok([{"id": 1}])])
    client, sleeps = make_client(script)
    with caplog.at_level("WARNING"):
        assert client.get(DEALS)["data"] == [{"id": 1}]
    assert sleeps == [0.25]
    # the retry's line says what was wrong (it said "failed (HTTP 200)": a fresh user's find)
    assert any("failed (invalid JSON (HTTP 200)); retry 1/" in r.getMessage() for r in caplog.records), caplog.text
    script = Script([garbage])
    client, _ = make_client(script, max_retries=2)
    with pytest.raises(BadResponse) as info:
        client.get(DEALS)
    assert info.value.malformed and len(script.requests) == 3


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, json={"success": False, "error": "Scope and URL mismatch"}),
        httpx.Response(200, json={"success": True}),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(302, headers={"location": "/elsewhere"}),
    ],
)
def test_wrong_envelopes_are_bad_responses_without_retry(response: httpx.Response) -> None:
    script = Script([response])
    client, sleeps = make_client(script)
    with pytest.raises(BadResponse) as info:
        client.get(DEALS)
    assert not info.value.malformed
    assert len(script.requests) == 1 and sleeps == []


def test_every_rate_limit_header_reaches_the_budget() -> None:
    budget = FakeBudget()
    headers = {"x-ratelimit-limit": "80", "x-ratelimit-remaining": "79", "x-ratelimit-reset": "2", "x-daily-ratelimit-token-remaining": "9000"}
    script = Script([status(503, headers=headers), ok([], headers=headers), ok([])])
    client, _ = make_client(script, budget=budget)
    client.get(DEALS)
    client.get(DEALS)  # no rate-limit headers: nothing to observe
    assert len(budget.observed) == 2
    assert (budget.observed[0].limit, budget.observed[0].remaining, budget.observed[0].daily_remaining) == (80, 79, 9000)
    assert budget.acquired == 3


def test_reservation_covers_the_first_attempt_only_and_is_asked_for_the_rest() -> None:
    # A fetch thread's request goes to its round's reservation for everything budget-related: the
    # first attempt spends a held slot, a retry asks it for another, headers and 429s are told to
    # it (it hands what needs the database to the task's thread); the client's budget is not used.
    class Held:
        spent = acquired = observed = 0
        notes: list[tuple[str, float]] = []

        def spend(self, cancel: threading.Event | None = None) -> None:
            Held.spent += 1

        def acquire(self, cancel: threading.Event | None = None) -> None:
            Held.acquired += 1

        def observe(self, seen: object) -> None:
            Held.observed += 1

        def note_rate_limited(self, scope: str, retry_after: float) -> None:
            Held.notes.append((scope, retry_after))

    budget = FakeBudget()
    script = Script([status(502), status(429, headers={"retry-after": "0", "x-ratelimit-remaining": "0"}),
                     ok({"id": 5, "body": "<p>hi</p>"})])
    client, _ = make_client(script, budget=budget)
    assert client.mail_body(5, reservation=Held())["body"] == "<p>hi</p>"
    assert (Held.spent, Held.acquired) == (1, 2) and Held.notes == [("burst", 0.0)] and Held.observed >= 1
    assert budget.acquired == 0 and budget.limited == [] and budget.observed == [], "the client's budget is not touched"
    listing = Script([ok([], additional_data={"pagination": {"more_items_in_collection": False}})])
    client, _ = make_client(listing, budget=budget)
    client.mail_messages(5, reservation=Held())
    client.list_v2("/api/v2/deals", reservation=Held())
    assert Held.spent == 3 and Held.acquired == 2 and budget.acquired == 0


def test_cancel_before_the_request() -> None:
    stop = threading.Event()
    stop.set()
    script = Script([ok([])])
    client, _ = make_client(script, cancel=stop)
    with pytest.raises(Cancelled) as info:
        client.get(DEALS)
    assert isinstance(info.value, TaskStopped)
    assert script.requests == []


def test_cancel_ends_a_long_wait_within_a_fraction_of_a_second() -> None:
    stop = threading.Event()
    script = Script([status(429, headers={"retry-after": "25"})])
    client = PipedriveClient(BASE, TOKEN, transport=script.transport(), cancel=stop)  # real sleeping
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        client.get(DEALS)
    assert time.monotonic() - started < 2.0
    assert len(script.requests) == 1


def test_per_call_cancel_overrides() -> None:
    stop = threading.Event()
    stop.set()
    client, _ = make_client(Script([ok([])]))
    with pytest.raises(Cancelled):
        client.get(DEALS, cancel=stop)


def test_rejects_tokens_in_params_and_queries_in_paths() -> None:
    client, _ = make_client(Script([ok([])]))
    with pytest.raises(ValueError):
        client.get(DEALS, {"api_token": TOKEN})
    with pytest.raises(ValueError):
        client.get(f"{DEALS}?limit=5")
    with pytest.raises(ValueError):
        client.list_v2("/v1/deals")
    with pytest.raises(ValueError):
        client.list_v1("/api/v2/deals")
    with pytest.raises(ValueError):
        client.list_v2(DEALS, limit=501)
    with pytest.raises(ValueError):
        client.mail_body("1/../../users")  # type: ignore[arg-type]


def test_concurrent_use_from_sixteen_threads() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        time.sleep(0.01)
        return ok({"path": request.url.path})

    script = Script([answer])
    client, _ = make_client(script)
    results: list[str] = []
    lock = threading.Lock()

    def fetch(i: int) -> None:
        for j in range(5):
            data = client.get(f"/v1/mailbox/mailMessages/{i * 10 + j}")["data"]
            with lock:
                results.append(data["path"])

    threads = [threading.Thread(target=fetch, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 80 and len(set(results)) == 80


def test_pool_is_sized_for_sixteen_concurrent_requests() -> None:
    client = PipedriveClient(BASE, TOKEN)
    pool = client._http._transport._pool  # type: ignore[attr-defined]
    assert pool._max_connections >= 16 and pool._max_keepalive_connections >= 16
    assert repr(client) == f"PipedriveClient(base_url={BASE!r})"
    client.close()


# --- decoding: what the bytes are, not what the transport did (issue 8, item 7) ----------------


def test_invalid_utf8_is_decoded_once_with_replacement_not_retried_as_not_json() -> None:
    raw = b'{"success": true, "data": {"id": 9, "subject": "ok \xef\xbf\xbd", "body": "<p>caf\xe9 \xff\xfe</p>"}}'
    script = Script([httpx.Response(200, content=raw, headers={"content-type": "application/json"})])
    client, sleeps = make_client(script)
    message = client.mail_body(9)
    assert len(script.requests) == 1 and sleeps == [], "a deterministic decoding problem is not retried"
    assert message["body"] == "<p>caf\ufffd \ufffd\ufffd</p>"
    assert message["subject"] == "ok \ufffd", "a U+FFFD the source sent is kept as sent"
    assert message.invalid_utf8 == 3, "three invalid sequences, the source's own U+FFFD not counted"
    envelope = make_client(Script([httpx.Response(200, content=raw)]))[0].get("/v1/mailbox/mailMessages/9")
    assert envelope["data"]["id"] == 9 and envelope.invalid_utf8 == 3


def test_valid_utf8_reports_no_repairs_and_a_cut_off_body_still_retries() -> None:
    client, _ = make_client(Script([ok({"id": 1, "body": "caf\u00e9 \u2603 \U0001f600"})]))
    message = client.mail_body(1)
    assert message["body"] == "caf\u00e9 \u2603 \U0001f600" and message.invalid_utf8 == 0
    # a read cut inside a multi-byte character is invalid UTF-8 AND not JSON: a transport accident
    cut = httpx.Response(200, content='{"success": true, "data": {"id": 1, "body": "caf\u00e9'.encode()[:-1])
    script = Script([cut, ok({"id": 1, "body": "x"})])
    client, sleeps = make_client(script)
    assert client.mail_body(1)["body"] == "x" and len(script.requests) == 2 and sleeps == [0.25]


@pytest.mark.parametrize("code", [403, 404])
def test_a_private_or_deleted_mail_body_is_body_unavailable_at_once(code: int) -> None:
    script = Script([status(code)])
    client, sleeps = make_client(script)
    with pytest.raises(BodyUnavailable) as info:
        client.mail_body(77)
    assert info.value.status == code and len(script.requests) == 1 and sleeps == []
    assert "GET /v1/mailbox/mailMessages/77" in str(info.value) and f"HTTP {code}" in str(info.value)


def test_a_401_on_a_mail_body_is_still_the_token() -> None:
    client, _ = make_client(Script([status(401)]))
    with pytest.raises(AuthError):
        client.mail_body(77)
