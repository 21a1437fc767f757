"""The budget's guarantees against a faithful Pipedrive over a real socket, with real worker
processes on real Postgres: two processes of eight fetch threads each, sharing one account's budget
row, never put more than the burst limit into the sandbox's rolling window (the sandbox's own count
of burst 429s stays 0); two processes never spend more than their share of a (short) day's token
budget by the sandbox's own count; a spent daily budget parks every worker (DailyLimitReached, wait
within the day) without calling the source, and requests succeed again after the reset.
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
from tests.budget.workers import fetch_worker, sandbox_day

sandbox_server = pytest.importorskip("pipedrive_sandbox.server", reason="the sandbox server is not built yet")
from pipedrive_sandbox.config import SandboxConfig  # noqa: E402

TOKEN = "budget-test-token"
BURST = 20
# The fewest tokens a whole simulated day of the share test must spend: three 5-token requests. A
# day the workers stayed parked through (the share never handed out again after the reset) spends 0.
FLOOR = 15


@pytest.fixture
def sandbox() -> Iterator[Any]:
    config = SandboxConfig(scale="tiny", seed=1, token=TOKEN, burst_limit=BURST, daily_budget=None, day_seconds=86400, faults="", latency="none")
    with sandbox_server.SandboxServer(config) as sb:
        yield sb


def run_workers(db_url: str, sandbox: Any, n: int, options: dict[str, Any], threads: int, seconds: float, **kw: Any) -> list[dict[str, Any]]:
    """n worker processes (spawned, each its own Database and Budget, one account), joined."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=fetch_worker, args=(db_url, sandbox.base_url, TOKEN, "company-1", options, threads, seconds, results), kwargs=kw)
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    reports = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return reports


def test_two_processes_sixteen_threads_never_trip_the_burst_window(db_url: str, sandbox: Any) -> None:
    # The sandbox enforces the rolling window itself: a request arriving when BURST were accepted
    # in the 2 s before it is answered 429 and counted. So its burst 429 count is the number of
    # times the workers together put more than the limit into a rolling window: it must stay 0 while
    # both processes, 8 fetch threads each, ask for far more than the limit (no latency).
    options = {"burst_limit": BURST}  # the defaults: ttl 0.05 s, margin 0.075 s, rate 0.94 L/W
    sandbox.reset_stats()
    reports = run_workers(db_url, sandbox, 2, options, 8, 6.0)
    stats = sandbox.stats()
    ok = sum(r["counts"].get("ok", 0) for r in reports)
    failed = {k: v for r in reports for k, v in r["counts"].items() if k != "ok"}
    leases = sum(r["stats"]["leases"] for r in reports)
    statements = sum(r["stats"]["statements"] for r in reports)
    expired = sum(r["stats"]["slots_expired"] for r in reports)
    print(
        f"\n2 processes x 8 threads, burst limit {BURST}/2 s: {stats['requests_total']} requests in 6 s each, "
        f"429 burst={stats['rate_limited']['burst']} daily={stats['rate_limited']['daily']}, "
        f"{leases} leases, {statements} budget statements, {expired} slots expired"
    )
    assert stats["rate_limited"]["burst"] == 0
    assert failed == {}
    assert stats["requests_total"] == ok
    assert all(r["counts"].get("ok", 0) > 0 for r in reports)  # both processes were served
    # one statement per chunk, plus creating the row; on a loaded machine a lease may find the
    # window full and grant nothing (a statement without a lease: seen 20 against 15 + 4). A
    # statement per request would be a chunk's worth of statements per lease.
    assert statements <= 2 * leases + 4, (statements, leases, ok)


def test_two_processes_never_spend_more_than_their_share_of_a_day(db_url: str, sandbox: Any) -> None:
    # A short simulated day (4 s) of 1,200 tokens, a share of 0.5: the sandbox's own count of the
    # day's tokens never passes 600 (polled every 20 ms; the workers are parked at each day's end,
    # so the last poll of a day sees its final count), no request meets a daily 429 (the engine
    # stops short of the budget), and the next day the workers go on (every whole day spends some
    # of its share: a share left unused once the workers parked fails here). How much of it a day
    # spends is throughput, not the share's safety: the burst rate alone would spend ~750 a day, but
    # a loaded 2-core machine was seen spending 45 of the 600 (spawned workers starved of CPU), so
    # the floor is a few requests' worth, not half the share. Every request costs 5 tokens
    # (/api/v2/pipelines), so max_cost = 5: what is held back is 5 x the slots in flight.
    day, budget, share = 4.0, 1200, 0.5
    sandbox.configure(burst_limit=80, daily_budget=budget, day_seconds=day)  # a fresh simulated day
    anchor = time.time() + sandbox.stats()["daily"]["seconds_to_reset"]
    sandbox.reset_stats()
    used: dict[int, int] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            d = sandbox.stats()["daily"]
            used[d["day"]] = max(used.get(d["day"], 0), d["used"])
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        # the engine's burst limit sits a quarter under the sandbox's: this test is about the day's
        # share (the burst window has its own test), and requests a loaded machine delays arrive
        # bunched (one burst 429 seen in a full suite beside other work at the shared limit)
        options = {"burst_limit": 60, "daily_share": share, "max_cost": 5}
        reports = run_workers(db_url, sandbox, 2, options, 4, 2.5 * day, calls=("pipelines",), day=(anchor, day))
    finally:
        done.set()
        poller.join()
    stats = sandbox.stats()
    print(f"\nshare {share} of {budget} tokens a {day:.0f} s day, 2 processes: tokens per day {dict(sorted(used.items()))}, "
          f"daily 429s {stats['rate_limited']['daily']}, outcomes {[r['counts'] for r in reports]}")
    assert stats["rate_limited"]["daily"] == 0
    assert stats["rate_limited"]["burst"] == 0
    assert all(v <= share * budget for v in used.values()), used
    whole_days = [used[d] for d in sorted(used)[1:-1]]  # the first day has the processes' start-up
    assert whole_days and all(v >= FLOOR for v in whole_days), used  # day after day, the share is spent again
    assert all(r["counts"].get("parked", 0) > 0 for r in reports)  # both processes waited on the day


def test_spent_daily_budget_parks_every_worker_until_the_reset(db: Database, db_url: str, sandbox: Any) -> None:
    day = 3.0
    sandbox.configure(burst_limit=80, daily_budget=50, day_seconds=day)  # a fresh simulated day
    started = time.monotonic()
    anchor = time.time() + sandbox.stats()["daily"]["seconds_to_reset"]
    # the whole budget (share 1.0), every request 5 tokens, the sandbox's day boundaries
    options = {"burst_limit": 80, "chunk": 8, "daily_probe_seconds": 0.5, "daily_share": 1.0, "max_cost": 5,
               "daily_reset": sandbox_day(anchor, day)}
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
