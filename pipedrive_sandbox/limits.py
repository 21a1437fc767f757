"""Rate limits: a rolling burst window per token and a daily token budget per company.

Burst: at most `burst_limit` accepted requests in any rolling `window` seconds per token; the
request over it is answered 429 "Request over limit" with `Retry-After` = seconds until the oldest
request leaves the window. Daily: every accepted request is charged its endpoint's token cost;
once the company's budget for the current simulated day (`day_seconds` long, counted from the
server's start) is spent, every request is answered 429 "Daily rate limit exceeded" with
`x-daily-ratelimit-token-remaining: 0` and `Retry-After` = seconds until the day resets.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class LimitDecision:
    """Outcome of one request's limit check, with the headers to send."""

    allowed: bool
    kind: str | None  # None | "burst" | "daily"
    headers: dict[str, str]
    retry_after: int | None = None


@dataclass
class RateLimiter:
    """The burst window per token and the daily budget per company (see the module docstring).

    Limits and header names follow Pipedrive's rate-limit docs (burst: a rolling 2 s window;
    `x-ratelimit-limit`/`-remaining`/`-reset` in seconds; daily: `x-daily-ratelimit-token-*`).
    `clock` is injectable so tests step time instead of sleeping."""

    burst_limit: int = 80
    window: float = 2.0
    daily_budget: int | None = None
    day_seconds: float = 86400.0
    clock: Callable[[], float] = time.monotonic
    _windows: dict[str, deque[float]] = field(default_factory=dict)
    _t0: float = field(default=0.0)
    _day: int = 0
    used_today: int = 0

    def __post_init__(self) -> None:
        self._t0 = self.clock()

    def reconfigure(self, *, burst_limit: int, window: float, daily_budget: int | None, day_seconds: float) -> None:
        """Take new limits; a new daily budget or day length starts a fresh simulated day."""
        if daily_budget != self.daily_budget or day_seconds != self.day_seconds:
            # A new budget or day length starts a fresh simulated day.
            self._t0 = self.clock()
            self._day = 0
            self.used_today = 0
        self.burst_limit = burst_limit
        self.window = window
        self.daily_budget = daily_budget
        self.day_seconds = day_seconds

    def _roll_day(self, now: float) -> None:
        day = int((now - self._t0) // self.day_seconds)
        if day != self._day:
            self._day = day
            self.used_today = 0

    def seconds_to_day_reset(self, now: float | None = None) -> float:
        """Seconds until the current simulated day ends (at `now`, default the clock)."""
        now = self.clock() if now is None else now
        return self._t0 + (int((now - self._t0) // self.day_seconds) + 1) * self.day_seconds - now

    def daily_state(self) -> dict[str, object]:
        """The daily budget's state for stats: `{budget, used, remaining, day, seconds_to_reset}`."""
        now = self.clock()
        self._roll_day(now)
        return {
            "budget": self.daily_budget,
            "used": self.used_today,
            "remaining": None if self.daily_budget is None else max(0, self.daily_budget - self.used_today),
            "day": self._day,
            "seconds_to_reset": round(self.seconds_to_day_reset(now), 3),
        }

    def check(self, token: str, cost: int) -> LimitDecision:
        """Admit or refuse one request of `token` costing `cost` tokens, with the headers to send.

        Daily first (once spent, everything is refused until the day resets), then burst; an admitted
        request enters the window and is charged its cost."""
        now = self.clock()
        self._roll_day(now)
        q = self._windows.setdefault(token, deque())
        cutoff = now - self.window
        while q and q[0] <= cutoff:
            q.popleft()
        headers: dict[str, str] = {"x-ratelimit-limit": str(self.burst_limit)}

        def daily_headers(remaining: int) -> None:
            if self.daily_budget is not None:
                headers["x-daily-ratelimit-token-limit"] = str(self.daily_budget)
                headers["x-daily-ratelimit-token-remaining"] = str(max(0, remaining))

        def burst_reset() -> int:
            if not q:
                return 0
            return max(1, math.ceil(q[0] + self.window - now))

        if self.daily_budget is not None and self.used_today >= self.daily_budget:
            retry = max(1, math.ceil(self.seconds_to_day_reset(now)))
            headers["x-ratelimit-remaining"] = str(max(0, self.burst_limit - len(q)))
            headers["x-ratelimit-reset"] = str(burst_reset())
            daily_headers(0)
            headers["retry-after"] = str(retry)
            return LimitDecision(False, "daily", headers, retry)
        if len(q) >= self.burst_limit:
            retry = burst_reset()
            headers["x-ratelimit-remaining"] = "0"
            headers["x-ratelimit-reset"] = str(retry)
            daily_headers((self.daily_budget or 0) - self.used_today)
            headers["retry-after"] = str(retry)
            return LimitDecision(False, "burst", headers, retry)
        q.append(now)
        self.used_today += cost
        headers["x-ratelimit-remaining"] = str(self.burst_limit - len(q))
        headers["x-ratelimit-reset"] = str(burst_reset())
        daily_headers((self.daily_budget or 0) - self.used_today)
        return LimitDecision(True, None, headers)
