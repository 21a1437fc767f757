"""A v1 walk lines its overlapping pages up by sound ids only (a fresh user's find): a row served
with an id that is not one ("abc", twice in a notes list) in one page's tail was found again further
down the next page, and the walk dropped every row before it - verify named 112 notes at the source
as extra, and the catch-up's listing skipped them."""
from __future__ import annotations

from typing import Any

from engine_core.providers.pipedrive import inventory
from engine_core.providers.pipedrive.paging import Page


class _Listing:
    """`inventory.Meter.list_v1` over a fixed list of rows, PAGE rows a page."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def list_v1(self, path: str, params: Any, start: int, limit: int = inventory.PAGE) -> Page:
        rows = tuple(self.rows[start : start + limit])
        more = start + limit < len(self.rows)
        return Page(rows=rows, next_start=start + len(rows) if more else None, more=more)


def test_a_v1_walk_serves_every_row_once_when_bad_ids_repeat_across_the_overlap() -> None:
    rows = [{"id": i} for i in range(1, 1201)]
    for at in (480, 550, 1000):  # one in page 1's tail, the others later in the pages that overlap it
        rows[at] = {"id": "abc", "content": f"row at {at}"}
    served = list(inventory.walk(_Listing(rows), "notes"))
    assert len(served) == len(rows), (len(served), len(rows))
    assert served == rows
