"""Whether a live run's source is failing and its tasks are being retried, read from the run's tasks
(what `migrate status` says while the workers retry, before the engine pauses the run).

A request the source fails is retried by the client (a few times, backing off), then the task is
released with its error and a `not_before` (`worker.Worker`: a `TransientError`) and claimed
again later, up to `max_attempts`. The phase's reporter pauses the run once every request since
the last success has failed for MIGRATE_SOURCE_DOWN_SECONDS (`progress.SourceMetrics.down_since`,
counted in the workers' process; `runs.pause`, exit 4 of `migrate run`). Until then the run is
"running" and its rows stand still: another process (`migrate status`) sees the tasks released
with their source's error, not yet finished - `source_retries` reads them, and whether any task
succeeded since the first of them (when none did, every task that asked the source has failed).

Errors that are not the source's are left out: the engine's own (a database's, a lock released as
stale, a task re-armed) and a task parked on the daily budget (`budget_waiting` says that one).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from engine_core.db import Database
from engine_core.progress import SOURCE_DOWN_ENV, format_seconds, source_down_seconds

# Task errors that are no failure of the source (LIKE patterns): the database's (`errors`), the
# reaper's release of a stale lock, a cancelled task re-armed, a task parked on the daily budget
NOT_THE_SOURCE = ("TransientDatabaseError%", "DatabaseUnavailable%", "released: %", "cancelled while %",
                  "RateLimitParked%", "DailyLimitReached%")



@dataclass(frozen=True)
class SourceRetries:
    """A live run's tasks being retried after the source failed them: how many (`tasks`, not
    finished), the latest one's error (`last_error`, "TransientHTTPError: HTTP 503 ..."), when the
    source has failed them (`since`, UTC: the later of the run's last task that succeeded and the
    first start of these tasks, which their retries do not move), the soonest a released one is
    tried again (`next_try`, UTC, or None: being tried now), and whether any task succeeded since
    the first of them was released (`failing_all`: none did - every task that asked the source
    failed)."""
    tasks: int
    last_error: str
    since: datetime
    next_try: datetime | None
    failing_all: bool

    def line(self, tenant: str) -> str:
        """What `migrate status` says, e.g. "the source is failing: every task that asked it since
        19:31:02 UTC failed (last: TransientHTTPError: HTTP 503); 4 tasks are being retried (next try
        19:33:10 UTC); the engine pauses the run once the source has failed every request for 3m00s
        (MIGRATE_SOURCE_DOWN_SECONDS), and `migrate run --tenant acme` resumes it once it answers"."""
        n = f"{self.tasks} task{'' if self.tasks == 1 else 's'}"
        retry = f"{n} {'is' if self.tasks == 1 else 'are'} being retried" + (
            f" (next try {self.next_try:%H:%M:%S} UTC)" if self.next_try is not None else "")
        if not self.failing_all:
            return f"the source failed some requests (last: {self.last_error}); {retry}"
        down = source_down_seconds()
        pause = (f"the engine pauses the run once the source has failed every request for {format_seconds(down)} "
                 f"({SOURCE_DOWN_ENV}), and `migrate run --tenant {tenant}` resumes it once it answers"
                 if down > 0 else f"the run is not paused for it ({SOURCE_DOWN_ENV}=0)")
        return (f"the source is failing: every task that asked it since {self.since:%H:%M:%S} UTC failed (last: "
                f"{self.last_error}); {retry}; {pause}")

    def as_dict(self) -> dict[str, Any]:
        """The state as `migrate status --json` gives it (times as ISO text)."""
        return {"tasks": self.tasks, "last_error": self.last_error, "since": self.since.isoformat(),
                "next_try": self.next_try.isoformat() if self.next_try else None, "failing_all": self.failing_all}


def source_retries(db: Database, run_id: int) -> SourceRetries | None:
    """Run `run_id`'s tasks being retried after the source failed them (the module docstring), or
    None when there are none."""
    row = db.fetch_one("run_source_retries", {"run_id": run_id, "not_source": list(NOT_THE_SOURCE)})
    if row is None or not row["tasks"]:
        return None
    last_success = row["last_success"]
    # failing since: not the first release, which each retry's release moves on through one outage,
    # but the first start of the tasks failing now, or the last success when later
    since = row["first_started"] or row["since"]
    if last_success is not None and last_success > since:
        since = last_success
    since = since.astimezone(timezone.utc)
    next_try = row["next_try"]
    if next_try is not None and next_try <= datetime.now(timezone.utc):
        next_try = None  # due: claimed as soon as a worker is free
    return SourceRetries(tasks=int(row["tasks"]), last_error=str(row["last_error"])[:160], since=since,
                         next_try=next_try.astimezone(timezone.utc) if next_try else None,
                         failing_all=last_success is None or last_success < row["since"])
