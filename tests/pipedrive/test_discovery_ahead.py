"""A v2 list's discovery: a list its first (ascending, whole-page) probe holds costs that one
request, kept for its one walker; a longer list is probed at its other end too."""
from __future__ import annotations

import json

import httpx

from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.prefetch import Prefetch
from engine_core.providers.pipedrive import stripes
from engine_core.providers.pipedrive.listing import discover, discovery_seeds

TIMES = {"asc": "2024-01-02T03:04:05Z", "desc": "2025-06-07T08:09:10Z"}


def _client(pages: dict[str, dict]) -> tuple[PipedriveClient, list[str]]:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        direction = request.url.params["sort_direction"]
        asked.append(direction)
        return httpx.Response(200, content=json.dumps(pages[direction]).encode(), headers={"content-type": "application/json"})

    return PipedriveClient("https://example.invalid", "tok", transport=httpx.MockTransport(handler),
                           prefetch=Prefetch(), max_retries=0), asked


def test_a_list_its_first_page_holds_costs_one_request_kept_for_its_walker() -> None:
    page = {"success": True, "data": [{"id": 1, "update_time": TIMES["asc"]}], "additional_data": {"next_cursor": None}}
    client, asked = _client({"asc": page})
    with client:
        found = discover(client, "/api/v2/deals")
        (seed,) = discovery_seeds("deals", found)
        walker = client.list_v2("/api/v2/deals", stripes.v2_params(seed.cursor), limit=stripes.PAGE)
    assert asked == ["asc"] and found.whole == 1 and found.requests == 1
    assert walker.kept and [r["id"] for r in walker.rows] == [1]


def test_a_longer_list_is_probed_at_both_ends() -> None:
    more = {"success": True, "data": [{"id": 1, "update_time": TIMES["asc"]}], "additional_data": {"next_cursor": "c"}}
    last = {"success": True, "data": [{"id": 2, "update_time": TIMES["desc"]}], "additional_data": {"next_cursor": None}}
    client, asked = _client({"asc": more, "desc": last})
    with client:
        found = discover(client, "/api/v2/deals")
    assert asked == ["asc", "desc"] and found.whole is None and found.requests == 2
    assert found.oldest.year == 2024 and found.newest.year == 2025
