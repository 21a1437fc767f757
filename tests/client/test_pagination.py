"""Pages of both pagination styles: v2 follows `additional_data.next_cursor`, v1 follows
`additional_data.pagination.next_start` / `more_items_in_collection`; a page that does not advance
is a bad response rather than an endless loop; mail listing and mail bodies hit the spec's paths.
The API's fields alone say whether a listing goes on: a v1 page shorter than `limit` with
`more_items_in_collection: true` (a server capping `limit`) is followed to its `next_start`, and a
v2 page with no rows but a `next_cursor` is followed to its cursor (issue 8, items 2 and 3).
"""
from __future__ import annotations

import httpx
import pytest

from engine_core.providers.pipedrive.paging import Page
from engine_core.providers.pipedrive.errors import BadResponse
from tests.client.support import Script, make_client, ok


def v2_pages(pages: dict[str | None, tuple[list[dict], str | None]]):
    def answer(request: httpx.Request) -> httpx.Response:
        cursor = request.url.params.get("cursor")
        rows, nxt = pages[cursor]
        return ok(rows, additional_data={"next_cursor": nxt})

    return answer


def test_list_v2_one_page() -> None:
    script = Script([ok([{"id": 1}, {"id": 2}], additional_data={"next_cursor": "c2"})])
    client, _ = make_client(script)
    page = client.list_v2("/api/v2/deals", {"sort_by": "id"}, limit=2)
    assert page == Page(rows=({"id": 1}, {"id": 2}), next_cursor="c2", more=True)
    assert dict(script.requests[0].url.params) == {"sort_by": "id", "limit": "2"}
    with pytest.raises(AttributeError):
        page.more = False  # type: ignore[misc]  # frozen


def test_iter_v2_follows_the_cursor_to_the_end() -> None:
    script = Script([v2_pages({None: ([{"id": 1}], "a"), "a": ([{"id": 2}], "b"), "b": ([{"id": 3}], None)})])
    client, _ = make_client(script)
    pages = list(client.iter_v2("/api/v2/persons", {"include_fields": "marketing_status"}))
    assert [row["id"] for p in pages for row in p.rows] == [1, 2, 3]
    assert pages[-1] == Page(rows=({"id": 3},), next_cursor=None, more=False)
    assert [r.url.params.get("cursor") for r in script.requests] == [None, "a", "b"]
    assert all(r.url.params["limit"] == "500" for r in script.requests)


def test_iter_v2_resumes_from_a_cursor() -> None:
    script = Script([v2_pages({"b": ([{"id": 3}], None)})])
    client, _ = make_client(script)
    assert [p.rows for p in client.iter_v2("/api/v2/deals", cursor="b")] == [({"id": 3},)]


def test_v2_cursor_that_repeats_is_a_bad_response() -> None:
    client, _ = make_client(Script([ok([{"id": 1}], additional_data={"next_cursor": "same"})]))
    with pytest.raises(BadResponse):
        client.list_v2("/api/v2/deals", cursor="same")


def test_list_v1_pagination_block() -> None:
    pagination = {"start": 0, "limit": 2, "more_items_in_collection": True, "next_start": 2}
    script = Script([ok([{"id": 1}, {"id": 2}], additional_data={"pagination": pagination})])
    client, _ = make_client(script)
    page = client.list_v1("/v1/leads", {"archived_status": "not_archived"}, start=0, limit=2)
    assert page == Page(rows=({"id": 1}, {"id": 2}), next_start=2, more=True)
    assert dict(script.requests[0].url.params) == {"archived_status": "not_archived", "start": "0", "limit": "2"}


def test_iter_v1_to_the_end_including_null_data() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        start = int(request.url.params["start"])
        if start == 0:
            return ok([{"id": 1}, {"id": 2}], additional_data={"pagination": {"more_items_in_collection": True, "next_start": 2}})
        if start == 2:
            # no next_start given: the next page starts after this one's rows
            return ok([{"id": 3}], additional_data={"pagination": {"more_items_in_collection": True}})
        return ok(None, additional_data={"pagination": {"more_items_in_collection": False}})

    script = Script([answer])
    client, _ = make_client(script)
    pages = list(client.iter_v1("/v1/notes", limit=2))
    assert [p.rows for p in pages] == [({"id": 1}, {"id": 2}), ({"id": 3},), ()]
    assert [p.next_start for p in pages] == [2, 3, None]
    assert [r.url.params["start"] for r in script.requests] == ["0", "2", "3"]


def test_v1_next_start_that_does_not_advance_is_a_bad_response() -> None:
    client, _ = make_client(Script([ok([], additional_data={"pagination": {"more_items_in_collection": True, "next_start": 0}})]))
    with pytest.raises(BadResponse):
        client.list_v1("/v1/leads", start=0)


def test_data_that_is_not_a_list_is_a_bad_response() -> None:
    client, _ = make_client(Script([ok({"id": 1})]))
    with pytest.raises(BadResponse):
        client.list_v2("/api/v2/deals")


def test_mail_messages_of_a_deal() -> None:
    # this operation's schema lists the pagination flat under additional_data; accept both shapes
    rows = [{"object": "mailMessage", "timestamp": "2020-09-16 13:38:17", "data": {"id": 11}}]
    script = Script([ok(rows, additional_data={"start": 0, "limit": 100, "more_items_in_collection": True})])
    client, _ = make_client(script)
    page = client.mail_messages(553, start=0, limit=100)
    assert page.rows[0]["data"]["id"] == 11 and page.more and page.next_start == 1
    request = script.requests[0]
    assert request.url.path == "/v1/deals/553/mailMessages"
    assert dict(request.url.params) == {"start": "0", "limit": "100"}


def test_mail_body() -> None:
    script = Script([ok({"id": 11, "subject": "Hi", "body": "<p>Hello</p>"})])
    client, _ = make_client(script)
    message = client.mail_body(11)
    assert message["body"] == "<p>Hello</p>"
    request = script.requests[0]
    assert request.url.path == "/v1/mailbox/mailMessages/11"
    assert dict(request.url.params) == {"include_body": "1"}
    client, _ = make_client(Script([ok(None)]))
    with pytest.raises(BadResponse):
        client.mail_body(11)


def test_iter_v1_follows_a_server_that_caps_limit() -> None:
    """A server serving 3 rows a page whatever `limit` asks: every row, by `next_start`."""
    rows = [{"id": i} for i in range(1, 9)]

    def answer(request: httpx.Request) -> httpx.Response:
        start = int(request.url.params["start"])
        served = rows[start : start + 3]
        more = start + len(served) < len(rows)
        pagination = {"start": start, "limit": 3, "more_items_in_collection": more}
        if more:
            pagination["next_start"] = start + len(served)
        return ok(served, additional_data={"pagination": pagination})

    script = Script([answer])
    client, _ = make_client(script)
    pages = list(client.iter_v1("/v1/notes", limit=500))
    assert [row["id"] for p in pages for row in p.rows] == list(range(1, 9))
    assert [r.url.params["start"] for r in script.requests] == ["0", "3", "6"]
    first = client.list_v1("/v1/notes", start=0, limit=500)
    assert (len(first.rows), first.more, first.next_start) == (3, True, 3)


def test_v2_pages_without_rows_but_with_a_cursor_are_not_the_end() -> None:
    script = Script([v2_pages({None: ([], "a"), "a": ([], "b"), "b": ([{"id": 1}], "c"), "c": ([], None)})])
    client, _ = make_client(script)
    first = client.list_v2("/api/v2/deals")
    assert first == Page(rows=(), next_cursor="a", more=True)
    pages = list(client.iter_v2("/api/v2/deals"))
    assert [row["id"] for p in pages for row in p.rows] == [1]
    assert [r.url.params.get("cursor") for r in script.requests[1:]] == [None, "a", "b", "c"]
