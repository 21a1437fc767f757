"""The budget's guarantee against a faithful Pipedrive over a real socket: two worker processes of
eight fetch threads each, sharing one account's budget row, never put more than the burst limit
into the sandbox's rolling window (its own count of burst 429s stays 0); a spent daily budget parks
every worker (DailyLimitReached, wait within the day) without calling the source, and requests
succeed again after the reset.
"""
from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine_core.budget import Budget
from engine_core.db import Database
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import DailyLimitReached
from tests.budget.workers import fetch_worker

sandbox_server = pytest.importorskip("pipedrive_sandbox.server", reason="the sandbox server is not built yet")
from pipedrive_sandbox.config import SandboxConfig  # noqa: E402

TOKEN = "budget-test-token"
BURST = 20


@pytest.fixture
def sandbox() -> Iterator[Any]:
    config = SandboxConfig(scale="tiny", seed=1, token=TOKEN, burst_limit=BURST, daily_budget=None, day_seconds=86400, faults="", latency="none")
    with sandbox_server.SandboxServer(config) as sb:
        yield sb


def peak_in_window(times: list[float], window: float) -> int:
    times = sorted(times)
    peak, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] <= t - window:
            lo += 1
        peak = max(peak, hi - lo + 1)
    return peak


def test_two_processes_sixteen_threads_never_trip_the_burst_window(db_url: str, sandbox: Any) -> None:
    options = {"burst_limit": BURST, "chunk": 4, "lease_ttl": 0.5, "latency_margin": 0.25}
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=fetch_worker, args=(db_url, sandbox.base_url, TOKEN, "company-1", options, 8, 6.0, results))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    stats = sandbox.stats()
    ok = sum(r["counts"].get("ok", 0) for r in reports)
    failed = {k: v for r in reports for k, v in r["counts"].items() if k != "ok"}
    sent = [t for r in reports for t in r["sent"]]
    leases = sum(r["stats"]["leases"] for r in reports)
    statements = sum(r["stats"]["statements"] for r in reports)
    peak = peak_in_window(sent, 2.0)
    print(
        f"\n2 processes x 8 threads, burst limit {BURST}/2 s: {stats['requests_total']} requests in 6 s, "
        f"429 burst={stats['rate_limited']['burst']} daily={stats['rate_limited']['daily']}, "
        f"peak {peak} sends in any 2 s, {leases} leases, {statements} budget statements "
        f"({1000 * statements / max(1, ok):.0f} per 1,000 requests at chunk 4)"
    )
    assert stats["rate_limited"]["burst"] == 0
    assert failed == {}
    assert stats["requests_total"] == ok == len(sent)
    assert ok >= 25  # the sandbox saw real traffic from both processes
    assert all(r["counts"].get("ok", 0) > 0 for r in reports)
    assert peak <= BURST
    assert statements <= 2 * ok / options["chunk"] + 4  # one per chunk, plus creating the row


def test_spent_daily_budget_parks_every_worker_until_the_reset(db: Database, db_url: str, sandbox: Any) -> None:
    day = 3.0
    sandbox.configure(burst_limit=80, daily_budget=50, day_seconds=day)  # a fresh simulated day
    started = time.monotonic()
    options = {"burst_limit": 80, "chunk": 8, "daily_probe_seconds": 0.5}
    budget = Budget(db, "pipedrive", "company-2", **options)
    client = PipedriveClient(sandbox.base_url, TOKEN, budget=budget)
    parked: list[DailyLimitReached] = []
    lock = threading.Lock()

    def spend() -> None:
        for _ in range(30):
            try:
                client.list_v2("/api/v2/pipelines", limit=10)  # 5 tokens each: 10 fit in the day
            except DailyLimitReached as e:
                with lock:
                    parked.append(e)
                return

    threads = [threading.Thread(target=spend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spent = sandbox.stats()
    assert len(parked) == 4  # every fetch thread parked
    assert all(0 < e.wait_seconds <= day for e in parked)
    # the headers said "0 left" and the process parked: at most the in-flight requests met a 429
    assert spent["rate_limited"]["daily"] <= 4

    # another worker (its own Database and Budget) parks from the row, without calling the source
    other_db = Database(db_url, max_size=2)
    other = PipedriveClient(sandbox.base_url, TOKEN, budget=Budget(other_db, "pipedrive", "company-2", **options))
    with pytest.raises(DailyLimitReached) as info:
        other.list_v2("/api/v2/pipelines", limit=10)
    assert 0 < info.value.wait_seconds <= day
    assert sandbox.stats()["requests_total"] == spent["requests_total"]

    # after the reset both work again (the first after its probe learns the exact reset from a 429)
    deadline = started + day + 2.0
    for c in (client, other):
        while True:
            try:
                assert c.list_v2("/api/v2/pipelines", limit=10).rows
                break
            except DailyLimitReached as e:
                assert e.wait_seconds <= day
                assert time.monotonic() + e.wait_seconds < deadline + day
                time.sleep(e.wait_seconds + 0.05)
    assert time.monotonic() - started < 2 * day + 2
    other.close()
    other_db.close()
    client.close()
