"""Rate limits: the rolling burst window per token and the daily token budget per company.

Pins:
* every authenticated response carries `x-ratelimit-limit`, `x-ratelimit-remaining` (counting
  down) and `x-ratelimit-reset` (seconds until the window frees a slot, not a timestamp), plus the
  daily headers when a budget is set;
* the request over the burst limit is 429 "Request over limit" with `Retry-After` (seconds until
  the window frees) and remaining 0; after waiting that long requests pass again;
* when the daily budget is spent every request is 429 "Daily rate limit exceeded" with
  `x-daily-ratelimit-token-remaining: 0` and `Retry-After` until the simulated day resets; after
  `day_seconds` the budget is back; each request is charged its endpoint's token cost;
* stats count 429s by kind.
"""
from __future__ import annotations

import time

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.limits import RateLimiter

from .conftest import make_client


def test_headers_count_down_and_reset_is_seconds(tiny: SandboxServer) -> None:
    with SandboxServer(SandboxConfig(burst_limit=50)) as sb, make_client(sb.base_url) as c:
        remaining = []
        for _ in range(5):
            r = c.get("/api/v2/pipelines")
            assert r.status_code == 200
            assert r.headers["x-ratelimit-limit"] == "50"
            remaining.append(int(r.headers["x-ratelimit-remaining"]))
            reset = int(r.headers["x-ratelimit-reset"])
            assert 0 < reset <= 2, "seconds until the 2 s window frees a slot"
            assert "x-daily-ratelimit-token-limit" not in r.headers
        assert remaining == [49, 48, 47, 46, 45]


def test_burst_429_then_recovers_after_retry_after() -> None:
    with SandboxServer(SandboxConfig(burst_limit=5, daily_budget=100_000)) as sb, make_client(sb.base_url) as c:
        for _ in range(5):
            assert c.get("/api/v2/stages").status_code == 200
        r = c.get("/api/v2/stages")
        assert r.status_code == 429
        body = r.json()
        assert body["success"] is False and body["error"] == "Request over limit"
        assert r.headers["x-ratelimit-remaining"] == "0"
        retry = int(r.headers["retry-after"])
        assert 1 <= retry <= 2
        assert int(r.headers["x-ratelimit-reset"]) == retry
        # Burst and daily are distinguishable: the daily budget is far from spent.
        assert int(r.headers["x-daily-ratelimit-token-remaining"]) > 0
        stats = sb.stats()
        assert stats["rate_limited"] == {"burst": 1, "daily": 0}
        assert stats["tokens"]["/api/v2/stages"] == 5 * 5, "rejected requests are not charged"
        time.sleep(retry + 0.05)
        assert c.get("/api/v2/stages").status_code == 200


def test_daily_budget_exhaustion_and_reset() -> None:
    day = 1.5
    with SandboxServer(SandboxConfig(daily_budget=45, day_seconds=day, burst_limit=1000)) as sb, make_client(sb.base_url) as c:
        r = c.get("/v1/leads")  # costs 20
        assert r.status_code == 200
        assert r.headers["x-daily-ratelimit-token-limit"] == "45"
        assert r.headers["x-daily-ratelimit-token-remaining"] == "25"
        r = c.get("/v1/notes")  # 20 more: 5 left
        assert r.headers["x-daily-ratelimit-token-remaining"] == "5"
        r = c.get("/api/v2/deals")  # 10: allowed while tokens remain, spends the rest
        assert r.status_code == 200 and r.headers["x-daily-ratelimit-token-remaining"] == "0"
        started = time.monotonic()
        r = c.get("/api/v2/pipelines")
        assert r.status_code == 429
        assert r.json()["error"] == "Daily rate limit exceeded"
        assert r.headers["x-daily-ratelimit-token-remaining"] == "0"
        retry = int(r.headers["retry-after"])
        assert 1 <= retry <= 2
        assert int(r.headers["x-ratelimit-remaining"]) > 0, "the burst window is not what is exhausted"
        assert c.get("/api/v2/deals/1").status_code == 429, "every request is refused until the reset"
        assert sb.stats()["rate_limited"]["daily"] == 2
        assert sb.stats()["daily"]["remaining"] == 0
        time.sleep(max(0.0, day - (time.monotonic() - started)) + 0.1)
        r = c.get("/api/v2/pipelines")
        assert r.status_code == 200
        assert r.headers["x-daily-ratelimit-token-remaining"] == str(45 - 5)


def test_budget_and_burst_can_change_at_run_time() -> None:
    with SandboxServer(SandboxConfig(burst_limit=1000)) as sb, make_client(sb.base_url) as c:
        sb.configure(daily_budget=10)
        assert c.get("/api/v2/deals").status_code == 200
        assert c.get("/api/v2/deals").status_code == 429
        sb.configure(daily_budget=None, burst_limit=2)
        assert c.get("/api/v2/deals").status_code == 200
        r = c.get("/api/v2/deals")
        assert r.status_code == 429 and r.json()["error"] == "Request over limit"


def test_limiter_unit_rolling_window() -> None:
    now = [100.0]
    lim = RateLimiter(burst_limit=3, window=2.0, clock=lambda: now[0])
    assert all(lim.check("t", 1).allowed for _ in range(3))
    d = lim.check("t", 1)
    assert not d.allowed and d.kind == "burst" and d.retry_after == 2
    now[0] += 1.0
    assert lim.check("t", 1).retry_after == 1
    now[0] += 1.01
    assert lim.check("t", 1).allowed, "the oldest requests left the rolling window"
    assert lim.check("other-token", 1).allowed, "the window is per token"
