"""The account's time span and the time formats Pipedrive serves (v2 RFC 3339, v1 `YYYY-MM-DD HH:MM:SS`)."""
from __future__ import annotations

import math
from datetime import datetime, timezone

T0 = int(datetime(2019, 1, 1, tzinfo=timezone.utc).timestamp())
T_END = int(datetime(2026, 7, 31, tzinfo=timezone.utc).timestamp())
UPDATE_LAG = 30 * 86400


def rfc3339(ts: int) -> str:
    """Epoch seconds as RFC 3339 UTC, `2024-05-01T10:20:00Z`: the v2 time format."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(ts: int) -> str:
    """Epoch seconds as ISO 8601 UTC with milliseconds, `...T10:20:00.000Z`: the leads' and mail's format."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def v1_time(ts: int) -> str:
    """Epoch seconds as `YYYY-MM-DD HH:MM:SS` (UTC): the v1 time format of notes, users and fields."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def day(ts: int) -> str:
    """Epoch seconds as a date `YYYY-MM-DD` (UTC): date fields (due_date, expected_close_date, custom dates)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d")


def parse_time(text: str) -> int:
    """Parse an RFC3339 / ISO 8601 time (or a date) to epoch seconds; ValueError when malformed."""
    value = text.strip()
    if not value:
        raise ValueError("empty time")
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"
    if len(value) == 10:
        parsed = datetime.strptime(value, "%Y-%m-%d")
    else:
        parsed = datetime.fromisoformat(value.replace(" ", "T", 1))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return int(math.floor(parsed.timestamp()))
