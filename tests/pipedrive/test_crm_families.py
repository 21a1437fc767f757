"""The further families' mappers and tables, reconciled with the sandbox's truth row by row on a
whole (tiny) account: every product, every deal line (read 100 deals a call), every file (its bytes
through the file store, by sha256; 403/404 downloads as the file's status), every participant,
follower and changelog entry, and time in stage from the history."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from engine_core.providers.pipedrive import fanouts
from engine_core.providers.pipedrive.files import content_status, map_file
from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.mapping import MalformedRow
from engine_core.providers.pipedrive.products import map_deal_product, map_product
from engine_core.target import crm
from engine_core.target.files import PostgresFileStore

from .support import TOKEN, sandbox

TENANT = "acme"
WORDS = {"deal": "deals", "person": "persons", "org": "organizations", "user": "users"}


def v2_rows(c: httpx.Client, path: str, params: list[tuple[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    cursor = None
    while True:
        page = c.get(path, params=(params or []) + [("limit", 500)] + ([("cursor", cursor)] if cursor else [])).json()
        yield from page["data"]
        cursor = page["additional_data"].get("next_cursor")
        if not cursor:
            return


def v1_rows(c: httpx.Client, path: str) -> Iterator[dict[str, Any]]:
    start = 0
    while True:
        page = c.get(path, params={"start": start, "limit": 100}).json()
        yield from page["data"] or []
        more = page["additional_data"]["pagination"]
        if not more["more_items_in_collection"]:
            return
        start = more["next_start"]


class Target:
    """Stub parents (one crm row per source record the truth lists) and the mapped rows written
    with their references resolved against them."""

    def __init__(self, tx, truth: dict[str, Any]) -> None:
        self.tx, self.ids = tx, {}
        for kind, table, column in (("users", "users", "name"), ("organizations", "companies", "name"),
                                    ("persons", "contacts", "name"), ("deals", "deals", "title"),
                                    ("deals_archived", "deals", "title")):
            for sid in truth["ids"][kind]:
                row = {"tenant_id": TENANT, "source": "pipedrive", "source_id": str(sid), column: f"{kind} {sid}",
                       "source_created_at": "2000-01-01T00:00:00Z"}
                self.ids[(WORDS.get(kind, "deals") if kind == "deals_archived" else kind, str(sid))] = crm.insert(tx, table, row)

    def write(self, mapped) -> int | None:
        values = dict(mapped.values)
        for ref in mapped.parents:
            found = self.ids.get((WORDS.get(ref.ref, ref.ref), ref.source_id))
            if found is None:
                return None
            values[ref.column] = found
        for ref in mapped.links:
            values[ref.column] = self.ids.get((WORDS.get(ref.ref, ref.ref), ref.source_id))
        row_id = crm.insert(self.tx, mapped.table, values)
        self.ids[(mapped.table, mapped.source_id)] = row_id
        return row_id


@pytest.fixture(scope="module")
def account():
    with sandbox(forbidden_fanout=2) as sb:
        yield sb, httpx.Client(base_url=sb.base_url, headers={"x-api-token": TOKEN}, timeout=60)


def test_products_and_deal_lines_match_the_truth_row_by_row(db, account) -> None:
    sb, c = account
    truth = sb.truth()
    deals = [str(d) for d in truth["ids"]["deals"] + truth["ids"]["deals_archived"]]
    with db.transaction() as tx:
        target = Target(tx, truth)
        for row in v2_rows(c, "/api/v2/products"):
            target.write(map_product(row, TENANT, FieldBook()))
        calls = 0
        for start in range(0, len(deals), 100):
            calls += 1
            for row in v2_rows(c, "/api/v2/deals/products", [("deal_ids", d) for d in deals[start:start + 100]]):
                assert target.write(map_deal_product(row, TENANT)) is not None
    products = db.sql("SELECT source_id, name, code, prices FROM crm.products ORDER BY source_id::int")
    assert [int(p["source_id"]) for p in products] == sb.truth("products")["ids"]["products"]
    forbidden = {str(d) for d in truth["forbidden_fanout"].get("deals", [])}
    lines = sb.truth("deal_products")["deal_products"]
    want = {(deal, str(line["id"]), str(line["product_id"]), line["quantity"], line["sum"], line["order_nr"])
            for deal, rows in lines.items() if deal not in forbidden for line in rows}
    got = db.sql("SELECT d.source_id AS deal, l.source_id, l.product_ref, l.quantity, l.sum, l.order_nr, l.product_id"
                 " FROM crm.deal_products l JOIN crm.deals d ON d.id = l.deal_id")
    assert {(g["deal"], g["source_id"], g["product_ref"], float(g["quantity"]), float(g["sum"]), g["order_nr"]) for g in got} == want
    assert want and calls == 1, "the whole tiny account's lines come in one batched call per 100 deals"
    purged = {g["product_ref"] for g in got if g["product_id"] is None}
    assert purged and all(int(p) % 21 == 0 for p in purged), "a line of a purged product keeps its product_ref"


def test_files_match_the_truth_by_sha256_and_download_status(db, account) -> None:
    sb, c = account
    truth = sb.truth()
    store = PostgresFileStore()
    with db.transaction() as tx:
        target = Target(tx, truth)
        for row in v1_rows(c, "/v1/files"):
            mapped = map_file(row, TENANT)
            with c.stream("GET", f"/v1/files/{mapped.source_id}/download") as r:
                if r.status_code == 200:
                    stored = store.put(tx, TENANT, r.iter_bytes(), expected_size=mapped.values["file_size"])
                    mapped.values.update(content_status="stored", content_sha256=stored.sha256)
                else:
                    mapped.values["content_status"] = content_status(r.status_code)
            target.write(mapped)
    got = {int(r["source_id"]): r for r in db.sql("SELECT * FROM crm.files")}
    files = sb.truth("files")["files"]
    assert sorted(got) == sorted(f["id"] for f in files)
    status = {200: "stored", 403: "forbidden", 404: "missing"}
    for f in files:
        row = got[f["id"]]
        assert (row["file_name"], row["file_size"], row["content_status"]) == (f["file_name"], f["file_size"], status[f["download"]])
        assert row["content_sha256"] == (f["sha256"] if f["download"] == 200 else None), f["id"]
    assert {f["download"] for f in files} >= {200, 403, 404}
    with pytest.raises(ValueError):
        content_status(500)


def test_participants_followers_and_history_match_the_truth(db, account) -> None:
    sb, c = account
    truth = sb.truth()
    deals = [str(d) for d in truth["ids"]["deals"] + truth["ids"]["deals_archived"]]
    forbidden = {k: {str(i) for i in v} for k, v in truth["forbidden_fanout"].items()}
    refused = 0
    with db.transaction() as tx:
        target = Target(tx, truth)
        for deal in deals:
            if c.get(f"/v1/deals/{deal}/participants").status_code == 403:
                refused += 1
                assert deal in forbidden["deals"]
                continue
            for row in v1_rows(c, f"/v1/deals/{deal}/participants"):
                target.write(fanouts.map_participant(row, TENANT, deal))
            for row in v2_rows(c, f"/v1/deals/{deal}/changelog"):
                target.write(fanouts.map_deal_change(row, TENANT, deal))
        for kind in ("deals", "persons", "organizations"):
            ids = deals if kind == "deals" else [str(i) for i in truth["ids"][kind]]
            for sid in ids:
                if sid in forbidden.get(kind, set()):
                    continue
                for row in v2_rows(c, f"/api/v2/{kind}/{sid}/followers"):
                    target.write(fanouts.map_follower(row, TENANT, kind, sid))
    assert refused == len(forbidden["deals"]) > 0
    participants = sb.truth("participants")["participants"]
    want = {(d, str(p["id"]), str(p["person_id"])) for d, rows in participants.items() if d not in forbidden["deals"]
            for p in rows}
    got = db.sql("SELECT d.source_id AS deal, p.source_id, p.contact_ref FROM crm.deal_participants p"
                 " JOIN crm.deals d ON d.id = p.deal_id")
    assert {(g["deal"], g["source_id"], g["contact_ref"]) for g in got} == want and want
    followers = sb.truth("followers")["followers"]
    want_f = {f"{kind}:{sid}:{u}" for kind, by in followers.items() for sid, users in by.items()
              if sid not in forbidden.get(kind, set()) for u in users}
    assert {r["source_id"] for r in db.sql("SELECT source_id FROM crm.followers")} == want_f
    history = sb.truth("deal_history")["deal_history"]
    want_h = {(d, h["field_key"], h["old_value"], h["new_value"]) for d, rows in history.items()
              if d not in forbidden["deals"] for h in rows}
    got_h = db.sql("SELECT d.source_id AS deal, h.field_key, h.old_value, h.new_value FROM crm.deal_history h"
                   " JOIN crm.deals d ON d.id = h.deal_id")
    assert {(g["deal"], g["field_key"], g["old_value"], g["new_value"]) for g in got_h} == want_h and len(got_h) == len(want_h)
    # time in stage: each deal's stays chain its stage changes, the last one its current stage
    stays = db.sql("SELECT d.source_id AS deal, s.stage_ref, s.entered_at, s.left_at FROM crm.deal_stage_periods s"
                   " JOIN crm.deals d ON d.id = s.deal_id ORDER BY d.source_id, s.entered_at")
    for deal, rows in history.items():
        moves = [h for h in reversed(rows) if h["field_key"] == "stage_id"]
        if deal in forbidden["deals"] or not moves:
            continue
        mine = [s for s in stays if s["deal"] == deal]
        assert [s["stage_ref"] for s in mine] == [moves[0]["old_value"]] + [m["new_value"] for m in moves], deal
        assert mine[-1]["left_at"] is None and all(s["left_at"] == n["entered_at"] for s, n in zip(mine, mine[1:]))


def test_malformed_family_rows_fail_alone_with_their_reason() -> None:
    with pytest.raises(MalformedRow, match="deal_id is missing"):
        map_deal_product({"id": 3, "quantity": 1}, TENANT)
    with pytest.raises(MalformedRow, match="file_size"):
        map_file({"id": 3, "file_name": "a.pdf", "file_size": -1}, TENANT)
    with pytest.raises(MalformedRow, match="user_id is missing"):
        fanouts.map_follower({"add_time": "2020-01-01T00:00:00Z"}, TENANT, "deals", "1")
    with pytest.raises(MalformedRow, match="time is missing"):
        fanouts.map_deal_change({"field_key": "stage_id"}, TENANT, "1")
    entry = {"field_key": "value", "old_value": "1", "new_value": "2", "time": "2020-01-01 00:00:00", "actor_user_id": 1}
    assert fanouts.change_key("7", entry) == fanouts.change_key("7", dict(entry)) != fanouts.change_key("8", entry)
