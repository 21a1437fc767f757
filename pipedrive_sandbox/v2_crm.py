"""The `/api/v2/` endpoints of the CRM's further families: the products on deals and the followers
of deals, persons and organizations (products themselves are listed by `V2Api.v2_list`)."""
from __future__ import annotations

from typing import Any, Callable

from .catalog import Endpoint
from .envelope import ApiError
from .listing import Lister
from .query import Query, decode_cursor, encode_cursor, sort_value

MAX_DEAL_IDS = 100
LINE_SORTS = ("id", "deal_id", "add_time", "update_time", "order_nr")


def parse_id(raw: str, name: str = "id") -> int:
    """A path or query id as an int; ApiError 400 naming the parameter otherwise."""
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise ApiError(400, f"Parameter '{name}' must be an integer") from None


def keyset_page(
    rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Any], tie: Callable[[dict[str, Any]], int], field: str, q: Query, size: int, desc: bool = False
) -> tuple[list[dict[str, Any]], str | None]:
    """One cursor page of `rows` (already filtered) ordered by (key(row), tie(row)) - `tie` a unique
    int per row, so a page boundary survives rows added or removed in between: the rows after the
    request's `cursor`, at most `size`, and the `next_cursor` (None on the last page). The cursor is
    the keyset position as every v2 list encodes it (the empty_pages shape's start cursor resumes at
    the first row); ApiError 400 for a foreign one."""
    direction = "desc" if desc else "asc"
    keyed = sorted(((sort_value(key(r)), tie(r), r) for r in rows), key=lambda t: (t[0], t[1]), reverse=desc)
    raw = q.get("cursor")
    cur = decode_cursor(raw) if raw is not None else None
    if cur is not None and not cur.get("start"):
        if cur.get("field") != field or cur.get("sortDirection") != direction or not isinstance(cur.get("id"), int):
            raise ApiError(400, "Invalid cursor")
        after = (sort_value(cur.get("fieldValue")), cur["id"])
        keyed = [t for t in keyed if ((t[0], t[1]) < after if desc else (t[0], t[1]) > after)]
    page = keyed[:size]
    next_cursor = None
    if len(keyed) > size and page:
        _, last_tie, last = page[-1]
        next_cursor = encode_cursor({"field": field, "fieldValue": key(last), "sortDirection": direction, "id": last_tie})
    return [r for _, _, r in page], next_cursor


class V2Crm(Lister):
    """Handlers of `V2Api` (mixed into it) for deal products and followers.

    Lists page by cursor like every v2 list; a parent that is not there now answers 404, a parent
    the `forbidden_fanout` shape makes private answers 403."""

    def _sort(self, q: Query, allowed: tuple[str, ...]) -> tuple[str, bool]:
        sort_by = q.get("sort_by") or "id"
        if sort_by not in allowed:
            raise ApiError(400, f"Parameter 'sort_by' must be one of: {', '.join(allowed)}")
        direction = (q.get("sort_direction") or "asc").lower()
        if direction not in ("asc", "desc"):
            raise ApiError(400, "Parameter 'sort_direction' must be one of: asc, desc")
        return sort_by, direction == "desc"

    def _deal_index(self, raw: str) -> int:
        """The index of a deal that exists now; ApiError 404 when it does not, 403 when it is private."""
        d = self.state.live.index_of("deals", parse_id(raw))
        if d is None:
            raise ApiError(404, "Deal not found")
        self.state.shapes.check_fanout("deals", d)
        return d

    def _empty_first_page(self, q: Query, field: str, desc: bool) -> dict[str, Any] | None:
        """The empty_pages shape: a first page (no cursor) that is empty yet says there is more."""
        if not self.state.shapes.empty_pages or q.get("cursor") is not None:
            return None
        start = encode_cursor({"field": field, "fieldValue": None, "sortDirection": "desc" if desc else "asc", "id": None, "start": True})
        return {"success": True, "data": [], "additional_data": {"next_cursor": start}}

    def _lines_page(self, lines: list[dict[str, Any]], q: Query, allowed: tuple[str, ...]) -> dict[str, Any]:
        sort_by, desc = self._sort(q, allowed)
        size = self.state.shapes.cap(q.limit())
        empty = self._empty_first_page(q, sort_by, desc)
        if empty is not None:
            return empty
        page, next_cursor = keyset_page(lines, lambda r: r.get(sort_by), lambda r: r["id"], sort_by, q, size, desc)
        return {"success": True, "data": page, "additional_data": {"next_cursor": next_cursor}}

    def v2_deals_products(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /api/v2/deals/products?deal_ids=...`: the product lines of up to 100 deals, one cursor
        list. `deal_ids` is the spec's array parameter (OpenAPI's default form/explode: repeated,
        `deal_ids=1&deal_ids=2`; a comma list is read too). Deals not there now (or private) are
        left out; ApiError 400 without ids, with a non-integer one or with more than 100."""
        raw = [part for value in q.params.getlist("deal_ids") for part in value.split(",") if part.strip()]
        if not raw:
            raise ApiError(400, "Parameter 'deal_ids' is required")
        ids = [parse_id(x.strip(), "deal_ids") for x in raw]
        if len(set(ids)) > MAX_DEAL_IDS:
            raise ApiError(400, f"Parameter 'deal_ids' accepts at most {MAX_DEAL_IDS} ids")
        live, shapes = self.state.live, self.state.shapes
        lines: list[dict[str, Any]] = []
        for ident in sorted(set(ids)):
            d = live.index_of("deals", ident)
            if d is not None and not shapes.fanout_forbidden("deals", d):
                lines.extend(live.deal_lines(d))
        return self._lines_page(lines, q, LINE_SORTS)

    def v2_deal_products(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /api/v2/deals/{id}/products`: the deal's product lines (cursor; sort by id, add_time,
        update_time or order_nr). ApiError 404 for a deal not there now, 403 for a private one."""
        d = self._deal_index(params["id"])
        return self._lines_page(self.state.live.deal_lines(d), q, ("id", "add_time", "update_time", "order_nr"))

    def v2_followers(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`GET /api/v2/{deals|persons|organizations}/{id}/followers`: `[{user_id, add_time}]` in the
        order they started following (cursor). ApiError 404 for a row not there now, 403 for a private one."""
        kind = endpoint.spec_path.split("/")[1]
        index = self.state.live.index_of(kind, parse_id(params["id"]))
        if index is None:
            raise ApiError(404, f"{kind[:-1].capitalize()} not found")
        self.state.shapes.check_fanout(kind, index)
        rows = self.state.live.followers(kind, index)
        size = self.state.shapes.cap(q.limit())
        empty = self._empty_first_page(q, "add_time", False)
        if empty is not None:
            return empty
        page, next_cursor = keyset_page(rows, lambda r: r["add_time"], lambda r: r["user_id"], "add_time", q, size)
        return {"success": True, "data": page, "additional_data": {"next_cursor": next_cursor}}
