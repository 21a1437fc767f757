"""Worker processes for the budget's cross-process tests (spawned: each has its own Database)."""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

from engine_core.budget import Budget
from engine_core.db import Database
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import PipedriveError

CALLS = ("pipelines", "notes", "stages")


def fetch_worker(
    db_url: str,
    base_url: str,
    token: str,
    account: str,
    budget_options: dict[str, Any],
    threads: int,
    seconds: float,
    results: Any,
) -> None:
    """`threads` fetch threads sharing one client and one Budget for `seconds`; reports to `results`."""
    db = Database(db_url, max_size=2, name=f"worker-{account}")
    budget = Budget(db, "pipedrive", account, **budget_options)
    client = PipedriveClient(base_url, token, budget=budget, max_retries=3)
    counts: Counter[str] = Counter()
    sent: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def loop(i: int) -> None:
        n = i
        while time.monotonic() < deadline:
            kind = CALLS[n % len(CALLS)]
            try:
                if kind == "pipelines":
                    client.list_v2("/api/v2/pipelines", limit=10)
                elif kind == "stages":
                    client.list_v2("/api/v2/stages", limit=10)
                else:
                    client.list_v1("/v1/notes", limit=5)
                outcome = "ok"
            except PipedriveError as e:
                outcome = type(e).__name__
            with lock:
                counts[outcome] += 1
            n += 1

    # record when each slot was taken (just before its request is sent), on the shared wall clock
    original = budget.acquire

    def acquire(cancel: Any = None) -> None:
        original(cancel)
        with lock:
            sent.append(time.time())

    budget.acquire = acquire  # type: ignore[method-assign]
    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    client.close()
    results.put({"account": account, "counts": dict(counts), "sent": sent, "stats": asdict(budget.stats())})
    db.close()
