"""The statements on an account's shared row in `source_budgets`: lease a chunk of scheduled slots
(the burst schedule - migration 0024's `budget_slots` - and the daily share's check, `budget.py`'s
proof), create the row, pause it on a burst 429 or a full window, park it on a spent day or our
share used. `PendingNote` is a pause or
park owed to the row by a thread that may not use the database; `Slot` a leased slot; `BudgetStats`
what a process's budget did; `seconds_to_utc_midnight` the daily reset when the source does not say.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

LEASE_SQL = """
WITH locked AS (
    SELECT * FROM source_budgets
     WHERE source = %(source)s AND account = %(account)s
       FOR UPDATE
), stamped AS (
    -- clock_timestamp() after the lock is held: a waiter must not start from the time it queued
    SELECT locked.*, clock_timestamp() AS now FROM locked
), day AS (
    -- a parked day whose reset has passed: its numbers are forgotten
    SELECT s.*, (s.daily_reset_at IS NOT NULL AND s.daily_reset_at <= s.now) AS new_day FROM stamped s
), report AS (
    SELECT d.*,
           -- a report from a slot leased before the day's reset is the old day's (no slot is
           -- granted while parked, so the slots leased when the new day is seen are all older);
           -- the floor is kept in daily_seq until the new day's first report
           (%(rem)s::bigint IS NOT NULL AND %(seq)s::bigint IS NOT NULL AND CASE
                WHEN d.new_day THEN %(seq)s::bigint >= d.slots_leased
                WHEN d.daily_remaining IS NULL THEN d.daily_seq IS NULL OR %(seq)s::bigint >= d.daily_seq
                ELSE %(seq)s::bigint > d.daily_seq + %(lag)s
                  OR %(rem)s::bigint + %(max_cost)s * %(seq)s::bigint < d.daily_remaining + %(max_cost)s * d.daily_seq
           END) AS take
      FROM day d
), known AS (
    SELECT r.*,
           CASE WHEN r.take THEN %(rem)s::bigint WHEN r.new_day THEN NULL ELSE r.daily_remaining END AS rem,
           CASE WHEN r.take THEN %(seq)s::bigint WHEN r.new_day THEN r.slots_leased ELSE r.daily_seq END AS kseq,
           COALESCE(%(daily_limit)s::bigint, r.daily_limit) AS lim,
           CASE WHEN r.new_day THEN NULL ELSE r.daily_reset_at END AS reset_at,
           LEAST(1.0, r.rate_scale + %(recovery)s * GREATEST(0.0,
                 EXTRACT(EPOCH FROM r.now - COALESCE(r.last_burst_at, r.now))::float8)) AS scale
      FROM report r
), plan AS (
    SELECT k.*,
           budget_slots(k.recent, EXTRACT(EPOCH FROM GREATEST(k.now, COALESCE(k.paused_until, k.now)))::float8,
                        %(chunk)s, %(ready)s, %(spacing)s::float8 / k.scale, %(burst_limit)s,
                        %(horizon)s::float8 / k.scale, %(lag)s, %(gap)s::float8,
                        %(half)s) AS slots,
           (k.reset_at IS NOT NULL AND k.reset_at > k.now) AS parked_before,
           (%(share)s::float8 < 1.0 AND k.rem IS NOT NULL AND k.kseq IS NOT NULL AND k.lim IS NOT NULL
            AND k.rem - %(max_cost)s * (k.slots_leased + %(chunk)s - k.kseq + %(lag)s)
                < CEIL((1.0 - %(share)s::float8) * k.lim)) AS share_reached
      FROM known k
), decided AS (
    SELECT p.*,
           (NOT p.parked_before AND NOT p.share_reached
            AND p.slots[1] <= EXTRACT(EPOCH FROM p.now)::float8 + %(max_ahead)s) AS grant_it,
           (NOT p.parked_before AND p.share_reached) AS park_now
      FROM plan p
), written AS (
    UPDATE source_budgets b
       SET recent = CASE WHEN d.grant_it
                         THEN (b.recent || d.slots)[GREATEST(1, cardinality(b.recent) + %(chunk)s - %(burst_limit)s + 1):]
                         ELSE b.recent END,
           tat = CASE WHEN d.grant_it THEN to_timestamp(d.slots[%(chunk)s]) ELSE b.tat END,
           burst_limit = %(burst_limit)s,
           daily_remaining = d.rem,
           daily_seq = d.kseq,
           daily_limit = d.lim,
           daily_reset_at = CASE WHEN d.park_now THEN d.now + make_interval(secs => %(daily_wait)s)
                                 ELSE d.reset_at END,
           daily_reason = CASE WHEN d.park_now THEN 'share'
                               WHEN d.reset_at IS NULL THEN NULL ELSE b.daily_reason END,
           leases = b.leases + CASE WHEN d.grant_it THEN 1 ELSE 0 END,
           slots_leased = b.slots_leased + CASE WHEN d.grant_it THEN %(chunk)s ELSE 0 END,
           updated_at = d.now
      FROM decided d
     WHERE b.source = d.source AND b.account = d.account
    RETURNING b.daily_reset_at, b.daily_reason
)
SELECT d.slots[1] - EXTRACT(EPOCH FROM d.now)::float8 AS delay,
       EXTRACT(EPOCH FROM d.now)::float8 AS db_now,
       d.slots,
       d.slots_leased AS first_seq,
       d.grant_it AS granted,
       (d.parked_before OR d.park_now) AS parked,
       EXTRACT(EPOCH FROM w.daily_reset_at - d.now)::float8 AS daily_wait,
       w.daily_reason AS reason
  FROM decided d, written w
"""

CREATE_SQL = """
INSERT INTO source_budgets (source, account, burst_limit, window_seconds)
VALUES (%(source)s, %(account)s, %(burst_limit)s, %(window_seconds)s)
ON CONFLICT (source, account) DO NOTHING
"""

# A burst 429: no slot starts before the window has emptied, whoever leases it (a later pause
# wins), and the rate in force drops to `factor` (3/4) of what it was (recovering from now). A full
# window reported with a 200 ("near"): no pause, the rate drops to 0.9 of what it was.
PAUSE_SQL = """
UPDATE source_budgets
   SET paused_until = CASE WHEN %(pause)s
                           THEN GREATEST(paused_until, clock_timestamp() + make_interval(secs => %(wait)s))
                           ELSE paused_until END,
       rate_scale = GREATEST(%(min_scale)s::float8, %(factor)s * LEAST(1.0, rate_scale + %(recovery)s * GREATEST(0.0,
                    EXTRACT(EPOCH FROM clock_timestamp() - COALESCE(last_burst_at, clock_timestamp()))::float8))),
       last_burst_at = clock_timestamp(),
       updated_at = clock_timestamp()
 WHERE source = %(source)s AND account = %(account)s
"""

# A daily 429 ('spent') or our share used ('share'): every worker sharing the account parks until
# the reset. A stale reset from an earlier day is replaced; a later one recorded by another worker is kept.
PARK_SQL = """
UPDATE source_budgets
   SET daily_reset_at = CASE
           WHEN daily_reset_at IS NULL OR daily_reset_at <= clock_timestamp()
           THEN clock_timestamp() + make_interval(secs => %(wait)s)
           ELSE GREATEST(daily_reset_at, clock_timestamp() + make_interval(secs => %(wait)s))
       END,
       daily_reason = %(reason)s,
       daily_remaining = CASE WHEN %(reason)s = 'spent' THEN 0 ELSE daily_remaining END,
       daily_seq = CASE WHEN %(reason)s = 'spent' THEN slots_leased ELSE daily_seq END,
       updated_at = clock_timestamp()
 WHERE source = %(source)s AND account = %(account)s
"""


@dataclass(frozen=True)
class BudgetStats:
    """What this process's Budget did: statements against the row, and the fate of its slots."""

    statements: int
    writes: int
    leases: int
    slots_leased: int
    slots_spent: int
    slots_expired: int


@dataclass(frozen=True)
class Slot:
    """One scheduled slot on this process's monotonic clock: send within [valid_from, expires_at]."""

    valid_from: float
    expires_at: float
    seq: int  # the row's slot numbering (slots_leased before this chunk + j)
    spare: bool = False  # leased beyond the threads that waited (`Budget._spares`)


@dataclass(frozen=True)
class PendingNote:
    """A rate-limit note owed to the shared row: the statement (PAUSE_SQL or PARK_SQL), until when
    it holds on the local clock, and its parameters. Made by `note_locally` on any thread,
    written by `write_note` on a thread that may use the database."""
    statement: str  # PAUSE_SQL | PARK_SQL
    until: float  # local clock
    params: dict[str, Any]


def seconds_to_utc_midnight(now: float) -> float:
    """Seconds from `now` (epoch seconds) to the next UTC midnight: Pipedrive's daily budget is
    counted per UTC day when the source does not say when it resets (at least 1 s)."""
    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    midnight = (moment + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1.0, midnight.timestamp() - now)
