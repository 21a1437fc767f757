"""Worker processes for the budget's cross-process tests (spawned: each has its own Database)."""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from engine_core.budget import Budget
from engine_core.db import Database
from engine_core.errors import RateLimitParked
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import PipedriveError

CALLS = ("pipelines", "notes", "stages")


def sandbox_day(anchor: float, day_seconds: float) -> Any:
    """The sandbox's day boundaries as a Budget `daily_reset` rule: seconds from an epoch time to the
    next boundary (anchor + k * day_seconds, wall clock), 50 ms late rather than early."""
    def seconds_to_reset(now: float) -> float:
        return (anchor - now) % day_seconds + 0.05
    return seconds_to_reset


def fetch_worker(
    db_url: str,
    base_url: str,
    token: str,
    account: str,
    budget_options: dict[str, Any],
    threads: int,
    seconds: float,
    results: Any,
    calls: tuple[str, ...] = CALLS,
    day: tuple[float, float] | None = None,
) -> None:
    """`threads` fetch threads sharing one client and one Budget for `seconds`; reports to `results`.
    `day` = (anchor, day_seconds): the sandbox's day, and a parked thread sleeps until its reset."""
    db = Database(db_url, max_size=2, name=f"worker-{account}")
    options = dict(budget_options)
    if day is not None:
        options["daily_reset"] = sandbox_day(*day)
    budget = Budget(db, "pipedrive", account, **options)
    client = PipedriveClient(base_url, token, budget=budget, max_retries=3)
    counts: Counter[str] = Counter()
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(i: int) -> None:
        n = i
        while time.monotonic() < deadline:
            kind = calls[n % len(calls)]
            try:
                if kind == "pipelines":
                    client.list_v2("/api/v2/pipelines", limit=10)
                elif kind == "stages":
                    client.list_v2("/api/v2/stages", limit=10)
                else:
                    client.list_v1("/v1/notes", limit=5)
                outcome = "ok"
            except RateLimitParked as e:  # DailyLimitReached is one: wait for the reset, then go on
                outcome = "parked"
                time.sleep(max(0.0, min(e.wait_seconds, deadline - time.monotonic())))
            except PipedriveError as e:
                outcome = type(e).__name__
            with lock:
                counts[outcome] += 1
            n += 1

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    client.close()
    results.put({"account": account, "counts": dict(counts), "stats": asdict(budget.stats())})
    db.close()
