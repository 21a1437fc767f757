"""What an account's rate-limit budget is waiting on, read from its shared row for `migrate status`
and the run's progress: our share of the day used, the day spent at the source, or a burst pause.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import NamedTuple

from engine_core.config import daily_token_share
from engine_core.db import Database

WAITING_SQL = """
SELECT clock_timestamp() AS now, paused_until, daily_reset_at, daily_reason, daily_limit, daily_remaining
  FROM source_budgets WHERE source = %(source)s AND account = %(account)s
"""


# "may be spent": the park is the proof's bound (`budget.py`), not the source's count: the requests
# since the last report are counted at max_cost, so the source may report far less spent
WAITING_SHARE = ("waiting on the daily token budget: our {share:.0%} share{of} may be spent{left}; the requests "
                 "since are counted at the most a request can cost")
WAITING_SPENT = "waiting on the daily token budget: the source says it is spent"
WAITING_BURST = "waiting on the burst window: the source answered 429"


class WaitingState(NamedTuple):
    """What an account's budget is waiting on: `reason` (None when nothing) and `until` (a UTC
    datetime, None when nothing); unpacks as `(reason, until)`."""

    reason: str | None
    until: datetime | None

    @property
    def kind(self) -> str | None:
        """'daily_share' | 'daily_spent' | 'burst' | None, for code that branches on it."""
        if self.reason is None:
            return None
        if self.reason == WAITING_SPENT:
            return "daily_spent"
        if self.reason == WAITING_BURST:
            return "burst"
        return "daily_share"


def waiting_state(db: Database, account: str, source: str = "pipedrive") -> WaitingState:
    """Why the account's workers are not calling the source right now, and until when.

    Reads the account's budget row (no lock, one statement): a parked daily budget first (our
    share of the day is used up, or the source answered a daily 429), then a burst pause (a 429).
    Returns `WaitingState(None, None)` when neither holds or the account has no row yet. The share
    named is this process's MIGRATE_DAILY_TOKEN_SHARE. `migrate status` prints it while the run is
    live, e.g. "waiting on the daily token budget: our 80% share of 150,000 tokens may be spent (the
    source last reported 31,200 left); the requests since are counted at the most a request can
    cost, until 2026-12-02 00:00:00 UTC"; `--json` carries {"reason", "until"} as "waiting".
    """
    rows = db.sql(WAITING_SQL, {"source": source, "account": account})
    if not rows:
        return WaitingState(None, None)
    row = rows[0]
    now = row["now"]
    reset = row["daily_reset_at"]
    if reset is not None and reset > now:
        if row["daily_reason"] == "share":
            share = daily_token_share()
            limit = row["daily_limit"]
            of = f" of {limit:,} tokens" if limit else ""
            remaining = row["daily_remaining"]
            left = f" (the source last reported {remaining:,} left)" if remaining is not None else ""
            return WaitingState(WAITING_SHARE.format(share=share, of=of, left=left), reset.astimezone(timezone.utc))
        return WaitingState(WAITING_SPENT, reset.astimezone(timezone.utc))
    paused = row["paused_until"]
    if paused is not None and paused > now:
        return WaitingState(WAITING_BURST, paused.astimezone(timezone.utc))
    return WaitingState(None, None)

