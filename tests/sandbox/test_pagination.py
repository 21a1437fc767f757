"""Pagination and filtering: every id exactly once, in order, in the right endpoint.

Pins:
* v2 cursor walks (`limit`, `cursor`, `additional_data.next_cursor` null at the end) return each id
  of truth once, in id order (asc and desc; `sort_by=update_time` gives the same order);
  `limit` > 500 (or < 1) is 400; a malformed cursor is 400;
* v1 offset walks (`start`, `limit`, `additional_data.pagination` with `more_items_in_collection`
  and `next_start`) return each id once, in order; `limit` > 500 is 400;
* archived deals are only in `/api/v2/deals/archived`, archived leads only in `/v1/leads/archived`;
* `updated_since` (>=) and `updated_until` (<) filter by `update_time`;
* a deal's mail list pages through all its messages, including a deal with >1000 messages.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer

from .conftest import make_client


def walk_v2(client: httpx.Client, path: str, **params: Any) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        query = dict(params)
        if cursor:
            query["cursor"] = cursor
        r = client.get(path, params=query)
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        items += body["data"]
        pages += 1
        cursor = body["additional_data"]["next_cursor"]
        if cursor is None:
            return items, pages
        assert pages < 10_000


def walk_v1(client: httpx.Client, path: str, **params: Any) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    start = 0
    pages = 0
    while True:
        r = client.get(path, params={**params, "start": start})
        assert r.status_code == 200, r.text[:300]
        body = r.json()
        pag = body["additional_data"]["pagination"]
        assert pag["start"] == start
        items += body["data"]
        pages += 1
        if not pag["more_items_in_collection"]:
            assert "next_start" not in pag
            return items, pages
        assert pag["next_start"] == start + len(body["data"])
        start = pag["next_start"]


V2_KINDS = [
    ("/api/v2/persons", "persons"),
    ("/api/v2/organizations", "organizations"),
    ("/api/v2/deals", "deals"),
    ("/api/v2/deals/archived", "deals_archived"),
    ("/api/v2/activities", "activities"),
    ("/api/v2/pipelines", "pipelines"),
    ("/api/v2/stages", "stages"),
]


@pytest.mark.parametrize("path,kind", V2_KINDS)
def test_v2_cursor_walk_returns_every_id_once_in_order(tiny: SandboxServer, client: httpx.Client, path: str, kind: str) -> None:
    expected = tiny.truth(kind)["ids"][kind]
    items, pages = walk_v2(client, path, limit=7)
    ids = [i["id"] for i in items]
    assert ids == expected
    assert pages == max(1, -(-len(expected) // 7))
    desc, _ = walk_v2(client, path, limit=7, sort_direction="desc")
    assert [i["id"] for i in desc] == expected[::-1]


@pytest.mark.parametrize("path,kind", [p for p in V2_KINDS if p[1] not in ("pipelines", "stages")])
def test_v2_sort_by_update_time_follows_update_time(tiny: SandboxServer, client: httpx.Client, path: str, kind: str) -> None:
    items, _ = walk_v2(client, path, limit=9, sort_by="update_time")
    times = [i["update_time"] for i in items]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert sorted(i["id"] for i in items) == sorted(tiny.truth(kind)["ids"][kind])
    by_add, _ = walk_v2(client, path, limit=500, sort_by="add_time", sort_direction="desc")
    add_times = [i["add_time"] for i in by_add]
    assert add_times == sorted(add_times, reverse=True)


def test_v2_stages_sorted_by_order_nr(client: httpx.Client) -> None:
    items, _ = walk_v2(client, "/api/v2/stages", limit=3, sort_by="order_nr")
    keys = [(s["order_nr"], s["id"]) for s in items]
    assert keys == sorted(keys)
    assert len({s["id"] for s in items}) == len(items)


def test_v2_fields_pagination(client: httpx.Client) -> None:
    whole = client.get("/api/v2/dealFields", params={"limit": 500}).json()
    assert whole["additional_data"]["next_cursor"] is None
    items, pages = walk_v2(client, "/api/v2/dealFields", limit=4)
    assert items == whole["data"] and pages > 1


@pytest.mark.parametrize("limit", ["501", "0", "-1", "abc"])
def test_limit_out_of_range_is_400(client: httpx.Client, limit: str) -> None:
    for path in ("/api/v2/deals", "/api/v2/persons", "/v1/leads", "/v1/notes"):
        r = client.get(path, params={"limit": limit})
        assert r.status_code == 400, (path, limit)
        assert r.json()["success"] is False


def test_limit_500_is_accepted_and_cursor_is_checked(client: httpx.Client) -> None:
    assert client.get("/api/v2/deals", params={"limit": 500}).status_code == 200
    assert client.get("/v1/notes", params={"limit": 500}).status_code == 200
    assert client.get("/api/v2/deals", params={"cursor": "not-a-cursor!!"}).status_code == 400
    cursor = client.get("/api/v2/deals", params={"limit": 2}).json()["additional_data"]["next_cursor"]
    assert client.get("/api/v2/deals", params={"cursor": cursor, "sort_direction": "desc"}).status_code == 400


def test_archived_deals_only_in_archived_endpoint(tiny: SandboxServer, client: httpx.Client) -> None:
    truth = tiny.truth()["ids"]
    active, _ = walk_v2(client, "/api/v2/deals", limit=500)
    archived, _ = walk_v2(client, "/api/v2/deals/archived", limit=500)
    assert truth["deals_archived"], "the tiny account must have archived deals"
    assert {d["id"] for d in active}.isdisjoint({d["id"] for d in archived})
    assert all(d["is_archived"] is False for d in active)
    assert all(d["is_archived"] is True for d in archived)
    # An archived deal is still readable by id.
    one = client.get(f"/api/v2/deals/{truth['deals_archived'][0]}").json()["data"]
    assert one["is_archived"] is True


def test_archived_leads_only_in_archived_endpoint(tiny: SandboxServer, client: httpx.Client) -> None:
    truth = tiny.truth()["ids"]
    active, _ = walk_v1(client, "/v1/leads", limit=3)
    archived, _ = walk_v1(client, "/v1/leads/archived", limit=2)
    assert [l["id"] for l in active] == truth["leads"]
    assert [l["id"] for l in archived] == truth["leads_archived"]
    assert truth["leads_archived"] and set(truth["leads"]).isdisjoint(truth["leads_archived"])
    assert all(l["is_archived"] is False for l in active) and all(l["is_archived"] for l in archived)


@pytest.mark.parametrize("path,kind,limit", [("/v1/notes", "notes", 7), ("/v1/users", "users", 3), ("/v1/leads", "leads", 500)])
def test_v1_offset_walk_returns_every_id_once_in_order(tiny: SandboxServer, client: httpx.Client, path: str, kind: str, limit: int) -> None:
    expected = tiny.truth(kind)["ids"][kind]
    items, pages = walk_v1(client, path, limit=limit)
    assert [i["id"] for i in items] == expected
    assert pages == max(1, -(-len(expected) // limit))


def test_v1_sort_parameter(client: httpx.Client) -> None:
    newest_first, _ = walk_v1(client, "/v1/notes", limit=11, sort="update_time DESC")
    times = [n["update_time"] for n in newest_first]
    assert times == sorted(times, reverse=True)
    by_user, _ = walk_v1(client, "/v1/notes", limit=11, sort="user_id ASC")
    assert [n["user_id"] for n in by_user] == sorted(n["user_id"] for n in by_user)
    assert client.get("/v1/notes", params={"sort": "nope ASC"}).status_code == 400


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00").replace(" ", "T")).timestamp()


@pytest.mark.parametrize("path", ["/api/v2/persons", "/api/v2/deals", "/api/v2/activities", "/api/v2/organizations"])
def test_v2_updated_since_and_until(client: httpx.Client, path: str) -> None:
    everything, _ = walk_v2(client, path, limit=500)
    since = everything[len(everything) // 4]["update_time"]
    until = everything[3 * len(everything) // 4]["update_time"]
    got, _ = walk_v2(client, path, limit=5, updated_since=since, updated_until=until)
    expected = [i["id"] for i in everything if _ts(since) <= _ts(i["update_time"]) < _ts(until)]
    assert [i["id"] for i in got] == expected and expected
    only_since, _ = walk_v2(client, path, limit=500, updated_since=since)
    assert [i["id"] for i in only_since] == [i["id"] for i in everything if _ts(i["update_time"]) >= _ts(since)]
    assert client.get(path, params={"updated_since": "yesterday"}).status_code == 400


def test_v1_updated_since(client: httpx.Client) -> None:
    for path in ("/v1/notes", "/v1/leads"):
        everything, _ = walk_v1(client, path, limit=500)
        since = everything[len(everything) // 2]["update_time"]
        since_rfc = datetime.fromtimestamp(_ts(since)).astimezone().isoformat()
        got, _ = walk_v1(client, path, limit=4, updated_since=since_rfc)
        assert [i["id"] for i in got] == [i["id"] for i in everything if _ts(i["update_time"]) >= _ts(since)]


def test_v2_filters_and_ids(tiny: SandboxServer, client: httpx.Client) -> None:
    deals, _ = walk_v2(client, "/api/v2/deals", limit=500)
    owner = deals[0]["owner_id"]
    mine, _ = walk_v2(client, "/api/v2/deals", limit=3, owner_id=owner)
    assert [d["id"] for d in mine] == [d["id"] for d in deals if d["owner_id"] == owner]
    won, _ = walk_v2(client, "/api/v2/deals", limit=500, status="won,lost")
    assert [d["id"] for d in won] == [d["id"] for d in deals if d["status"] in ("won", "lost")]
    pick = [deals[5]["id"], deals[1]["id"], 999_999]
    got = client.get("/api/v2/deals", params={"ids": ",".join(map(str, pick))}).json()["data"]
    assert [d["id"] for d in got] == sorted(pick[:2])


def test_deal_mail_pages_through_a_big_deal() -> None:
    with SandboxServer(SandboxConfig(scale="tiny", big_deal_messages=1200, burst_limit=10**6)) as sb:
        mail = sb.truth("deals_with_mail")["deals_with_mail"]
        big_deal, big_ids = max(mail.items(), key=lambda kv: len(kv[1]))
        assert len(big_ids) == 1200
        with make_client(sb.base_url) as c:
            items, pages = walk_v1(c, f"/v1/deals/{big_deal}/mailMessages", limit=500)
            assert [m["data"]["id"] for m in items] == big_ids and pages == 3
            assert all(m["object"] == "mailMessage" for m in items)
            small_deal, small_ids = min(mail.items(), key=lambda kv: len(kv[1]))
            items, _ = walk_v1(c, f"/v1/deals/{small_deal}/mailMessages")
            assert [m["data"]["id"] for m in items] == small_ids
            no_mail = next(d for d in sb.truth("deals")["ids"]["deals"] if str(d) not in mail)
            r = c.get(f"/v1/deals/{no_mail}/mailMessages").json()
            assert r["data"] == [] and r["additional_data"]["pagination"]["more_items_in_collection"] is False
            assert c.get("/v1/deals/999999/mailMessages").status_code == 404
