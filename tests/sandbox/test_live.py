"""The live account: the sandbox changes its account while it serves.

Every test drives a tiny sandbox over real HTTP and applies changes with `live/step` (synchronous,
deterministic), forcing one op at a time with `live_mix` where it checks that op's effect:

* create / update / delete / archive / unarchive / merge / mail: what lists (v2 cursor, v1 offset,
  archived lists), `updated_since`/`updated_until`, GET by id, the deals summary, a deal's
  mailMessages and the body fetch answer afterwards, and that truth says the same;
* after a mixed run every list walk equals truth, GET equals truth's rows, time filters select by
  the served update_time;
* determinism: same seed + n -> the same changes and the same account (times aside);
* a delete between two v1 offset pages shifts the later rows down (a row is skipped, as the real
  API does); a v2 cursor resumes after its row even when that row was deleted;
* the background rate stops at live_max and on live/stop; answers stay whole while it runs.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer
from pipedrive_sandbox.__main__ import build_parser, config_from_args
from pipedrive_sandbox.data import parse_time

from .conftest import make_client

V2_LIST = {"persons": "/api/v2/persons", "organizations": "/api/v2/organizations", "deals": "/api/v2/deals",
           "deals_archived": "/api/v2/deals/archived", "activities": "/api/v2/activities"}
V1_LIST = {"leads": "/v1/leads", "leads_archived": "/v1/leads/archived", "notes": "/v1/notes"}
GET = {"persons": "/api/v2/persons/{}", "organizations": "/api/v2/organizations/{}", "deals": "/api/v2/deals/{}",
       "activities": "/api/v2/activities/{}", "leads": "/v1/leads/{}", "notes": "/v1/notes/{}"}
TIME_KEYS = ("update_time", "add_time", "stage_change_time", "archive_time", "message_time", "timestamp")


def sandbox(seed: int = 1, **options: Any) -> SandboxServer:
    return SandboxServer(SandboxConfig(scale="tiny", seed=seed, burst_limit=1_000_000, **options))


@pytest.fixture()
def sb() -> Iterator[SandboxServer]:
    with sandbox() as server:
        yield server


@pytest.fixture()
def c(sb: SandboxServer) -> Iterator[httpx.Client]:
    with make_client(sb.base_url) as client:
        yield client


def v2_ids(c: httpx.Client, path: str, limit: int = 7, **params: Any) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while True:
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        r = c.get(path, params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        out += [row["id"] for row in body["data"]]
        cursor = body["additional_data"]["next_cursor"]
        if not cursor:
            return out


def v1_ids(c: httpx.Client, path: str, limit: int = 7, **params: Any) -> list[Any]:
    out: list[Any] = []
    start = 0
    while True:
        r = c.get(path, params={"limit": limit, "start": start, **params})
        assert r.status_code == 200, r.text
        body = r.json()
        out += [row["id"] for row in body["data"]]
        page = body["additional_data"]["pagination"]
        if not page["more_items_in_collection"]:
            return out
        start = page["next_start"]


def listed(c: httpx.Client, name: str, **params: Any) -> list[Any]:
    return v2_ids(c, V2_LIST[name], **params) if name in V2_LIST else v1_ids(c, V1_LIST[name], **params)


def get(c: httpx.Client, kind: str, ident: Any) -> httpx.Response:
    return c.get(GET[kind].format(ident))


def force(sb: SandboxServer, op: str, n: int = 1) -> list[dict[str, Any]]:
    """Apply n changes of one op."""
    sb.configure(live_mix=f"{op}:1")
    return sb.live_step(n)


def list_name(kind: str, archived: bool) -> str:
    return f"{kind}_archived" if archived else kind


def ts(text: str) -> int:
    return parse_time(text)


def without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in TIME_KEYS and k != "at"}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


# --------------------------------------------------------------------------- each op
def test_create_adds_rows_above_every_id_listed_filtered_and_fetchable(sb: SandboxServer, c: httpx.Client) -> None:
    before = sb.truth()["ids"]
    changes = force(sb, "create", 14)
    truth = sb.truth()
    assert truth["changes_applied"] == 14 and sb.live()["applied"] == 14
    kinds = {ch["kind"] for ch in changes}
    assert {"persons", "organizations", "deals", "activities", "notes"} <= kinds
    for ch in changes:
        kind, ident = ch["kind"], ch["id"]
        name = kind
        if kind != "leads":
            assert ident > max(before[kind] + before.get(f"{kind}_archived", [])), ch
            assert ident % 21 != 0, "new ids never land on a purged id"
        else:
            assert ident not in before["leads"] + before["leads_archived"]
        assert ident in truth["ids"][name]
        row = get(c, kind, ident)
        assert row.status_code == 200
        data = row.json()["data"]
        assert ts(data["update_time"]) == ts(data["add_time"]) == ts(ch["at"])
        assert ident in listed(c, name), ch
        if kind in ("leads", "notes"):
            assert ident in listed(c, name, updated_since=ch["at"])
        else:
            assert ident in listed(c, name, updated_since=ch["at"])
            assert ident not in listed(c, name, updated_until=ch["at"])
        # Parents a new row references exist now.
        for field, parent in (("person_id", "persons"), ("org_id", "organizations"), ("organization_id", "organizations"), ("deal_id", "deals")):
            if data.get(field) is not None:
                assert get(c, parent, data[field]).status_code == 200, (ch, field)
    # Created rows come last in id order.
    persons = listed(c, "persons")
    created = [ch["id"] for ch in changes if ch["kind"] == "persons"]
    assert persons[-len(created):] == created


def test_update_moves_update_time_and_changes_visible_fields(sb: SandboxServer, c: httpx.Client) -> None:
    previous_at = 0
    seen: set[str] = set()
    for _ in range(12):
        (ch,) = force(sb, "update")
        kind, ident = ch["kind"], ch["id"]
        seen.add(kind)
        assert ts(ch["at"]) > previous_at
        previous_at = ts(ch["at"])
        data = get(c, kind, ident).json()["data"]
        assert ts(data["update_time"]) == ts(ch["at"])
        assert ch["fields"] and all(f in data for f in ch["fields"])
        assert ident in listed(c, list_name(kind, bool(data.get("is_archived"))), updated_since=ch["at"])
    assert len(seen) >= 4
    # The field values changed against a fresh server of the same seed (the account before).
    with sandbox() as fresh, make_client(fresh.base_url) as c0:
        for ch in sb.changes():
            old = get(c0, ch["kind"], ch["id"]).json()["data"]
            new = get(c, ch["kind"], ch["id"]).json()["data"]
            changed = [f for f in ch["fields"] if f != "stage_change_time" and old.get(f) != new.get(f)]
            assert changed, (ch, old, new)
            assert ts(new["update_time"]) > ts(old["update_time"])


def test_delete_removes_from_lists_and_get_children_keep_the_reference(sb: SandboxServer, c: httpx.Client) -> None:
    summary_before = c.get("/v1/deals/summary").json()["data"]["total_count"]
    changes = force(sb, "delete", 25)
    truth = sb.truth()
    deleted_deals = 0
    for ch in changes:
        kind, ident = ch["kind"], ch["id"]
        assert get(c, kind, ident).status_code == 404, ch
        assert ident in truth["deleted"][kind]
        for name in (kind, f"{kind}_archived"):
            if name in truth["ids"]:
                assert ident not in truth["ids"][name]
                assert ident not in listed(c, name)
        if kind == "deals":
            assert c.get(f"/v1/deals/{ident}/mailMessages").status_code == 404
            deleted_deals += not any(ident == d for d in truth["ids"]["deals_archived"])
    # Children keep the reference: the deleted id is still what they say, and truth names them.
    refs = [r for rows in truth["deleted_refs"].values() for r in rows]
    assert refs, "25 deletes in a tiny account leave some child pointing at a deleted row"
    for r in refs:
        child_kind = next(k for k, rows in truth["deleted_refs"].items() if r in rows)
        child = get(c, child_kind, r["id"]).json()["data"]
        assert child[r["field"]] == r["parent_id"]
        assert get(c, r["parent_kind"], r["parent_id"]).status_code == 404
    active_deals_deleted = [ch["id"] for ch in changes if ch["kind"] == "deals"]
    summary_after = c.get("/v1/deals/summary").json()["data"]["total_count"]
    assert summary_after == len(truth["ids"]["deals"])
    assert summary_after <= summary_before
    assert all(str(d) not in truth["deals_with_mail"] for d in active_deals_deleted)


def test_archive_and_unarchive_move_rows_between_lists(sb: SandboxServer, c: httpx.Client) -> None:
    for op in ("archive", "unarchive"):
        for _ in range(4):
            active_sum = c.get("/v1/deals/summary").json()["data"]["total_count"]
            archived_sum = c.get("/v1/deals/summary/archived").json()["data"]["total_count"]
            (ch,) = force(sb, op)
            kind, ident = ch["kind"], ch["id"]
            archived = op == "archive"
            data = get(c, kind, ident).json()["data"]
            assert data["is_archived"] is archived
            assert ts(data["update_time"]) == ts(ch["at"])
            assert ident in listed(c, list_name(kind, archived))
            assert ident not in listed(c, list_name(kind, not archived))
            truth = sb.truth()["ids"]
            assert ident in truth[list_name(kind, archived)] and ident not in truth[list_name(kind, not archived)]
            if kind == "deals":
                assert (data["archive_time"] is not None) is archived
                moved = 1 if archived else -1
                assert c.get("/v1/deals/summary").json()["data"]["total_count"] == active_sum - moved
                assert c.get("/v1/deals/summary/archived").json()["data"]["total_count"] == archived_sum + moved
                assert ident in v2_ids(c, V2_LIST[list_name(kind, archived)], updated_since=ch["at"])
            else:
                if not archived:  # v1 /leads takes updated_since, /leads/archived does not
                    assert ident in v1_ids(c, "/v1/leads", updated_since=ch["at"])


def test_merge_removes_the_merged_id_and_repoints_children(sb: SandboxServer, c: httpx.Client) -> None:
    changes = force(sb, "merge", 8)
    truth = sb.truth()
    repointed_total = 0
    for ch in changes:
        kind, old, new = ch["kind"], ch["id"], ch["into"]
        assert get(c, kind, old).status_code == 404
        assert old not in listed(c, kind) and old not in truth["ids"][kind]
        final = truth["merged"][kind][str(old)]
        assert final in truth["ids"][kind] or final in truth["deleted"][kind] or str(final) in truth["merged"][kind]
        for child_kind, ids in ch["repointed"].items():
            for child in ids:
                repointed_total += 1
                response = get(c, child_kind, child)
                if response.status_code == 404:
                    continue  # merged away itself by a later change
                row = response.json()["data"]
                assert ts(row["update_time"]) >= ts(ch["at"])
                assert old not in (row.get("person_id"), row.get("org_id"), row.get("organization_id"))
    assert repointed_total, "8 merges in a tiny account re-point some child"
    # No existing row references a merged id any more; the last merge's survivor moved.
    merged = {k: {int(x) for x in v} for k, v in truth["merged"].items()}
    for child_kind, fields in (("persons", ("org_id",)), ("deals", ("person_id", "org_id")), ("activities", ("person_id", "org_id")), ("notes", ("person_id", "org_id"))):
        rows = sb.truth_rows(child_kind)
        for row in rows.values():
            for field in fields:
                parent = "organizations" if field == "org_id" else "persons"
                assert row.get(field) not in merged[parent], (child_kind, row["id"], field)
    last = changes[-1]
    survivor = get(c, last["kind"], last["into"])
    if survivor.status_code == 200:
        assert ts(survivor.json()["data"]["update_time"]) == ts(last["at"])


def test_mail_adds_a_message_the_deal_lists_and_serves(sb: SandboxServer, c: httpx.Client) -> None:
    counts_before = {str(d["id"]): d["email_messages_count"] for d in c.get("/api/v2/deals", params={"limit": 500, "include_fields": "email_messages_count"}).json()["data"]}
    changes = force(sb, "mail", 6)
    truth = sb.truth()
    for ch in changes:
        assert ch["kind"] == "mail_messages"
        mid, deal = ch["id"], ch["deal_id"]
        assert mid in truth["ids"]["mail_messages"] and mid in truth["deals_with_mail"][str(deal)]
        listing = c.get(f"/v1/deals/{deal}/mailMessages", params={"limit": 500}).json()["data"]
        assert mid in [item["data"]["id"] for item in listing]
        body = c.get(f"/v1/mailbox/mailMessages/{mid}", params={"include_body": 1})
        assert body.status_code == 200 and body.json()["data"]["body"].startswith("<p>")
        assert body.json()["data"]["id"] == mid
    last_at = {ch["deal_id"]: ch["at"] for ch in changes}
    added: dict[str, int] = {}
    for ch in changes:
        added[str(ch["deal_id"])] = added.get(str(ch["deal_id"]), 0) + 1
    for deal, n in added.items():
        row = get(c, "deals", deal).json()["data"]
        assert ts(row["update_time"]) == ts(last_at[int(deal)])
        name = "deals_archived" if row["is_archived"] else "deals"
        page = c.get(V2_LIST[name], params={"ids": deal, "include_fields": "email_messages_count"}).json()["data"]
        assert page[0]["email_messages_count"] == counts_before.get(deal, len(truth["deals_with_mail"][deal]) - n) + n
        assert len(truth["deals_with_mail"][deal]) == page[0]["email_messages_count"]


# --------------------------------------------------------------------------- the whole account stays consistent
def test_after_mixed_changes_every_listing_get_and_filter_agrees_with_truth(sb: SandboxServer, c: httpx.Client) -> None:
    changes = sb.live_step(60)
    assert {ch["op"] for ch in changes} >= {"create", "update", "mail"}
    truth = sb.truth()
    for name in list(V2_LIST) + list(V1_LIST):
        assert listed(c, name) == truth["ids"][name], name
    for name in V2_LIST:
        assert sorted(v2_ids(c, V2_LIST[name], sort_by="update_time")) == sorted(truth["ids"][name]), name
        assert v2_ids(c, V2_LIST[name], sort_direction="desc") == truth["ids"][name][::-1], name
    middle = changes[len(changes) // 2]["at"]
    for name in ("persons", "deals", "activities", "leads", "notes"):
        rows = sb.truth_rows(name)
        for ident, row in list(rows.items())[:12]:
            kind = name.removesuffix("_archived")
            assert get(c, kind, ident).json()["data"] == row
        newer = sorted(r["id"] for r in rows.values() if r.get("update_time") and ts(r["update_time"]) >= ts(middle))
        assert sorted(listed(c, name, updated_since=middle)) == newer, name
        if name in V2_LIST:
            older = sorted(r["id"] for r in rows.values() if r.get("update_time") and ts(r["update_time"]) < ts(middle))
            assert sorted(listed(c, name, updated_until=middle)) == older, name
    assert c.get("/v1/deals/summary").json()["data"]["total_count"] == truth["counts"]["deals"]
    assert truth["counts"]["mail_messages"] == len(truth["ids"]["mail_messages"])
    assert sb.changes(since_seq=55) == changes[55:]


def test_same_seed_and_n_give_the_same_changes_and_account() -> None:
    runs = []
    for _ in range(2):
        with sandbox(seed=3) as server:
            changes = server.live_step(40)
            rows = {name: server.truth_rows(name) for name in ("persons", "deals", "deals_archived", "leads", "notes", "mail_messages")}
            runs.append((without_times(changes), server.truth()["ids"], server.truth("merged")["merged"], without_times(rows)))
    assert runs[0] == runs[1]
    with sandbox(seed=4) as other:
        assert without_times(other.live_step(40)) != runs[0][0]


# --------------------------------------------------------------------------- paging while rows go
def test_a_delete_between_two_offset_pages_shifts_later_rows_down(sb: SandboxServer, c: httpx.Client) -> None:
    before = v1_ids(c, "/v1/notes", limit=500)
    first = c.get("/v1/notes", params={"start": 0, "limit": 10}).json()
    page1 = [row["id"] for row in first["data"]]
    sb.configure(live_mix="delete:1")
    for _ in range(300):  # until a note of the first page is deleted (deterministic for the seed)
        (ch,) = sb.live_step(1)
        if ch["kind"] == "notes" and ch["id"] in page1:
            break
    else:
        pytest.fail("no note of the first page was deleted")
    second = c.get("/v1/notes", params={"start": first["additional_data"]["pagination"]["next_start"], "limit": 10}).json()
    page2 = [row["id"] for row in second["data"]]
    now = sb.truth("notes")["ids"]["notes"]
    assert page2 == now[10:20]
    # The row that was 11th before the delete is now 10th: neither page serves it.
    skipped = before[10]
    assert skipped in now and skipped not in page1 + page2


def test_a_v2_cursor_resumes_after_its_row_when_that_row_was_deleted() -> None:
    # Learn from a twin (same seed) which person the first person-delete removes.
    with sandbox() as twin:
        twin.configure(live_mix="delete:1")
        n = next(k for k in range(1, 200) if (ch := twin.live_step(1)[0])["kind"] == "persons")
        victim = ch["id"]
    with sandbox() as server, make_client(server.base_url) as c:
        all_ids = v2_ids(c, "/api/v2/persons", limit=500)
        position = all_ids.index(victim)
        first = c.get("/api/v2/persons", params={"limit": position + 1}).json()
        assert first["data"][-1]["id"] == victim
        server.configure(live_mix="delete:1")
        server.live_step(n)
        assert get(c, "persons", victim).status_code == 404
        rest: list[Any] = []
        cursor = first["additional_data"]["next_cursor"]
        while cursor:
            body = c.get("/api/v2/persons", params={"limit": 5, "cursor": cursor})
            assert body.status_code == 200, body.text
            rest += [row["id"] for row in body.json()["data"]]
            cursor = body.json()["additional_data"]["next_cursor"]
        now = server.truth("persons")["ids"]["persons"]
        assert rest == [i for i in now if i > victim]


# --------------------------------------------------------------------------- background rate
def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.05)


def test_background_changes_stop_at_live_max_and_on_stop() -> None:
    with sandbox(live_rate=200.0, live_max=15) as server:
        wait_for(lambda: not server.live()["running"])
        assert server.live()["applied"] == 15
        time.sleep(0.2)
        assert server.live()["applied"] == 15 and server.truth("deleted")["changes_applied"] == 15
        assert [ch["seq"] for ch in server.changes()] == list(range(1, 16))
        server.configure(live_rate=200.0, live_max=0)  # unbounded now, until stopped
        wait_for(lambda: server.live()["applied"] > 20)
        status = server.live_stop()
        assert status["running"] is False
        stopped_at = server.live()["applied"]
        time.sleep(0.2)
        assert server.live()["applied"] == stopped_at
        # The background made the same changes live/step makes on a fresh server.
        with sandbox() as twin:
            assert without_times(twin.live_step(stopped_at)) == without_times(server.changes())


def test_answers_stay_whole_while_the_account_changes_under_them() -> None:
    with sandbox(live_rate=300.0, live_max=400) as server, make_client(server.base_url) as c:
        for _ in range(3):
            ids = v2_ids(c, "/api/v2/persons", limit=5)
            assert len(ids) == len(set(ids)) and ids == sorted(ids)
            notes = v1_ids(c, "/v1/notes", limit=5)
            assert len(notes) == len(set(notes))
        server.live_stop()
        assert listed(c, "persons") == server.truth("persons")["ids"]["persons"]


def test_live_options_parse_round_trip_and_errors() -> None:
    config = SandboxConfig.from_options(live_rate="2.5", live_max="100", live_mix="update:1,delete:0.5")
    assert (config.live_rate, config.live_max, config.live_mix) == (2.5, 100, "update:1,delete:0.5")
    assert config_from_args(build_parser().parse_args(config.to_cli_args())) == config
    assert config_from_args(build_parser().parse_args(["--live", "3"])).live_rate == 3.0
    assert "--live" not in SandboxConfig().to_cli_args()
    for bad, word in ((dict(live_rate="-1"), "live_rate"), (dict(live_max="x"), "live_max"), (dict(live_mix="explode:1"), "live_mix"), (dict(live_mix="update:0"), "live_mix")):
        with pytest.raises(ValueError, match=word):
            SandboxConfig.from_options(**bad)
    with sandbox() as server:
        with pytest.raises(ValueError, match="n"):
            server.live_step(0)
        assert server.truth()["changes_applied"] == 0 and server.truth()["deleted"]["persons"] == []
        with make_client(server.base_url) as c:
            assert c.get("/_sandbox/truth", params={"rows": "1"}).status_code == 400
            assert c.get("/_sandbox/changes", params={"since_seq": "-1"}).status_code == 400


def test_changed_rows_and_new_mail_validate_against_the_published_schemas(specs: dict[str, Any], sb: SandboxServer, c: httpx.Client) -> None:
    from .conftest import response_schema
    from .test_fidelity import ALLOWED_UNDECLARED_NULLS, _strip_prefix, undeclared_null_paths

    changes = sb.live_step(80)
    allowance = {"persons": "person", "organizations": "organization", "deals": "deal", "activities": "activity", "notes": "note", "leads": "none"}
    spec_path = {"persons": ("v2", "/persons/{id}"), "organizations": ("v2", "/organizations/{id}"), "deals": ("v2", "/deals/{id}"),
                 "activities": ("v2", "/activities/{id}"), "leads": ("v1", "/leads/{id}"), "notes": ("v1", "/notes/{id}")}
    checked: set[tuple[str, str]] = set()
    for ch in changes:
        if ch["op"] == "mail":
            cases = [("v1", "/deals/{id}/mailMessages", f"/v1/deals/{ch['deal_id']}/mailMessages?limit=500", "mail"),
                     ("v1", "/mailbox/mailMessages/{id}", f"/v1/mailbox/mailMessages/{ch['id']}?include_body=1", "mail")]
        elif ch["op"] in ("delete", "merge") or get(c, ch["kind"], ch["id"]).status_code == 404:
            continue
        else:
            api, path = spec_path[ch["kind"]]
            cases = [(api, path, GET[ch["kind"]].format(ch["id"]), allowance[ch["kind"]])]
        for api, path, url, allow in cases:
            body = c.get(url).json()
            nulls, others = undeclared_null_paths(response_schema(specs, api, path), body)
            assert not others, (ch, url, others[:5])
            stray = {p for p in (_strip_prefix(n) for n in nulls) if p not in ALLOWED_UNDECLARED_NULLS[allow]}
            assert not stray, (ch, url, sorted(stray))
            checked.add((ch["op"], ch["kind"]))
    assert {("create", "deals"), ("update", "persons"), ("mail", "mail_messages")} <= checked


def test_live_changes_over_the_api_shapes_keep_lists_and_truth_equal() -> None:
    shapes = dict(page_cap=5, null_update_time=2, archive_flip=2, hostile_mail=True)
    with sandbox(**shapes) as server, make_client(server.base_url) as c:
        for name in list(V2_LIST) + list(V1_LIST):
            listed(c, name)  # serve the active lists once: the archive flips happen
        changes = server.live_step(50)
        truth = server.truth()
        for name in list(V2_LIST) + list(V1_LIST):
            assert listed(c, name) == truth["ids"][name], name
        middle = changes[25]["at"]
        for name in ("persons", "deals"):
            rows = server.truth_rows(name)
            newer = sorted(r["id"] for r in rows.values() if r.get("update_time") and ts(r["update_time"]) >= ts(middle))
            assert sorted(listed(c, name, updated_since=middle)) == newer, name
        for mid in [ch["id"] for ch in changes if ch["op"] == "mail"]:
            assert c.get(f"/v1/mailbox/mailMessages/{mid}", params={"include_body": 1}).status_code == 200
        assert min(ch["id"] for ch in changes if ch["op"] == "mail") > max(h["id"] for h in truth["hostile_mail"])


def test_a_long_mixed_run_keeps_lists_summaries_and_truth_equal() -> None:
    with sandbox(seed=2) as server, make_client(server.base_url) as c:
        c.get("/v1/deals/summary", params={"status": "open"})  # a summary cached before the changes
        changes = server.live_step(400)
        assert {ch["op"] for ch in changes} == {"create", "update", "delete", "archive", "unarchive", "merge", "mail"}
        truth = server.truth()
        for name in list(V2_LIST) + list(V1_LIST):
            assert listed(c, name, limit=50) == truth["ids"][name], name
        for name, path in (("deals", "/v1/deals/summary"), ("deals_archived", "/v1/deals/summary/archived")):
            rows = list(server.truth_rows(name).values())
            for params in ({}, {"status": "open"}, {"pipeline_id": 1}, {"user_id": 2}):
                field = {"user_id": "owner_id"}
                chosen = [r for r in rows if all(r[field.get(k, k)] == v for k, v in params.items())]
                data = c.get(path, params=params).json()["data"]
                assert data["total_count"] == len(chosen), (name, params)
                values: dict[str, float] = {}
                for r in chosen:
                    values[r["currency"]] = values.get(r["currency"], 0.0) + r["value"]
                assert {cur: v["value"] for cur, v in data["values_total"].items()} == values, (name, params)


def test_the_lazy_live_order_equals_the_materialised_one() -> None:
    """The lists of a kind only live changes touch are served from `_live_order` (generator shortcuts
    plus the touched rows merged in); `_shaped_order` materialises every row: the oracle."""
    from pipedrive_sandbox.app import SandboxApp

    app = SandboxApp(SandboxConfig(scale="tiny", seed=5))
    changes = app.state.live.step(150)
    times = sorted({ts(ch["at"]) for ch in changes})
    generated = app.ds.update_ts("persons", 20)
    cuts: list[int | None] = [None, generated, times[0], times[len(times) // 2], times[-1] + 1]
    checked = 0
    for kind, subsets in (("persons", ("all",)), ("deals", ("active", "archived")), ("leads", ("active", "archived")), ("activities", ("all",)), ("notes", ("all",))):
        for subset in subsets:
            for sort_by in ("id", "update_time", "add_time"):
                for desc in (False, True):
                    for since in cuts:
                        for until in (None, times[len(times) // 2], generated):
                            want = app.handlers["v2"]._shaped_order(kind, subset, since, until, sort_by, desc)
                            got = list(app.handlers["v2"]._live_order(kind, subset, since, until, sort_by, desc, None))
                            assert got == [i for _, i in want], (kind, subset, sort_by, desc, since, until)
                            for k in range(0, len(want), max(1, len(want) // 5)):  # resume after a cursor row
                                after = want[k][0]
                                rest = list(app.handlers["v2"]._live_order(kind, subset, since, until, sort_by, desc, after))
                                assert rest == [i for _, i in want[k + 1:]], (kind, subset, sort_by, desc, since, until, k)
                                checked += 1
    # Cursor rows that are gone since: keys of deleted rows still bound the walk.
    for ch in changes:
        if ch["op"] == "delete" and ch["kind"] == "persons":
            gone = app.state.live.cursor_index("persons", ch["id"])
            for sort_by in ("id", "update_time"):
                key = (gone,) if sort_by == "id" else (False, app.state.live.update_ts("persons", gone), gone)
                want = [i for k, i in app.handlers["v2"]._shaped_order("persons", "all", None, None, sort_by, False) if k > key]
                assert list(app.handlers["v2"]._live_order("persons", "all", None, None, sort_by, False, key)) == want
    assert checked > 500


def test_the_reference_index_built_late_or_prebuilt_equals_the_rows_now() -> None:
    """Merges re-point children through a reverse index, built once: prebuilt from the generator in
    a thread (background runs) or on demand, then patched with the rows changes touched before."""
    from pipedrive_sandbox.app import SandboxApp
    from pipedrive_sandbox.data import REF_FIELDS

    mix = "create:3,update:6,delete:1,archive:1,mail:2"  # no merge: the index is first needed below
    prebuilt, on_demand = (SandboxApp(SandboxConfig(scale="tiny", seed=6, live_mix=mix)) for _ in range(2))
    prebuilt.state.live.prebuild_refs()
    for app in (prebuilt, on_demand):
        app.state.live.step(120)
    live = on_demand.state.live
    rows_now: dict[tuple[str, Any], set[tuple[str, int, str]]] = {}
    for child, pairs in REF_FIELDS.items():
        for ci in range(live.size(child)):
            row = live._plain(child, ci)
            for field, parent in pairs:
                if row.get(field) is not None:
                    rows_now.setdefault((parent, row[field]), set()).add((child, ci, field))
    for app in (prebuilt, on_demand):
        assert {k: v for k, v in app.state.live._ref_index().items() if v} == rows_now


def test_the_cli_serves_a_live_account_bounded_by_live_max() -> None:
    from pipedrive_sandbox import start_subprocess

    proc, base_url = start_subprocess(SandboxConfig(scale="tiny", live_rate=100.0, live_max=12, live_mix="update:1,mail:1"))
    try:
        with httpx.Client(base_url=base_url, timeout=30) as c:
            wait_for(lambda: c.get("/_sandbox/live").json()["applied"] == 12 and not c.get("/_sandbox/live").json()["running"])
            status = c.get("/_sandbox/live").json()
            assert status["rate"] == 100.0 and status["max"] == 12 and status["mix"]["delete"] == 0
            changes = c.get("/_sandbox/changes", params={"since_seq": 10}).json()
            assert [ch["seq"] for ch in changes["changes"]] == [11, 12] and changes["applied"] == 12
            assert {ch["op"] for ch in c.get("/_sandbox/changes").json()["changes"]} <= {"update", "mail"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
