"""The run log: grouped reasons, buffered per task and appended to the run once per task.

The seed's log appended per failed row and rewrote a 30 KB value each time; here a task keeps its
reasons grouped in memory and writes them in one statement when it ends (or early, if it has
collected more groups than the cap). The log is a sample: true counts live in the task stats.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from psycopg.types.json import Jsonb

from engine_core.db import Conn

# A reason's shape (`reason_shape`): what varies from row to row - ids, numbers - as placeholders.
_UUID = re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")
# hashes, mail ids, a Dagster run id's first 8 ("Dagster run 01c26c1d terminated": not "{n}c26c1d")
_HEX_ID = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
# durations as progress.format_seconds writes them ("3m02s", "1h05m", "42s"): one placeholder, not
# "{n}m02s" (seen in `migrate status`)
_DURATION = re.compile(r"(?<![A-Za-z_0-9.])\d+(?:h\d\dm|m\d\ds)(?![A-Za-z_0-9])")
# a number: a hex literal ("0xff", a byte in a decode error) and a thousands-separated one
# ("1,234,567": groups of exactly three digits after the first) as one
_NUMBER = re.compile(r"(?<![A-Za-z_0-9.])(?:0[xX][0-9a-fA-F]+|\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")
# names with numbers in them, not counts or ids: a word joined to numbers by hyphens ("UTF-8",
# "utf-8", "ISO-8859-1", "SHA-256", "latin-1") and a protocol's version ("HTTP/1.1", "HTTP/2");
# an id in a path ("persons/123") is not a name (lowercase, not a one- or two-digit version)
_NAME = re.compile(r"(?<![A-Za-z0-9_])(?:[A-Za-z]+(?:-\d+)+(?![\d.]*\d)|[A-Z]{2,}/\d{1,2}(?:\.\d{1,2})?(?![\d.]*\d))")
_LONG_DIGITS = re.compile(r"(?<=[A-Za-z_])\d{3,}")  # 3+ digits inside a word ("abc1234"), as the ledger's SQL folds them
# numbers that are not ids: an HTTP status ("HTTP 500", "status 404", "(404)") tells groups apart
_STATUS_BEFORE = ("HTTP ", "status ", "(")
_STATUS_LINE = re.compile(r"HTTP/\d(?:\.\d)? $")  # "HTTP/1.1 502 Bad Gateway"


def failure_reason(exc: BaseException) -> str:
    """A short, stable reason for grouping: the exception type and its first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    name = type(exc).__name__
    reason = f"{name}: {text}" if text else name
    return reason[:300]


# A served value quoted at the end of a reason, as a mapper names it (`mapping._describe`: a repr,
# cut at 40 characters): "name is not text: {'value': 'Carla Pereira', ...}", "id is not a positive
# integer: 'abc'" - one `{value}`, so such rows group by what was wrong, not by what was served
# (else every row is a group of its own).
_SERVED_VALUE = re.compile(r": (?:'[^']*'?|\"[^\"]*\"?|[\[{].*)(?:\.\.\.)?$")


def reason_shape(reason: str) -> str:
    """A reason with what varies from row to row replaced by placeholders, the label of a group of
    reasons (a group of 200 rows was labelled with one row's ids, "person 42 references
    org 7 which is missing"): UUIDs and long hex ids become `{id}`, numbers `{n}` ("not linked to
    any record: organizations {n} is not here"), durations ("3m02s"), thousands-separated numbers
    ("1,234") and hex literals ("0xff") one `{n}` each. Kept as they are: HTTP statuses ("HTTP 500",
    "status 404", "(404)", "HTTP/1.1 502"), which tell causes apart, and names with numbers in them
    ("UTF-8", "ISO-8859-1", "HTTP/1.1", "v2": not "UTF-{n}" nor "{n},{n}"); a served
    value quoted at its end ("...: {'value': ...}", "...: 'abc'") is one `{value}`. Placeholders
    are braces, not angle brackets: the label is shown in markdown."""
    text = _DURATION.sub("{n}", _HEX_ID.sub("{id}", _UUID.sub("{id}", _SERVED_VALUE.sub(": {value}", reason))))
    names = [m.span() for m in _NAME.finditer(text)]

    def number(m: re.Match[str]) -> str:
        if any(start <= m.start() < end for start, end in names):
            return m.group()
        before, after = text[:m.start()], text[m.end():]
        status = len(m.group()) == 3 and (before.endswith(_STATUS_BEFORE[:2]) or bool(_STATUS_LINE.search(before))
                                          or (before.endswith("(") and after.startswith(")")))
        return m.group() if status else "{n}"

    return _LONG_DIGITS.sub("{n}", _NUMBER.sub(number, text))


def group_key(reason: str) -> str:
    """What the run log groups a task's reasons by: their shape (`reason_shape`)."""
    return reason_shape(reason)


class RunLog:
    """A task's (or a barrier's) run-log entries, grouped in memory by level, kind and reason shape
    (`group_key`) and appended to the run's log in one statement per flush. `cap`: the
    groups a flush holds at most, and the run log's length (oldest entries go first)."""
    def __init__(self, run_id: int, task_id: int | None = None, cap: int = 200) -> None:
        self.run_id = run_id
        self.task_id = task_id
        self.cap = cap
        self.groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.flushes = 0

    def note(self, level: str, kind: str, reason: str, subject: object = None) -> None:
        """Count one `level` ("error", "warning", ...) note of `kind` with `reason`; `subject` (a
        source id, a task) is kept among the group's samples."""
        key = (level, kind, group_key(reason))
        entry = self.groups.get(key)
        if entry is None:
            entry = self.groups[key] = {
                "level": level,
                "kind": kind,
                "reason": reason,
                "count": 0,
                "samples": [],
                "task": self.task_id,
                "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
        entry["count"] += 1
        if subject is not None and len(entry["samples"]) < 5:
            entry["samples"].append(str(subject)[:64])

    def should_flush_early(self) -> bool:
        """True when the groups held reach the cap: flush before more are lost."""
        return len(self.groups) >= self.cap

    def flush(self, conn: Conn) -> bool:
        """Append the groups to the run's log in `conn`'s transaction (the caller's window or
        finish); False when there was nothing to write."""
        if not self.groups:
            return False
        entries = list(self.groups.values())
        conn.execute("log_append", {"run_id": self.run_id, "entries": Jsonb(entries), "cap": self.cap})
        self.groups.clear()
        self.flushes += 1
        return True
