"""The API shapes, served over a real socket, and the truth that names them.

Pins, per shape (each off by default, `SandboxConfig` field = CLI flag = run-time config key):
* `page_cap`: every list serves at most N rows a page whatever `limit` asks; v1 says
  `more_items_in_collection: true` and `next_start = start + rows served`; v2's cursor resumes
  right after the last row served; walking the pagination fields yields every row exactly once.
* `empty_pages`: every v2 list's first page (no cursor) is `data: []` with a next_cursor that
  resumes at the first row; following it yields every row.
* `null_update_time`: N rows of each kind are served with `update_time: null`; unfiltered walks
  have them, no updated_since/updated_until filter returns them, so the union of the walks
  [None, t) and [t, None) misses exactly them; update_time sorts put them last asc, first desc.
* purged parents: every id a row points at in `truth()["dangling_refs"]` answers 404.
* `archive_flip`: a candidate served by the active list is then only in the archived list (and GET
  says archived); truth and the deals summary follow.
* `hostile_mail`: the four variants' bytes on the wire are as described (a body over 1,200,000
  characters, a `\\u0000`, a `\\ud800` escape in subject/snippet, raw 0xff 0xfe in a body).
* `private_mail`: listed normally, metadata served, body fetch 403 (even id) / 404 (odd id).
* shaped responses still validate against the published spec (update_time null allowed).
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.__main__ import build_parser, config_from_args

from .conftest import make_client, response_schema
from .test_fidelity import ALLOWED_UNDECLARED_NULLS, _strip_prefix, undeclared_null_paths

V2_LISTS = {
    "organizations": "/api/v2/organizations",
    "persons": "/api/v2/persons",
    "deals": "/api/v2/deals",
    "deals_archived": "/api/v2/deals/archived",
    "activities": "/api/v2/activities",
    "pipelines": "/api/v2/pipelines",
    "stages": "/api/v2/stages",
}
V1_LISTS = {"notes": "/v1/notes", "leads": "/v1/leads", "leads_archived": "/v1/leads/archived", "users": "/v1/users"}


@contextmanager
def shaped(**shape: Any) -> Iterator[tuple[SandboxServer, httpx.Client]]:
    with SandboxServer(SandboxConfig(scale="tiny", seed=1, burst_limit=10**6, **shape)) as sb, make_client(sb.base_url) as c:
        yield sb, c


def walk_v2(c: httpx.Client, path: str, **params: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """(ids in served order, pages) following next_cursor until null."""
    ids: list[Any] = []
    pages: list[dict[str, Any]] = []
    cursor = None
    for _ in range(1000):
        q = dict(params, **({"cursor": cursor} if cursor else {}))
        r = c.get(path, params=q)
        assert r.status_code == 200, (path, q, r.text[:200])
        body = r.json()
        pages.append(body)
        ids += [row["id"] if "id" in row else row["field_code"] for row in body["data"]]
        cursor = body["additional_data"]["next_cursor"]
        if cursor is None:
            return ids, pages
    raise AssertionError(f"{path}: the cursor never ended")


def walk_v1(c: httpx.Client, path: str, **params: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    """(ids in served order, pages) following next_start while more_items_in_collection."""
    ids: list[Any] = []
    pages: list[dict[str, Any]] = []
    start = 0
    for _ in range(1000):
        r = c.get(path, params=dict(params, start=start))
        assert r.status_code == 200, (path, start, r.text[:200])
        body = r.json()
        pages.append(body)
        ids += [row["id"] if "id" in row else row["data"]["id"] for row in body["data"]]
        pagination = body["additional_data"]["pagination"]
        if not pagination["more_items_in_collection"]:
            return ids, pages
        assert pagination["next_start"] == start + len(body["data"])
        start = pagination["next_start"]
    raise AssertionError(f"{path}: more_items_in_collection never ended")


# --------------------------------------------------------------------------- page_cap
def test_page_cap_serves_short_pages_whose_pagination_fields_reach_every_row() -> None:
    with shaped(page_cap=15, big_deal_messages=40) as (sb, c):
        truth = sb.truth()
        notes, pages = walk_v1(c, "/v1/notes", limit=500)
        assert len(truth["ids"]["notes"]) > 15
        assert [len(p["data"]) for p in pages[:-1]] == [15] * (len(pages) - 1) and 0 < len(pages[-1]["data"]) <= 15
        assert all(p["additional_data"]["pagination"]["more_items_in_collection"] for p in pages[:-1])
        assert pages[0]["additional_data"]["pagination"]["next_start"] == 15
        assert sorted(notes) == sorted(truth["ids"]["notes"]) and len(notes) == len(set(notes))
        for name, path in V1_LISTS.items():
            ids, _ = walk_v1(c, path, limit=500)
            assert sorted(ids, key=str) == sorted(truth["ids"][name], key=str), name
        for name, path in V2_LISTS.items():
            ids, pages = walk_v2(c, path, limit=500)
            assert all(len(p["data"]) <= 15 for p in pages), name
            assert ids == sorted(truth["ids"][name]), name
        big = max(truth["deals_with_mail"].items(), key=lambda kv: len(kv[1]))
        assert len(big[1]) == 40
        mail, pages = walk_v1(c, f"/v1/deals/{big[0]}/mailMessages", limit=100)
        assert mail == big[1] and len(pages) == 3
        assert c.get("/v1/notes", params={"limit": 501}).status_code == 400  # limit above the max is still refused
        fields, _ = walk_v2(c, "/api/v2/dealFields", limit=500)
        assert len(fields) > 15 and len(fields) == len(set(fields))


# --------------------------------------------------------------------------- empty_pages
def test_empty_pages_answer_no_rows_with_a_cursor_that_reaches_every_row() -> None:
    with shaped(empty_pages=True) as (sb, c):
        truth = sb.truth()
        for name, path in V2_LISTS.items():
            ids, pages = walk_v2(c, path, limit=500)
            assert pages[0]["data"] == [] and pages[0]["additional_data"]["next_cursor"], name
            assert ids == sorted(truth["ids"][name]), name
        first = c.get("/api/v2/deals", params={"updated_since": "2021-01-01T00:00:00Z", "sort_by": "update_time", "sort_direction": "desc"}).json()
        assert first["data"] == [] and first["additional_data"]["next_cursor"]
        ids, _ = walk_v2(c, "/api/v2/deals", updated_since="2021-01-01T00:00:00Z", sort_by="update_time", sort_direction="desc")
        assert ids and ids == sorted(ids, reverse=True)
        fields, pages = walk_v2(c, "/api/v2/personFields")
        assert pages[0]["data"] == [] and fields
        # v1 lists are offset lists: untouched.
        assert c.get("/v1/notes").json()["data"]


# --------------------------------------------------------------------------- null_update_time
def test_null_update_times_are_served_unfiltered_and_never_by_a_time_filter() -> None:
    with shaped(null_update_time=3) as (sb, c):
        truth = sb.truth()
        nulls = truth["null_update_time"]
        assert set(nulls) == {"organizations", "persons", "deals", "activities", "notes", "leads"}
        assert all(len(v) == 3 for v in nulls.values())
        for kind in ("organizations", "persons", "deals", "activities"):
            path = V2_LISTS[kind]
            everything, pages = walk_v2(c, path, limit=7)
            served_null = {row["id"] for p in pages for row in p["data"] if row["update_time"] is None}
            assert served_null == set(nulls[kind]), kind
            assert sorted(everything) == sorted(truth["ids"][kind]), kind
            cut = pages[1]["data"][0]["add_time"]
            before, _ = walk_v2(c, path, limit=7, updated_until=cut)
            after, _ = walk_v2(c, path, limit=7, updated_since=cut)
            assert before and after, kind
            assert not set(before) & set(after), kind
            assert set(everything) - (set(before) | set(after)) == set(nulls[kind]), kind
            asc, _ = walk_v2(c, path, limit=7, sort_by="update_time")
            desc, _ = walk_v2(c, path, limit=7, sort_by="update_time", sort_direction="desc")
            assert set(asc[-3:]) == set(nulls[kind]) and set(desc[:3]) == set(nulls[kind]), kind
            assert len(asc) == len(set(asc)) == len(everything)
            assert c.get(f"{path}/{nulls[kind][0]}").json()["data"]["update_time"] is None
        for kind in ("notes", "leads"):
            everything, _ = walk_v1(c, V1_LISTS[kind], limit=7)
            since, _ = walk_v1(c, V1_LISTS[kind], limit=7, updated_since="2000-01-01T00:00:00Z")
            assert set(everything) - set(since) == set(nulls[kind]), kind
            ordered, _ = walk_v1(c, V1_LISTS[kind], limit=500, sort="update_time ASC")
            assert set(ordered[-3:]) == set(nulls[kind]), kind
        lead = c.get(f"/v1/leads/{nulls['leads'][0]}").json()["data"]
        assert lead["update_time"] is None


# --------------------------------------------------------------------------- purged parents
def test_every_purged_parent_answers_404_and_truth_names_each_reference() -> None:
    with SandboxServer(SandboxConfig(scale="small", seed=1, burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
        truth = sb.truth()
        refs = truth["dangling_refs"]
        assert {k: sorted({r["id"] for r in v}, key=str) for k, v in refs.items()} == {k: sorted(v, key=str) for k, v in truth["dangling"].items()}
        parents_seen = set()
        url = {"organizations": "/api/v2/organizations/{}", "persons": "/api/v2/persons/{}", "deals": "/api/v2/deals/{}", "leads": "/v1/leads/{}"}
        child_url = {"persons": "/api/v2/persons/{}", "deals": "/api/v2/deals/{}", "activities": "/api/v2/activities/{}", "notes": "/v1/notes/{}", "leads": "/v1/leads/{}"}
        for kind, rows in refs.items():
            for ref in rows:
                child = c.get(child_url[kind].format(ref["id"])).json()["data"]
                assert child[ref["field"]] == ref["parent_id"], ref
                r = c.get(url[ref["parent_kind"]].format(ref["parent_id"]))
                assert r.status_code == 404, ref
                parents_seen.add(ref["parent_kind"])
        assert parents_seen == {"organizations", "persons", "deals", "leads"}


# --------------------------------------------------------------------------- archive_flip
def test_archive_flip_moves_a_served_deal_and_lead_to_the_archived_lists() -> None:
    with shaped(archive_flip=2) as (sb, c):
        before = sb.truth()
        candidates = before["archive_flip_candidates"]
        assert len(candidates["deals"]) == 2 and len(candidates["leads"]) == 2
        assert before["archive_flipped"] == {"deals": [], "leads": []}
        summary = c.get("/v1/deals/summary").json()["data"]["total_count"]
        assert summary == len(before["ids"]["deals"])

        active, _ = walk_v2(c, "/api/v2/deals", limit=10)
        archived, _ = walk_v2(c, "/api/v2/deals/archived", limit=10)
        for deal in candidates["deals"]:
            assert active.count(deal) == 1 and archived.count(deal) == 1, deal
            got = c.get(f"/api/v2/deals/{deal}").json()["data"]
            assert got["is_archived"] is True and got["archive_time"] == got["update_time"]
        again, _ = walk_v2(c, "/api/v2/deals", limit=10)
        assert not set(again) & set(candidates["deals"])
        assert len(active) == len(set(active)) and len(archived) == len(set(archived))

        leads, _ = walk_v1(c, "/v1/leads", limit=5)
        leads_archived, _ = walk_v1(c, "/v1/leads/archived", limit=5)
        for lead in candidates["leads"]:
            assert leads.count(lead) == 1 and leads_archived.count(lead) == 1
            assert c.get(f"/v1/leads/{lead}").json()["data"]["is_archived"] is True
        assert not set(walk_v1(c, "/v1/leads", limit=5)[0]) & set(candidates["leads"])

        after = sb.truth()
        assert after["archive_flipped"] == candidates
        assert sorted(after["ids"]["deals"]) == sorted(again)
        assert sorted(after["ids"]["deals_archived"]) == sorted(archived)
        assert after["counts"]["deals"] == len(before["ids"]["deals"]) - 2
        assert c.get("/v1/deals/summary").json()["data"]["total_count"] == len(after["ids"]["deals"])
        assert c.get("/v1/deals/summary/archived").json()["data"]["total_count"] == len(after["ids"]["deals_archived"])
        # An update_time filter above every generated time finds exactly the flipped deals.
        newest = max(c.get(f"/api/v2/deals/{d}").json()["data"]["update_time"] for d in candidates["deals"])
        late, _ = walk_v2(c, "/api/v2/deals/archived", updated_since=min(
            c.get(f"/api/v2/deals/{d}").json()["data"]["update_time"] for d in candidates["deals"]))
        assert sorted(late) == sorted(candidates["deals"]) and newest
        sb.configure(archive_flip=0)  # a shape change starts the account over
        assert sb.truth()["archive_flipped"] == {"deals": [], "leads": []}


# --------------------------------------------------------------------------- hostile_mail
def test_hostile_mail_bodies_are_the_described_bytes_on_the_wire() -> None:
    with shaped(hostile_mail=True) as (sb, c):
        truth = sb.truth()
        hostile = {h["variant"]: h for h in truth["hostile_mail"]}
        assert set(hostile) == {"huge", "nul", "lone_surrogate", "invalid_utf8"}
        for h in truth["hostile_mail"]:
            assert h["id"] in truth["ids"]["mail_messages"]
            assert h["id"] in truth["deals_with_mail"][str(h["deal_id"])]
            listed, _ = walk_v1(c, f"/v1/deals/{h['deal_id']}/mailMessages", limit=500)
            assert listed.count(h["id"]) == 1

        huge = c.get(f"/v1/mailbox/mailMessages/{hostile['huge']['id']}", params={"include_body": 1})
        body = huge.json()["data"]["body"]
        assert len(body) >= 1_200_000 and "data:image/png;base64," in body

        nul = c.get(f"/v1/mailbox/mailMessages/{hostile['nul']['id']}", params={"include_body": 1})
        assert b"\\u0000" in nul.content and nul.json()["data"]["body"].count("\x00") == 1

        deal = hostile["lone_surrogate"]["deal_id"]
        listing = c.get(f"/v1/deals/{deal}/mailMessages", params={"limit": 500})
        assert b"\\ud800" in listing.content
        item = next(m["data"] for m in json.loads(listing.content)["data"] if m["data"]["id"] == hostile["lone_surrogate"]["id"])
        assert item["snippet"].endswith("\ud800") and item["subject"].endswith("\ud800")

        bad = c.get(f"/v1/mailbox/mailMessages/{hostile['invalid_utf8']['id']}", params={"include_body": 1})
        assert bad.status_code == 200 and b"\xff\xfe" in bad.content
        with pytest.raises(UnicodeDecodeError):
            bad.content.decode("utf-8")
        # The listing and the metadata fetch of that message are ordinary UTF-8.
        c.get(f"/v1/mailbox/mailMessages/{hostile['invalid_utf8']['id']}").content.decode("utf-8")


# --------------------------------------------------------------------------- private_mail
def test_private_mail_is_listed_but_its_body_answers_403_or_404() -> None:
    with shaped(private_mail=4) as (sb, c):
        truth = sb.truth()
        private = truth["private_mail"]
        assert len(private) == 4 and {p["status"] for p in private} == {403, 404}
        for p in private:
            assert p["status"] == (403 if p["id"] % 2 == 0 else 404)
            listed, _ = walk_v1(c, f"/v1/deals/{p['deal_id']}/mailMessages", limit=500)
            assert p["id"] in listed
            r = c.get(f"/v1/mailbox/mailMessages/{p['id']}", params={"include_body": 1})
            assert r.status_code == p["status"] and r.json()["success"] is False
            assert c.get(f"/v1/mailbox/mailMessages/{p['id']}").status_code == 200


# --------------------------------------------------------------------------- spec, config
def test_shaped_responses_still_validate_against_the_spec(specs: dict[str, Any]) -> None:
    with shaped(null_update_time=5, archive_flip=3, hostile_mail=True, page_cap=9) as (sb, c):
        walk_v2(c, "/api/v2/deals", limit=500)  # flips the candidates
        truth = sb.truth()
        hostile_deal = truth["hostile_mail"][2]["deal_id"]
        cases = [
            ("v2", "/deals", "/api/v2/deals?limit=500", "deal"),
            ("v2", "/deals/archived", "/api/v2/deals/archived?limit=500", "deal"),
            ("v2", "/persons", "/api/v2/persons?limit=500", "person"),
            ("v2", "/organizations", "/api/v2/organizations?limit=500", "organization"),
            ("v2", "/activities", "/api/v2/activities?limit=500", "activity"),
            ("v1", "/notes", "/v1/notes?limit=500", "note"),
            ("v1", "/leads", "/v1/leads?limit=500", "none"),
            ("v1", "/leads/archived", "/v1/leads/archived?limit=500", "none"),
            ("v1", "/deals/{id}/mailMessages", f"/v1/deals/{hostile_deal}/mailMessages", "mail"),
            ("v1", "/deals/summary", "/v1/deals/summary", "none"),
        ]
        for api, path, url, allowance in cases:
            body = json.loads(c.get(url).content)
            nulls, others = undeclared_null_paths(response_schema(specs, api, path), body)
            assert not others, (url, others[:5])
            stray = {p for p in (_strip_prefix(n) for n in nulls) if p not in ALLOWED_UNDECLARED_NULLS[allowance] | {"update_time"}}
            stray.discard("additional_data.next_cursor")
            assert not stray, (url, sorted(stray))


def test_shapes_are_config_fields_cli_flags_and_runtime_options() -> None:
    c = SandboxConfig.from_options(page_cap="15", empty_pages="true", null_update_time="3", archive_flip="2", hostile_mail="1", private_mail="4")
    assert (c.page_cap, c.empty_pages, c.null_update_time, c.archive_flip, c.hostile_mail, c.private_mail) == (15, True, 3, 2, True, 4)
    args = c.to_cli_args()
    assert {"--page-cap", "--empty-pages", "--null-update-time", "--archive-flip", "--hostile-mail", "--private-mail"} <= set(args)
    assert config_from_args(build_parser().parse_args(args)) == c
    assert "--page-cap" not in SandboxConfig().to_cli_args()
    for bad in ({"page_cap": "-1"}, {"empty_pages": "maybe"}, {"archive_flip": "x"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SandboxConfig.from_options(**bad)
    with shaped() as (sb, client):
        assert len(client.get("/v1/notes", params={"limit": 500}).json()["data"]) > 5
        sb.configure(page_cap=5)
        assert len(client.get("/v1/notes", params={"limit": 500}).json()["data"]) == 5
        sb.configure(page_cap=0, empty_pages=True)
        assert client.get("/api/v2/deals").json()["data"] == []
