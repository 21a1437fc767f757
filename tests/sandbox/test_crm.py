"""The CRM's further families as served and as truth says: products, deal products, files (with their
bytes), participants, followers and deal history - each walked over HTTP the way a consumer pages it
and compared with `/_sandbox/truth?kind=...`, including under the live account (a line removed, a
file replaced, a deal's stage changed) and the forbidden_fanout shape (per-row 403s).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.crm import line_sum
from pipedrive_sandbox.data import Dataset

from .conftest import make_client


def walk_cursor(c: httpx.Client, url: str, **params: Any) -> list[dict[str, Any]]:
    """Every row of a v2-style cursor list."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        r = c.get(url, params={**params, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        body = r.json()
        rows += body["data"]
        cursor = body["additional_data"]["next_cursor"]
        if cursor is None:
            return rows


def walk_offset(c: httpx.Client, url: str, limit: int) -> list[dict[str, Any]]:
    """Every row of a v1 offset list."""
    rows: list[dict[str, Any]] = []
    start = 0
    while True:
        body = c.get(url, params={"start": start, "limit": limit}).json()
        rows += body["data"]
        pagination = body["additional_data"]["pagination"]
        if not pagination["more_items_in_collection"]:
            return rows
        start = pagination["next_start"]


@pytest.fixture
def live_sb() -> Iterator[SandboxServer]:
    with SandboxServer(SandboxConfig(scale="tiny", seed=3, burst_limit=10**6)) as sb:
        yield sb


def test_products_cursor_walk_equals_truth_and_purged_ids_answer_404(tiny: SandboxServer, client: httpx.Client) -> None:
    truth = tiny.truth("products")
    rows = walk_cursor(client, "/api/v2/products", limit=5)
    assert [r["id"] for r in rows] == truth["ids"]["products"] == sorted(truth["ids"]["products"])
    assert all(i % 21 for i in truth["ids"]["products"])
    by_name = walk_cursor(client, "/api/v2/products", limit=4, sort_by="name", sort_direction="desc")
    assert [r["name"] for r in by_name] == sorted((r["name"] for r in rows), reverse=True)
    rows_truth = client.get("/_sandbox/truth", params={"kind": "products", "rows": 1}).json()["rows"]
    for row in rows:
        assert client.get(f"/api/v2/products/{row['id']}").json()["data"] == row == rows_truth[str(row["id"])]
    assert client.get("/api/v2/products/21").status_code == 404


def test_product_fields_v1_and_v2_name_the_custom_fields_products_carry(client: httpx.Client) -> None:
    v2 = walk_cursor(client, "/api/v2/productFields", limit=3)
    custom = {f["field_code"] for f in v2 if f["is_custom_field"]}
    v1 = {f["key"] for f in client.get("/v1/productFields").json()["data"]}
    product = client.get("/api/v2/products?limit=1").json()["data"][0]
    assert custom and set(product["custom_fields"]) == custom and custom <= v1
    assert client.get(f"/api/v2/productFields/{sorted(custom)[0]}").json()["data"]["is_custom_field"] is True


def test_deal_products_of_many_deals_and_of_one_equal_truth(tiny: SandboxServer, client: httpx.Client) -> None:
    truth = tiny.truth("deal_products")["deal_products"]
    assert truth and all(1 <= len(lines) <= 4 for lines in truth.values())
    deal_ids = list(truth)
    repeated = walk_cursor(client, "/api/v2/deals/products", deal_ids=deal_ids, limit=3)
    comma = walk_cursor(client, "/api/v2/deals/products", deal_ids=",".join(deal_ids), limit=500)
    expected = sorted((line for lines in truth.values() for line in lines), key=lambda r: r["id"])
    assert repeated == comma == expected
    for deal_id, lines in truth.items():
        assert walk_cursor(client, f"/api/v2/deals/{deal_id}/products", limit=1) == lines
        for line in lines:
            assert line["sum"] == line_sum(line["quantity"], line["item_price"], line["discount"], line["discount_type"], line["tax"])
    by_order = walk_cursor(client, "/api/v2/deals/products", deal_ids=deal_ids, sort_by="order_nr", sort_direction="desc", limit=2)
    assert sorted(r["id"] for r in by_order) == [r["id"] for r in expected]
    assert [r["order_nr"] for r in by_order] == sorted((r["order_nr"] for r in expected), reverse=True)


@pytest.mark.parametrize("params,status", [({}, 400), ({"deal_ids": "x"}, 400), ({"deal_ids": ",".join(str(i) for i in range(1, 103))}, 400)])
def test_deal_products_refuses_bad_deal_ids(client: httpx.Client, params: dict[str, str], status: int) -> None:
    r = client.get("/api/v2/deals/products", params=params)
    assert r.status_code == status and r.json()["success"] is False


def test_a_purged_deal_answers_404_for_every_per_deal_list(client: httpx.Client) -> None:
    for url in ("/api/v2/deals/21/products", "/api/v2/deals/21/followers", "/v1/deals/21/participants", "/v1/deals/21/flow", "/v1/deals/21/changelog"):
        assert client.get(url).status_code == 404, url
    assert client.get("/api/v2/deals/products", params={"deal_ids": "21"}).json()["data"] == []


def test_product_removed_mid_run_leaves_lists_and_truth(live_sb: SandboxServer) -> None:
    with make_client(live_sb.base_url) as c:
        before = live_sb.truth("deal_products")["deal_products"]
        deal_id = next(d for d, lines in before.items() if len(lines) >= 2)
        first = c.get(f"/api/v2/deals/{deal_id}/products", params={"limit": 1}).json()
        live_sb.configure(live_mix="product_remove:1")
        removed = live_sb.live_step(5)
        assert all(ch["op"] == "product_remove" and ch["kind"] == "deal_products" for ch in removed)
        after = live_sb.truth("deal_products")
        gone = {ch["id"] for ch in removed}
        assert set(after["removed_deal_products"]) == gone
        served = {r["id"] for lines in after["deal_products"].values() for r in lines}
        assert not served & gone
        assert served | gone == {r["id"] for lines in before.values() for r in lines}
        # A cursor taken before the change still resumes after its row; the walk ends on truth.
        rest = walk_cursor(c, f"/api/v2/deals/{deal_id}/products", limit=1, cursor=first["additional_data"]["next_cursor"])
        assert rest == [r for r in after["deal_products"].get(deal_id, []) if r["id"] > first["data"][0]["id"]]
        for change in removed:
            lines = c.get(f"/api/v2/deals/{change['deal_id']}/products").json()["data"]
            assert change["id"] not in {r["id"] for r in lines}
            assert lines == after["deal_products"].get(str(change["deal_id"]), [])


def test_files_offset_walk_metadata_and_downloads_equal_truth(tiny: SandboxServer, client: httpx.Client) -> None:
    truth = tiny.truth("files")["files"]
    rows = walk_offset(client, "/v1/files", 7)
    assert [r["id"] for r in rows] == [f["id"] for f in truth]
    assert client.get("/v1/files", params={"limit": 101}).status_code == 400
    statuses = {f["download"] for f in truth}
    assert statuses == {200, 403, 404}
    for row, fact in zip(rows, truth):
        assert client.get(f"/v1/files/{row['id']}").json()["data"] == row
        assert row["file_size"] == fact["file_size"] and row["file_name"] == fact["file_name"]
        assert sum(x is not None for x in (row["deal_id"], row["person_id"], row["org_id"], row["activity_id"])) >= 1
        with client.stream("GET", f"/v1/files/{row['id']}/download") as r:
            assert r.status_code == fact["download"]
            if r.status_code != 200:
                r.read()
                assert r.json()["success"] is False
                continue
            assert r.headers["content-type"] == "application/octet-stream"
            assert int(r.headers["content-length"]) == fact["file_size"]
            h, n = hashlib.sha256(), 0
            for chunk in r.iter_bytes():
                h.update(chunk)
                n += len(chunk)
        assert (n, h.hexdigest()) == (fact["file_size"], fact["sha256"])
    assert client.get("/v1/files/99999/download").status_code == 404


def test_file_replaced_mid_run_serves_new_bytes_and_truth_follows(live_sb: SandboxServer) -> None:
    with make_client(live_sb.base_url) as c:
        before = {f["id"]: f for f in live_sb.truth("files")["files"]}
        live_sb.configure(live_mix="file_replace:1")
        change = live_sb.live_step(1)[0]
        assert change["op"] == "file_replace" and change["version"] == 1
        fid = change["id"]
        after = {f["id"]: f for f in live_sb.truth("files")["files"]}
        assert after[fid]["sha256"] != before[fid]["sha256"] and after[fid]["version"] == 1
        assert {k: v for k, v in after.items() if k != fid} == {k: v for k, v in before.items() if k != fid}
        body = c.get(f"/v1/files/{fid}/download").content
        assert (len(body), hashlib.sha256(body).hexdigest()) == (after[fid]["file_size"], after[fid]["sha256"])
        meta = c.get(f"/v1/files/{fid}").json()["data"]
        assert meta["file_size"] == after[fid]["file_size"]
        newest = c.get("/v1/files", params={"sort": "update_time DESC", "limit": 1}).json()["data"][0]
        assert newest["id"] == fid


def test_participants_and_followers_equal_truth(tiny: SandboxServer, client: httpx.Client) -> None:
    participants = tiny.truth("participants")["participants"]
    assert participants
    for deal_id, facts in participants.items():
        rows = walk_offset(client, f"/v1/deals/{deal_id}/participants", 1)
        assert [{"id": r["id"], "person_id": r["person"]["id"]} for r in rows] == facts
        body = client.get(f"/v1/deals/{deal_id}/participants").json()
        assert set(body["related_objects"]["person"]) == {str(f["person_id"]) for f in facts}
        assert all(r["related_item_id"] == int(deal_id) and r["person_id"]["value"] == r["person"]["id"] for r in rows)
    followers = tiny.truth("followers")["followers"]
    for kind in ("deals", "persons", "organizations"):
        for ident, users in list(followers[kind].items())[:15]:
            rows = walk_cursor(client, f"/api/v2/{kind}/{ident}/followers", limit=1)
            assert [r["user_id"] for r in rows] == users
            owner = client.get(f"/api/v2/{kind}/{ident}").json()["data"]["owner_id"]
            assert users[0] == owner


def test_deal_history_replays_to_the_served_deal_in_flow_and_changelog(tiny: SandboxServer, client: httpx.Client) -> None:
    history = tiny.truth("deal_history")["deal_history"]
    ds = Dataset("tiny", 1)
    per = ds.spec.stages_per_pipeline
    assert history
    for deal_id, changes in history.items():
        deal = client.get(f"/api/v2/deals/{deal_id}").json()["data"]
        assert walk_cursor(client, f"/v1/deals/{deal_id}/changelog", limit=1) == [{k: v for k, v in ch.items() if k != "id"} for ch in changes]
        flow = walk_offset(client, f"/v1/deals/{deal_id}/flow", 2)
        assert [(e["object"], e["data"]["field_key"], e["data"]["new_value"]) for e in flow] == [("dealChange", ch["field_key"], ch["new_value"]) for ch in changes]
        times = [ch["time"] for ch in changes]
        assert times == sorted(times, reverse=True)
        latest: dict[str, str] = {}
        for ch in changes:
            latest.setdefault(ch["field_key"], ch["new_value"])
        stages = [ch for ch in reversed(changes) if ch["field_key"] == "stage_id"]
        if stages:
            assert latest["stage_id"] == str(deal["stage_id"])
            assert int(stages[0]["old_value"]) == (deal["stage_id"] - 1) // per * per + 1  # from the pipeline's first stage
            assert stages[-1]["time"].replace(" ", "T") + "Z" == deal["stage_change_time"]
        if "status" in latest:
            assert latest["status"] == deal["status"]
        if "value" in latest:
            assert float(latest["value"]) == deal["value"]
    assert client.get(f"/v1/deals/{next(iter(history))}/flow", params={"items": "note"}).json()["data"] == []


def test_live_deal_updates_extend_the_history_from_the_values_served_before(live_sb: SandboxServer) -> None:
    with make_client(live_sb.base_url) as c:
        live_sb.configure(live_mix="update:1")
        for change in live_sb.live_step(30):
            if change["kind"] != "deals":
                continue
            deal = c.get(f"/api/v2/deals/{change['id']}").json()["data"]
            changes = c.get(f"/v1/deals/{change['id']}/changelog").json()["data"]
            latest: dict[str, str] = {}
            for ch in changes:
                latest.setdefault(ch["field_key"], ch["new_value"])
            assert latest["value"] == str(int(deal["value"]))
            if "stage_id" in latest:
                assert latest["stage_id"] == str(deal["stage_id"])
        assert live_sb.truth("deal_history")["deal_history"]


def test_forbidden_fanout_answers_403_per_row_and_keeps_the_row_listed() -> None:
    with SandboxServer(SandboxConfig(scale="tiny", burst_limit=10**6, forbidden_fanout=2)) as sb, make_client(sb.base_url) as c:
        forbidden = sb.truth("forbidden_fanout")["forbidden_fanout"]
        assert all(len(v) == 2 for v in forbidden.values())
        for deal_id in forbidden["deals"]:
            assert c.get(f"/api/v2/deals/{deal_id}").status_code == 200
            for url in (f"/api/v2/deals/{deal_id}/products", f"/api/v2/deals/{deal_id}/followers", f"/v1/deals/{deal_id}/participants",
                        f"/v1/deals/{deal_id}/flow", f"/v1/deals/{deal_id}/changelog"):
                r = c.get(url)
                assert r.status_code == 403 and r.json()["success"] is False, url
            assert c.get("/api/v2/deals/products", params={"deal_ids": deal_id}).json()["data"] == []
        for kind in ("persons", "organizations"):
            for ident in forbidden[kind]:
                assert c.get(f"/api/v2/{kind}/{ident}/followers").status_code == 403


def test_page_cap_and_empty_pages_shape_the_new_v2_lists() -> None:
    with SandboxServer(SandboxConfig(scale="tiny", burst_limit=10**6, empty_pages=True, page_cap=1)) as sb, make_client(sb.base_url) as c:
        truth = sb.truth("deal_products")["deal_products"]
        deal_id = next(d for d, lines in truth.items() if len(lines) >= 2)
        first = c.get(f"/api/v2/deals/{deal_id}/products", params={"limit": 100}).json()
        assert first["data"] == [] and first["additional_data"]["next_cursor"]
        assert walk_cursor(c, f"/api/v2/deals/{deal_id}/products", limit=100) == truth[deal_id]
        assert walk_cursor(c, "/api/v2/deals/products", deal_ids=list(truth), limit=100) == sorted(
            (r for lines in truth.values() for r in lines), key=lambda r: r["id"])
        followers = sb.truth("followers")["followers"]["deals"]
        ident, users = max(followers.items(), key=lambda kv: len(kv[1]))
        assert [r["user_id"] for r in walk_cursor(c, f"/api/v2/deals/{ident}/followers")] == users


def test_rows_created_live_serve_empty_families_and_their_owner_as_follower(live_sb: SandboxServer) -> None:
    with make_client(live_sb.base_url) as c:
        live_sb.configure(live_mix="create:1")
        created = [ch for ch in live_sb.live_step(20) if ch["kind"] in ("deals", "persons", "organizations")]
        assert created
        for ch in created:
            row = c.get(f"/api/v2/{ch['kind']}/{ch['id']}").json()["data"]
            assert c.get(f"/api/v2/{ch['kind']}/{ch['id']}/followers").json()["data"] == [{"user_id": row["owner_id"], "add_time": row["add_time"]}]
            if ch["kind"] == "deals":
                assert c.get(f"/api/v2/deals/{ch['id']}/products").json()["data"] == []
                assert c.get(f"/v1/deals/{ch['id']}/participants").json()["data"] == []
                assert c.get(f"/v1/deals/{ch['id']}/changelog").json()["data"] == []


def test_the_families_are_generated_per_row_on_demand() -> None:
    """Building an account draws none of the families: a deal's lines, a file's metadata and bytes
    are made when asked for, so tests that build the small account often pay nothing for them."""
    ds = Dataset("small", 5)
    assert not any(name.startswith(("_lines", "_files", "_history")) for name in vars(ds))
    assert ds.count("files") == 300 and ds.count("products") == 80
    assert ds.deal_lines(ds.count("deals")) == [] and ds.deal_changes(-1) == []


def test_participants_follow_person_merges_and_deletes(live_sb: SandboxServer) -> None:
    with make_client(live_sb.base_url) as c:
        live_sb.configure(live_mix="merge:1,delete:1")
        live_sb.live_step(60)
        truth = live_sb.truth()
        gone = set(truth["deleted"]["persons"]) | {int(k) for k in truth["merged"]["persons"]}
        persons = set(truth["ids"]["persons"])
        assert gone
        for deal_id, facts in live_sb.truth("participants")["participants"].items():
            ids = [f["person_id"] for f in facts]
            assert set(ids) <= persons and not set(ids) & gone and len(ids) == len(set(ids))
            assert [r["person"]["id"] for r in c.get(f"/v1/deals/{deal_id}/participants").json()["data"]] == ids


def test_the_families_depend_on_the_seed_alone() -> None:
    def digest(ds: Dataset) -> str:
        h = hashlib.sha256()
        for d in range(ds.count("deals")):
            h.update(repr((ds.deal_lines(d), ds.deal_participant_persons(d), ds.deal_changes(d))).encode())
        for i in range(ds.count("files")):
            h.update(repr(ds.file_record(i)).encode())
            for chunk in ds.file_chunks(i, 0, ds.file_size(i)):
                h.update(chunk)
        for i in range(ds.count("products")):
            h.update(repr(ds.record("products", i)).encode())
        return h.hexdigest()

    assert digest(Dataset("tiny", 1)) == digest(Dataset("tiny", 1)) != digest(Dataset("tiny", 2))
