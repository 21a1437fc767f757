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

_NUMBERS = re.compile(r"\d{3,}")


def failure_reason(exc: BaseException) -> str:
    """A short, stable reason for grouping: the exception type and its first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    name = type(exc).__name__
    reason = f"{name}: {text}" if text else name
    return reason[:300]


def group_key(reason: str) -> str:
    return _NUMBERS.sub("N", reason)


class RunLog:
    def __init__(self, run_id: int, task_id: int | None = None, cap: int = 200) -> None:
        self.run_id = run_id
        self.task_id = task_id
        self.cap = cap
        self.groups: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.flushes = 0

    def note(self, level: str, kind: str, reason: str, subject: object = None) -> None:
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
        return len(self.groups) >= self.cap

    def flush(self, conn: Conn) -> bool:
        if not self.groups:
            return False
        entries = list(self.groups.values())
        conn.execute("log_append", {"run_id": self.run_id, "entries": Jsonb(entries), "cap": self.cap})
        self.groups.clear()
        self.flushes += 1
        return True
