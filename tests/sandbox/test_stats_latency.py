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


def test_latency_profiles() -> None:
    with SandboxServer(SandboxConfig(burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
        assert _median_seconds(c, "/api/v2/deals?limit=10", 5) < 0.05
        sb.configure(latency="realistic:0.05")
        body = _median_seconds(c, "/v1/mailbox/mailMessages/1?include_body=1", 9)
        listing = _median_seconds(c, "/api/v2/deals?limit=10", 9)
        single = _median_seconds(c, "/api/v2/deals/1?x=1", 9)
        assert 0.025 < body < 0.12, body
        assert 0.008 < listing < 0.04, listing
        assert single < listing < body


async def _raw_get(host: str, port: int, target: str) -> int:
    """One GET on its own connection with plain asyncio streams (httpx's pool is the bottleneck
    at hundreds of connections, not the server)."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}\r\nx-api-token: {TOKEN}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return int(raw.split(b" ", 2)[1])


def test_hundreds_of_concurrent_connections_are_in_flight_together() -> None:
    n = 300
    with SandboxServer(SandboxConfig(latency="realistic:0.25", burst_limit=10**6)) as sb:

        async def run() -> list[int]:
            return await asyncio.gather(
                *(_raw_get(sb.host, sb.port, f"/v1/mailbox/mailMessages/{1 + i % 30}?include_body=1&k={i}") for i in range(n))
            )

        started = time.perf_counter()
        codes = asyncio.run(run())
        elapsed = time.perf_counter() - started
        assert codes == [200] * n
        stats = sb.stats()
        print(f"\n{n} concurrent body fetches: {elapsed:.2f} s, peak in flight {stats['in_flight']['body_fetches_peak']}")
        assert stats["in_flight"]["body_fetches_peak"] >= n * 0.8, stats["in_flight"]
        assert stats["in_flight"]["peak_by_endpoint"]["/v1/mailbox/mailMessages/{id}"] >= n * 0.8
        assert sum(stats["bodies_fetched"].values()) == n
        assert elapsed < 4.0, "a sequential server would take ~75 s"
