"""Stats, latency and concurrency.

Pins:
* `/_sandbox/stats` counts requests and tokens per endpoint template, listings by path and sorted
  query without the token, bodies fetched per message id, peaks of requests in flight (overall,
  per template, and for body fetches); `POST /_sandbox/stats/reset` zeroes it;
* latency `none` adds nothing; `realistic:<factor>` delays a body fetch more than a listing, and a
  listing more than a single GET, scaled by the factor;
* delays are asynchronous: hundreds of concurrent connections are in flight at once (no
  concurrency limit, a deep listen backlog).
"""
from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.config import FaultSpec, parse_latency
from pipedrive_sandbox.faults import LATENCY_MEDIANS, FaultPlan

from .conftest import TOKEN, make_client


def test_stats_shape_and_reset() -> None:
    with SandboxServer(SandboxConfig(burst_limit=10**6)) as sb, httpx.Client(base_url=sb.base_url, timeout=10) as c:
        c.get("/api/v2/deals", params={"limit": 5, "api_token": TOKEN, "sort_by": "id"})
        c.get("/api/v2/deals", params={"sort_by": "id", "limit": 5}, headers={"x-api-token": TOKEN})
        c.get("/v1/mailbox/mailMessages/1", params={"include_body": 1, "api_token": TOKEN})
        c.get("/v1/mailbox/mailMessages/1", params={"include_body": 1, "api_token": TOKEN})
        c.get("/v1/mailbox/mailMessages/2", params={"api_token": TOKEN})
        c.get("/api/v2/deals", params={"limit": 900, "api_token": TOKEN})
        stats = sb.stats()
        assert stats["requests"]["/api/v2/deals"] == 3
        assert stats["tokens"]["/api/v2/deals"] == 30
        assert stats["requests"]["/v1/mailbox/mailMessages/{id}"] == 3
        assert stats["tokens"]["/v1/mailbox/mailMessages/{id}"] == 6
        assert stats["listings"] == {"/api/v2/deals?limit=5&sort_by=id": 2}
        assert stats["bodies_fetched"] == {"1": 2}
        assert stats["status_codes"]["/api/v2/deals"] == {"200": 2, "400": 1}
        assert stats["rate_limited"] == {"burst": 0, "daily": 0}
        assert stats["in_flight"]["current"] == 0 and stats["in_flight"]["peak"] >= 1
        assert TOKEN not in str(stats)
        sb.reset_stats()
        assert sb.stats()["requests_total"] == 0 and sb.stats()["listings"] == {}


def _median_seconds(c: httpx.Client, url: str, n: int) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        assert c.get(url + f"&i={i}").status_code == 200
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def test_latency_profiles_shape_the_delays() -> None:
    # The delays themselves, from the deterministic plan: no clock involved.
    plan = FaultPlan(1, FaultSpec(), parse_latency("none"))
    assert {plan.decide(f"GET /x?i={i}", c).latency for i in range(50) for c in ("list", "single", "body")} == {0.0}
    plan.reconfigure(FaultSpec(), parse_latency("realistic:0.5"))
    medians = {c: statistics.median(plan.decide(f"GET /x?i={i}", c).latency for i in range(2001)) for c in ("list", "single", "body")}
    assert medians["single"] < medians["list"] < medians["body"]
    for c, full in LATENCY_MEDIANS.items():
        assert abs(medians[c] - 0.5 * full) < 0.05 * full, (c, medians[c])
    body = [plan.decide(f"GET /b?i={i}", "body").latency for i in range(5000)]
    assert 0.01 < sum(1 for d in body if d > 1.5) / len(body) < 0.05, "a tail of several times the median"


def test_latency_is_served() -> None:
    # Over the socket: only lower bounds, which a slow machine cannot break.
    with SandboxServer(SandboxConfig(burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
        sb.configure(latency="realistic:0.05")
        body = _median_seconds(c, "/v1/mailbox/mailMessages/1?include_body=1", 9)
        listing = _median_seconds(c, "/api/v2/deals?limit=10", 9)
        assert body > 0.025, body
        assert listing > 0.008, listing


async def _open(host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(host, port)


async def _send_and_read(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], host: str, target: str) -> int:
    """One GET on an already open connection with plain asyncio streams (httpx's pool is the
    bottleneck at hundreds of connections, not the server)."""
    reader, writer = conn
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nx-api-token: {TOKEN}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return int(raw.split(b" ", 2)[1])


def test_hundreds_of_concurrent_connections_are_in_flight_together() -> None:
    # Every connection is opened first, then all requests go out in one burst: how fast a loaded
    # machine opens 300 sockets no longer matters. A body fetch at the realistic profile sleeps at
    # least ~0.35 s (lognormal around 1 s), far longer than the burst takes to send and parse, so a
    # server that handles requests concurrently has them all in flight at once, and one that
    # serialises them has one.
    n = 300
    with SandboxServer(SandboxConfig(latency="realistic", burst_limit=10**6)) as sb:

        async def run() -> list[int]:
            conns = await asyncio.gather(*(_open(sb.host, sb.port) for _ in range(n)))
            return await asyncio.gather(
                *(_send_and_read(c, sb.host, f"/v1/mailbox/mailMessages/{1 + i % 30}?include_body=1&k={i}") for i, c in enumerate(conns))
            )

        codes = asyncio.run(run())
        assert codes == [200] * n
        stats = sb.stats()
        print(f"\n{n} concurrent body fetches: peak in flight {stats['in_flight']['body_fetches_peak']}")
        assert stats["in_flight"]["body_fetches_peak"] >= n * 0.9, stats["in_flight"]
        assert stats["in_flight"]["peak_by_endpoint"]["/v1/mailbox/mailMessages/{id}"] >= n * 0.9
        assert sum(stats["bodies_fetched"].values()) == n
