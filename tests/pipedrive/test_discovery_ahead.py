"""Issue 11: a v2 list's discovery asks its two `update_time` probes at once - the descending
probe's first page asked ahead (`client.Prefetch`) while the ascending one is asked - not one round
trip after the other (a deals discovery on the phase's critical path took three: the summary, then
each probe). Same requests; only a client without a prefetch store asks them one by one."""
from __future__ import annotations

import json
import threading

import httpx

from engine_core.providers.pipedrive.client import PipedriveClient, Prefetch
from engine_core.providers.pipedrive.provider import discover

TIMES = {"asc": "2024-01-02T03:04:05Z", "desc": "2025-06-07T08:09:10Z"}


def test_both_probes_are_in_flight_at_once() -> None:
    together = threading.Barrier(2, timeout=10)  # neither probe is answered until both were asked
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        direction = request.url.params["sort_direction"]
        asked.append(direction)
        together.wait()
        body = {"success": True, "data": [{"id": 1, "update_time": TIMES[direction]}],
                "additional_data": {"next_cursor": None}}
        return httpx.Response(200, content=json.dumps(body).encode(), headers={"content-type": "application/json"})

    client = PipedriveClient("https://example.invalid", "tok", transport=httpx.MockTransport(handler),
                             prefetch=Prefetch(), max_retries=0)
    with client:
        found = discover(client, "/api/v2/deals")
    assert found.rows and found.oldest is not None and found.newest is not None
    assert found.oldest.year == 2024 and found.newest.year == 2025
    assert sorted(asked) == ["asc", "desc"], "one request per probe"
    assert found.requests == 2
