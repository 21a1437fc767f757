"""Listing shapes the real API sends never lose a row (issue 8, items 2, 3 and 4).

* A v1 server that caps `limit` below what was asked (`page_cap`): a page shorter than asked with
  `more_items_in_collection: true` goes on at its `next_start`; every row is read, none twice.
* A v2 list that answers `data: []` with a `next_cursor` (`empty_pages`): discovery and walkers
  follow the cursor until it is null.
* Rows whose `update_time` is null (`null_update_time`): no time span has them, so discovery seeds
  a walker over the unfiltered list for them; the stripes' union equals the unfiltered walk.
* The deal lists' discovery records the source's own count (`source_total`, from the deals
  summary) in its task stats, for the rollup to compare at phase close.

The stripe walks are first played against `httpx.MockTransport` servers (the page arithmetic and
cursor rules, whichever end a sort puts null times at), then against the sandbox's shapes: the
union of the stripes equals the unfiltered walk, and whole migrations reconcile each kind row by
row with the sandbox's truth.
"""
from __future__ import annotations

import dataclasses
from collections import deque
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from engine_core import rollup
from engine_core.providers.pipedrive import stripes
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import BadResponse
from engine_core.providers.pipedrive.kinds import ledger_kind
from engine_core.providers.pipedrive.kinds import page_of
from engine_core.providers.pipedrive.listing import discover, discovery_seeds, list_v1_task, list_v2_task, source_total
from pipedrive_sandbox.config import SandboxConfig
from tests.client.support import Script, make_client, ok, status
from tests.pipedrive.support import TOKEN, failed_tasks, ledger, migrate, sandbox

TENANT = "acme"
SHAPES = {f.name for f in dataclasses.fields(SandboxConfig)}


def needs(*shapes: str) -> pytest.MarkDecorator:
    missing = sorted(set(shapes) - SHAPES)
    return pytest.mark.skipif(bool(missing), reason=f"the sandbox does not serve {', '.join(missing)} yet (sandbox_shapes.md)")


# --- walking the stripes the way the engine does, without a database ----------------------------


def walk(client: PipedriveClient, kind: str) -> tuple[list[Any], set[str], int]:
    """Every task of a kind from its seeds, each key once (the engine's find-or-create): the ids
    the tasks would write (in order, duplicates kept), the task keys, and rows left to the spans."""
    queue = deque(stripes.v1_first(kind) if kind in stripes.V1_PATHS else stripes.v2_seeds(kind))
    keys: set[str] = set()
    written: list[Any] = []
    passed = 0
    while queue:
        task = queue.popleft()
        if task.cursor_key in keys:
            continue
        keys.add(task.cursor_key)
        if kind in stripes.V1_PATHS:
            listed = list_v1_task(client, kind, task.cursor)
        elif task.cursor.get("discover"):
            queue.extend(discovery_seeds(kind, discover(client, stripes.V2_PATHS[kind])))
            continue
        else:
            listed = list_v2_task(client, kind, task.cursor)
        written.extend(row["id"] for row in listed.rows)
        passed += listed.passed
        queue.extend(listed.successors)
    return written, keys, passed


class V1Server:
    """Offset pagination over `n` rows, serving at most `cap` rows a page whatever `limit` asks,
    with truthful `more_items_in_collection` / `next_start`."""

    def __init__(self, n: int, cap: int) -> None:
        self.rows = [{"id": i + 1} for i in range(n)]
        self.cap = cap
        self.starts: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        start, limit = int(request.url.params["start"]), int(request.url.params["limit"])
        self.starts.append(start)
        served = self.rows[start : start + min(limit, self.cap)]
        more = start + len(served) < len(self.rows)
        pagination: dict[str, Any] = {"start": start, "limit": limit, "more_items_in_collection": more}
        if more:
            pagination["next_start"] = start + len(served)
        return ok(served or None, additional_data={"pagination": pagination})


@pytest.mark.parametrize("walked", [1, 8], ids=["striped-from-page-2", "one-walker-for-8-pages"])
@pytest.mark.parametrize(("n", "cap"), [(40, 15), (2100, 100), (1234, 7), (3001, 499), (600, 500)])
def test_v1_stripes_read_every_row_once_from_a_server_that_caps_limit(n: int, cap: int, walked: int, monkeypatch) -> None:
    monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", walked)
    server = V1Server(n, cap)
    client, _ = make_client(Script([server]))
    written, _, _ = walk(client, "notes")
    assert sorted(written) == list(range(1, n + 1)), f"{n - len(set(written))} rows lost"
    assert len(written) == len(set(written)), "a row read twice: a sub-page read past its span"


def test_page_arithmetic_costs_nothing_extra_when_the_server_serves_full_pages(monkeypatch) -> None:
    monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", 8)
    server = V1Server(2100, 500)
    client, _ = make_client(Script([server]))
    written, _, _ = walk(client, "notes")
    assert sorted(written) == list(range(1, 2101))
    # a list of five pages: one walker, one call a page, nothing past the end
    assert sorted(server.starts) == [0, 500, 1000, 1500, 2000]
    # striped from two pages on: the walker's two spans, the four stripes' spans, and one
    # past-the-end page for each of the three stripes that do not hold the last row
    monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", 2)
    server = V1Server(2100, 500)
    client, _ = make_client(Script([server]))
    written, _, _ = walk(client, "notes")
    assert sorted(written) == list(range(1, 2101))
    assert sorted(server.starts) == [0, 500, 1000, 1500, 2000, 2500, 3000, 3500]


def _moment(i: int) -> str:
    return stripes.rfc3339(datetime(2021, 1, 1, tzinfo=timezone.utc) + timedelta(hours=7 * i + (i * i) % 13))


class V2Server:
    """Cursor pagination over rows with `update_time` (some null): the time filters never return
    null-time rows; `sort_by=update_time` puts them at the start ascending when `nulls_first`,
    else at the end (and the other way round descending); `empty_first` answers every request
    without a cursor with no rows and a cursor to the first row; at most `cap` rows a page."""

    def __init__(self, n: int, nulls: set[int], *, cap: int = 500, empty_first: bool = False, nulls_first: bool = False) -> None:
        self.rows = [{"id": i, "update_time": None if i in nulls else _moment(i)} for i in range(1, n + 1)]
        self.cap, self.empty_first, self.nulls_first = cap, empty_first, nulls_first

    def __call__(self, request: httpx.Request) -> httpx.Response:
        q = request.url.params
        rows = self.rows
        since, until = q.get("updated_since"), q.get("updated_until")
        if since or until:
            rows = [r for r in rows if r["update_time"] and (not since or r["update_time"] >= since) and (not until or r["update_time"] < until)]
        if q.get("sort_by") == "update_time":
            desc = q.get("sort_direction") == "desc"
            timed = sorted((r for r in rows if r["update_time"]), key=lambda r: (r["update_time"], r["id"]), reverse=desc)
            null = [r for r in rows if not r["update_time"]]
            rows = null + timed if self.nulls_first != desc else timed + null
        cursor = q.get("cursor")
        if cursor is None and self.empty_first:
            return ok([], additional_data={"next_cursor": "at:0"})
        pos = int(cursor.split(":")[1]) if cursor else 0
        page = rows[pos : pos + min(int(q["limit"]), self.cap)]
        end = pos + len(page)
        return ok(page, additional_data={"next_cursor": f"at:{end}" if end < len(rows) else None})


@pytest.mark.parametrize("nulls_first", [False, True], ids=["nulls-last-asc", "nulls-first-asc"])
@pytest.mark.parametrize("empty_first", [False, True], ids=["rows", "empty-first-pages"])
@pytest.mark.parametrize("cap", [500, 3])
def test_v2_stripes_union_is_the_unfiltered_list(nulls_first: bool, empty_first: bool, cap: int, monkeypatch) -> None:
    monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", 0)  # a list longer than its first page is striped
    nulls = {2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 200}  # more than a probe's first page
    server = V2Server(300, nulls, cap=cap, empty_first=empty_first, nulls_first=nulls_first)
    client, _ = make_client(Script([server]))
    written, keys, passed = walk(client, "deals")
    assert sorted(written) == list(range(1, 301)), f"missing {sorted(set(range(1, 301)) - set(written))[:10]}"
    assert len(written) == len(set(written)), "a row written by two stripes"
    if cap >= 300 and not empty_first:  # the discovery's first page held the whole list: one walker
        assert {k for k in keys if k.endswith(":p0")} == {"deals:s0:p0"} and passed == 0
        return
    assert {k for k in keys if k.endswith(":p0")} == {"deals:s0:p0", "deals:s1:p0", "deals:s2:p0", "deals:s3:p0", "deals:nulls:p0"}
    assert passed == 300 - len(nulls)  # the null walker passed over every timed row, wrote none


def test_without_null_times_there_is_no_extra_walk() -> None:
    client, _ = make_client(Script([V2Server(120, set(), cap=7, empty_first=True)]))
    written, keys, passed = walk(client, "persons")
    assert sorted(written) == list(range(1, 121))
    assert not any(":nulls:" in k for k in keys) and passed == 0


def test_all_null_times_are_one_unfiltered_walk() -> None:
    client, _ = make_client(Script([V2Server(30, set(range(1, 31)), cap=4, empty_first=True)]))
    written, keys, _ = walk(client, "activities")
    assert sorted(written) == list(range(1, 31))
    assert {k for k in keys if k.endswith(":p0")} == {"activities:s0:p0"}


def test_an_empty_list_seeds_nothing_after_following_its_cursor() -> None:
    script = Script([V2Server(0, set(), empty_first=True)])
    client, _ = make_client(script)
    found = discover(client, "/api/v2/deals")
    assert (found.rows, found.nulls, found.requests) == (False, False, 2)  # the empty page, then its cursor
    assert discovery_seeds("deals", found) == []


# --- the sandbox's shapes ------------------------------------------------------------------------


V2_STRIPED = ("organizations", "persons", "deals", "deals_archived", "activities")


def _union_equals_unfiltered(**shape: Any) -> None:
    with sandbox(**shape) as sb, PipedriveClient(sb.base_url, TOKEN) as client:
        for kind in (*V2_STRIPED, *stripes.V1_PATHS):
            path = (stripes.V2_PATHS | stripes.V1_PATHS)[kind]
            iterate = client.iter_v2 if kind in stripes.V2_PATHS else client.iter_v1
            unfiltered = [row["id"] for page in iterate(path, limit=page_of(kind)) for row in page.rows]
            written, _, _ = walk(client, kind)
            assert len(written) == len(set(written)), f"{kind}: a row in two stripes"
            assert sorted(written, key=str) == sorted(unfiltered, key=str), f"{kind}: the stripes' union is not the unfiltered list"
            assert unfiltered, kind


@needs("null_update_time")
def test_sandbox_stripes_union_is_the_unfiltered_walk_with_null_update_times() -> None:
    _union_equals_unfiltered(null_update_time=3)


@needs("page_cap", "empty_pages")
def test_sandbox_stripes_union_is_the_unfiltered_walk_with_capped_and_empty_pages() -> None:
    _union_equals_unfiltered(page_cap=15, empty_pages=True)


@needs("page_cap", "empty_pages", "null_update_time")
def test_sandbox_stripes_union_with_every_listing_shape_at_once() -> None:
    _union_equals_unfiltered(page_cap=7, empty_pages=True, null_update_time=4)


def _reconcile(db, truth: dict[str, Any], *kinds: str) -> None:
    """Each ledger kind holds exactly the source's ids of the lists it is fed by (archived deals
    and leads share their active twins' identity), none failed."""
    for kind in kinds:
        entries = ledger(db, TENANT, kind)
        expected = {str(i).lower() for k in truth["ids"] if ledger_kind(k) == kind for i in truth["ids"][k]}
        assert len(expected) > 0, kind
        assert set(entries) == expected, f"{kind}: {len(expected - set(entries))} of {len(expected)} source rows never listed"
        assert not {s for s, e in entries.items() if e["action"] == "failed"}, kind


def _reconcile_mail(db, truth: dict[str, Any]) -> None:
    expected = {str(m) for msgs in truth["deals_with_mail"].values() for m in msgs}
    entries = ledger(db, TENANT, "emails")
    assert expected and set(entries) == expected, f"emails: {len(expected - set(entries))} of {len(expected)} never listed"


@needs("page_cap")
def test_a_server_capping_limit_loses_no_note(db) -> None:
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert len(truth["ids"]["notes"]) > 15
    _reconcile(db, truth, "notes", "leads", "users", "organizations", "persons", "deals", "activities")
    _reconcile_mail(db, truth)
    keys = [r["cursor_key"] for r in db.sql("SELECT cursor_key FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'notes'", {"r": run.id})]
    assert "notes:15" in keys and "notes:30" in keys  # the sub-pages of span [0, 500), by next_start


@needs("empty_pages")
def test_empty_pages_with_a_cursor_lose_no_deal(db) -> None:
    with sandbox(empty_pages=True) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    _reconcile(db, truth, "organizations", "persons", "deals", "activities", "notes")
    _reconcile_mail(db, truth)  # email discovery walks the deal lists through their empty pages too


@needs("null_update_time")
def test_rows_without_an_update_time_are_imported(db) -> None:
    with sandbox(null_update_time=3) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT, kinds=["users", "organizations", "persons", "deals", "deals_archived", "leads", "activities", "notes"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    nulls = truth["null_update_time"]
    for kind in ("organizations", "persons", "deals", "activities"):
        assert nulls.get(kind), f"the sandbox made no null-time {kind}"
        entries = ledger(db, TENANT, kind)
        assert {str(i) for i in nulls[kind]} <= set(entries), f"{kind}: a null-time row was never listed"
    _reconcile(db, truth, "organizations", "persons", "deals", "activities", "notes")
    # tiny's lists fit the discovery's first page: its one walker lists null-time rows with the rest
    walkers = db.sql("SELECT kind, cursor_key FROM migration_tasks WHERE migration_id = %(r)s AND cursor_key LIKE '%%:p0'"
                     " AND kind IN ('organizations', 'persons', 'deals', 'activities')", {"r": run.id})
    assert sorted(r["cursor_key"] for r in walkers) == sorted(f"{k}:s0:p0" for k in ("organizations", "persons", "deals", "activities"))


# --- the source's own count ----------------------------------------------------------------------


def test_source_total_reads_the_summary_count() -> None:
    client, _ = make_client(Script([ok({"total_count": 41, "values_total": {}})]))
    assert source_total(client, "/v1/deals/summary") == 41
    client, _ = make_client(Script([status(404)]))
    assert source_total(client, "/v1/deals/summary") is None  # a source without the summary: no count
    for bad in ({"total_count": "41"}, {"total_count": -1}, {"values_total": {}}, None):
        client, _ = make_client(Script([ok(bad)]))
        with pytest.raises(BadResponse, match="total_count"):
            source_total(client, "/v1/deals/summary")


@pytest.mark.parametrize("shape", ["whole", "walked", "striped"])
def test_deal_discovery_records_the_source_total(db, monkeypatch, shape: str) -> None:
    """A deal list's count, for the rollup: the discovery's first page when it held the list; the
    one walker's pages, counted, when it walks a list of a few pages (no summary asked); the deals
    summary when the list is striped (its independent check of the spans)."""
    if shape != "whole":
        monkeypatch.setattr(stripes, "STRIPE_MIN_PAGES", 1000 if shape == "walked" else 0)
    with sandbox(**({} if shape == "whole" else {"page_cap": 20})) as sb:
        with PipedriveClient(sb.base_url, TOKEN) as client:
            if source_total(client, "/v1/deals/summary") is None:
                pytest.skip("the sandbox does not serve /v1/deals/summary yet (sandbox_shapes.md: 'Also served')")
        truth = sb.truth()
        sb.reset_stats()
        run = migrate(db, sb, TENANT, kinds=["users", "organizations", "persons", "deals", "deals_archived"])
        asked = sb.stats()["requests"]
    assert run.status == "succeeded", failed_tasks(db, run.id)
    rows = db.sql("SELECT kind, stats FROM migration_tasks WHERE migration_id = %(r)s AND kind LIKE 'deals%%'", {"r": run.id})
    totals: dict[str, int] = {}
    for r in rows:
        if r["stats"].get("source_total") is not None:
            assert r["kind"] not in totals, f"two tasks of {r['kind']} recorded a count"
            totals[r["kind"]] = r["stats"]["source_total"]
    assert totals["deals"] == len(truth["ids"]["deals"]) and totals["deals"] > 0
    assert ("/v1/deals/summary" in asked) == (shape == "striped"), asked
    if shape != "striped":  # archived deals have no summary that is not deprecated: counted when walked whole
        assert totals["deals_archived"] == len(truth["ids"]["deals_archived"])
    assert not {"organizations", "persons"} & set(totals)  # no count the API gives
    by_kind = {k.kind: k for k in rollup.rollup(db, run.id).kinds}
    assert by_kind["deals"].source_count_met() is True, by_kind["deals"]