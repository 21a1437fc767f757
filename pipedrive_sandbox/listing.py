"""What the list handlers of both API versions share: rows as served now and the orders they list in."""
from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import Any, Callable, Iterable, Iterator

from .catalog import ListSpec
from .data import Dataset
from .query import Query, parse_filter_value
from .state import SandboxState


class Lister:
    """The base of the handler classes (v1, v2, admin): rows as served now and the orders lists walk.

    Every list serves rows in index order (= id order, and so add/update time order for rows nothing
    changed); shape- and live-touched rows break that, so `_shaped_order` and `_live_order` merge them
    in by their sort key."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    @property
    def ds(self) -> Dataset:
        """The generated dataset under the shapes and the live changes."""
        return self.state.dataset

    def _candidates(self, kind: str, subset: str, lo: int, hi: int, desc: bool) -> Iterator[int]:
        ds = self.ds
        if subset == "archived":
            arr = ds.archived_deals if kind == "deals" else ds.archived_leads
            a, b = bisect_left(arr, lo), bisect_left(arr, hi)
            seq: Iterable[int] = (arr[j] for j in (range(b - 1, a - 1, -1) if desc else range(a, b)))
            yield from seq
            return
        rng = range(hi - 1, lo - 1, -1) if desc else range(lo, hi)
        if subset == "active":
            yield from (i for i in rng if not ds.is_archived(kind, i))
        else:
            yield from rng

    def _filter_pred(self, spec: ListSpec, q: Query) -> Callable[[dict[str, Any]], bool] | None:
        checks: list[tuple[str, str, Any]] = []
        for param, fname, ftype in spec.filters:
            value = parse_filter_value(q, param, ftype)
            if value is not None:
                checks.append((fname, ftype, value))
        if not checks:
            return None
        live = self.state.live

        def pred(rec: dict[str, Any]) -> bool:
            for fname, ftype, value in checks:
                if fname == "@deal_person":
                    d = live.index_of("deals", value)
                    if d is None:
                        return False
                    if live.record("deals", d).get("person_id") != rec.get("id"):
                        return False
                    continue
                got = rec.get(fname)
                if ftype == "strset":
                    if got not in value:
                        return False
                elif got != value:
                    return False
            return True

        return pred

    def _record(self, kind: str, index: int) -> dict[str, Any]:
        """The record as served now: generated, malformed when drawn, shaped, then changed (live)."""
        return self.state.live.record(kind, index, self.state.badrow)

    def _mail_item(self, mid: int) -> dict[str, Any]:
        if self.state.shapes.hostile_of(mid) is not None:
            return self.state.shapes.hostile_list_item(mid)
        if mid in self.state.live.mail:
            return self.state.live.mail_list_item(mid)
        return self.ds.mail_list_item(mid, self.state.badrow)

    def _shaped_order(
        self, kind: str, subset: str, since: int | None, until: int | None, sort_by: str, desc: bool, universe: Iterable[int] | None = None
    ) -> list[tuple[tuple[Any, ...], int]]:
        """(sort key, index) of every row a list of a shape-touched kind serves, in served order.

        The generator's shortcuts (times grow with the index, archived rows in fixed arrays) do not
        hold for rows with a null or moved update time, so such kinds are materialised: time filters
        never match a null time; `update_time` sorts put nulls last ascending, first descending."""
        shapes = self.state.live  # the shapes, and the live changes over them
        filtered = since is not None or until is not None
        rows: list[tuple[tuple[Any, ...], int]] = []
        for i in universe if universe is not None else shapes.universe(kind):
            if subset != "all" and shapes.is_archived(kind, i) != (subset == "archived"):
                continue
            t = shapes.update_ts(kind, i)
            if filtered:
                if t is None or (since is not None and t < since) or (until is not None and t >= until):
                    continue
            rows.append(((t is None, t or 0, i) if sort_by == "update_time" else (i,), i))
        rows.sort(reverse=desc)
        return rows

    def _live_order(
        self, kind: str, subset: str, since: int | None, until: int | None, sort_by: str, desc: bool, after: tuple[Any, ...] | None
    ) -> Iterator[int]:
        """Indexes a list of a kind only live changes touch serves, in served order, lazily:
        `_shaped_order` (then the keys after the cursor key `after`) without materialising.

        The generated rows no change touched keep the generator's shortcuts (times grow with the
        index: binary search for the time filters and the cursor); the touched rows - few - are
        checked one by one and merged in by their sort key."""
        ds, live = self.ds, self.state.live
        touched = live.touched(kind)
        skip = set(touched)

        def key(i: int) -> tuple[Any, ...]:
            if sort_by != "update_time":
                return (i,)
            t = live.update_ts(kind, i)
            return (t is None, t or 0, i)

        def passes(i: int) -> bool:
            if not live.exists(kind, i):
                return False
            if subset != "all" and live.is_archived(kind, i) != (subset == "archived"):
                return False
            if since is not None or until is not None:
                t = live.update_ts(kind, i)
                if t is None or (since is not None and t < since) or (until is not None and t >= until):
                    return False
            return True

        mine = sorted(((key(i), i) for i in touched if passes(i)), reverse=desc)
        if after is not None:
            mine = [r for r in mine if (r[0] < after if desc else r[0] > after)]
        lo = ds.first_index_at_or_after(kind, since) if since is not None else 0
        hi = ds.first_index_at_or_after(kind, until) if until is not None else ds.count(kind)
        if after is not None:
            if sort_by != "update_time":
                lo, hi = (lo, min(hi, after[0])) if desc else (max(lo, after[0] + 1), hi)
            elif not after[0]:  # generated times are never null: only a non-null key bounds them
                t = after[1]
                lo, hi = (lo, min(hi, ds.first_index_at_or_after(kind, t + 1))) if desc else (max(lo, ds.first_index_at_or_after(kind, t)), hi)
            elif not desc:
                lo = hi  # ascending, nulls come last: nothing generated after a null key
        base: Iterator[tuple[tuple[Any, ...], int]] = (
            ((False, ds.update_ts(kind, i), i) if sort_by == "update_time" else (i,), i)
            for i in self._candidates(kind, subset, lo, max(lo, hi), desc)
            if i not in skip
        )
        if after is not None and sort_by == "update_time":
            base = (r for r in base if (r[0] < after if desc else r[0] > after))
        return (i for _, i in heapq.merge(base, mine, key=lambda r: r[0], reverse=desc))
