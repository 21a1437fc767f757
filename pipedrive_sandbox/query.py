"""Query parameters as Pipedrive validates them (400 with its message), and v2 cursors."""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from starlette.requests import Request

from .clock import parse_time
from .envelope import ApiError


class Query:
    """The query parameters of one request, read the way Pipedrive validates them.

    Each reader answers None for a missing or empty parameter and raises `ApiError(400, ...)` naming
    the parameter when it is malformed."""

    def __init__(self, request: Request, page_limit_max: int) -> None:
        self.params = request.query_params
        self.page_limit_max = page_limit_max

    def get(self, name: str) -> str | None:
        """The raw value of `name`, None when missing or empty."""
        value = self.params.get(name)
        return value if value not in (None, "") else None

    def int(self, name: str, default: int | None = None, minimum: int | None = None) -> int | None:
        """`name` as an int (`default` when missing); ApiError 400 when not an integer or below `minimum`."""
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, f"Parameter '{name}' must be an integer") from None
        if minimum is not None and value < minimum:
            raise ApiError(400, f"Parameter '{name}' must be >= {minimum}")
        return value

    def bool(self, name: str) -> bool | None:
        """`name` as a bool (1/true/yes, 0/false/no, any case); ApiError 400 otherwise."""
        raw = self.get(name)
        if raw is None:
            return None
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise ApiError(400, f"Parameter '{name}' must be a boolean")

    def limit(self) -> int:
        """The page size asked: `limit`, 100 when missing; ApiError 400 below 1 or above the page maximum
        (500 in the spec: "a maximum value of 500 is allowed"; `page_limit_max` in the config)."""
        value = self.int("limit", 100)
        assert value is not None
        if value < 1:
            raise ApiError(400, "Parameter 'limit' must be a positive integer")
        if value > self.page_limit_max:
            raise ApiError(400, f"Parameter 'limit' must not be greater than {self.page_limit_max}")
        return value

    def time(self, name: str) -> int | None:
        """`name` as epoch seconds (RFC 3339 or a date); ApiError 400 naming the expected format."""
        raw = self.get(name)
        if raw is None:
            return None
        try:
            return parse_time(raw)
        except ValueError:
            raise ApiError(400, f"Parameter '{name}' must be a date-time in RFC3339 format, e.g. 2025-01-01T10:20:00Z") from None


def encode_cursor(obj: dict[str, Any]) -> str:
    """A v2 `next_cursor`: the keyset position (`field`, `fieldValue`, `sortDirection`, `id`) as
    unpadded URL-safe base64 JSON. Opaque to clients, as the spec says of `cursor`."""
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> dict[str, Any]:
    """The position a cursor encodes; ApiError 400 `Invalid cursor` when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        obj = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ApiError(400, "Invalid cursor") from None
    if not isinstance(obj, dict) or "id" not in obj:
        raise ApiError(400, "Invalid cursor")
    return obj


def parse_filter_value(q: Query, param: str, ftype: str) -> Any:
    """The value of a list filter `param` by its type: int, bool, `strset` (a comma list, as
    deals' `status`), else the raw text; None when not given."""
    if ftype == "int":
        return q.int(param)
    if ftype == "bool":
        return q.bool(param)
    raw = q.get(param)
    if raw is None:
        return None
    if ftype == "strset":
        return frozenset(s.strip() for s in raw.split(",") if s.strip())
    return raw


def sort_value(value: Any) -> tuple[int, Any]:
    """A total order over mixed values (None first, then numbers, then strings, then the rest)."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, json.dumps(value, sort_keys=True, default=str))
