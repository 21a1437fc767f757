"""The list and item helpers of the Pipedrive client: a listing's page (`Page`) and its query
(v2 cursor, v1 offset, at most `MAX_PAGE` rows), a path id checked, and the rule for an item's
refused sub-resource (`item_scope`, `settle_refusals`).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from engine_core.providers.pipedrive.errors import AuthError, BadResponse, ItemRefused, NotFound


MAX_PAGE = 500  # the API's largest page, v1 and v2 alike


@dataclass(frozen=True)
class Page:
    """One page of a listing: its rows and where the next page starts (cursor for v2, offset for v1)."""

    rows: tuple[dict[str, Any], ...] = ()
    next_cursor: str | None = None
    next_start: int | None = None
    more: bool = False
    kept: bool = False  # served from an answer another task already paid for (`Prefetch.hold`)


ITEM_REFUSALS = frozenset({403, 404})  # an item's sub-resource: private to another user, or gone


@contextmanager
def item_scope(path: str, kind: type[ItemRefused] = ItemRefused) -> Iterator[None]:
    """Requests of one item's sub-resource: their 403 and 404 raise `kind` (an `ItemRefused`, with
    the status and the server's reason), never the token's `AuthError` - one deal's mail private to
    another user must not stop a tenant's run. A 401 (the token refused) and every other error pass."""
    try:
        yield
    except (AuthError, NotFound) as e:
        if e.status in ITEM_REFUSALS:
            raise kind(method=e.method, path=e.path or path, status=e.status, detail=e.detail) from None
        raise


def settle_refusals(client: Any, refusals: Sequence[ItemRefused], *, cancel: threading.Event | None = None) -> None:
    """The rule for a fan-out's refused items (`item_list_v1`, `mail_body`): a 404 is the item's
    (gone since listed); a 403 is the item's unless the token itself is refused, which
    `client.confirm_token` asks of the account's own identity - its `AuthError` propagates and
    stops the run as any refused token does. Call it on the task's thread once a round is joined."""
    if any(r.status == 403 for r in refusals):
        client.confirm_token(cancel=cancel)


def _require_prefix(path: str, prefix: str) -> None:
    if not path.startswith(prefix):
        raise ValueError(f"{path!r} is not under {prefix}")


def _check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE}, got {limit}")
    return limit


def _id(value: int) -> int:
    """A path id as an integer, so nothing but digits reaches the path."""
    try:
        number = int(value) if not isinstance(value, bool) else -1
    except (TypeError, ValueError):
        number = -1
    if number < 0 or str(number) != str(value).strip():
        raise ValueError(f"not a Pipedrive id: {value!r}")
    return number


def rows_of(body: dict[str, Any], path: str) -> tuple[dict[str, Any], ...]:
    """The rows of an answered list page at `path`: its `data` (v1 answers an empty list with
    `data: null`: no rows). Raises BadResponse when `data` is something else than a list."""
    data = body.get("data")
    if data is None:  # v1 answers an empty list with `data: null`
        return ()
    if not isinstance(data, list):
        raise BadResponse("data is not a list", method="GET", path=path, status=200)
    return tuple(data)


def _v2_query(path: str, params: Mapping[str, Any] | None, cursor: str | None, limit: int) -> dict[str, Any]:
    _require_prefix(path, "/api/v2/")
    query = dict(params or {})
    query["limit"] = _check_limit(limit)
    if cursor:
        query["cursor"] = cursor
    return query


def _v1_query(path: str, params: Mapping[str, Any] | None, start: int, limit: int) -> dict[str, Any]:
    _require_prefix(path, "/v1/")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    query = dict(params or {})
    query["start"] = start
    query["limit"] = _check_limit(limit)
    return query
