"""The source's rate-limit budget: slots scheduled centrally in chunks, spent locally at their time.

One row in `source_budgets` per source account - not per tenant: two tenants importing one account
share its allowance, and so do every lane thread, fetch thread and worker process. A worker leases
a *chunk* of C slots with one statement under the row lock, spends them in-process (thread-safe, no
database), and reports what the responses said (`source.RateObservation`) on its next lease. The hot path never writes
the row per request: one statement per chunk, plus a write only when something happens that every
worker must know at once (a burst 429, the daily budget spent).

The guarantee, and why it holds (the rate the source allows, not 0.55 of it)
-------------------------------------------------------------------------------------
The source counts requests in a *rolling* window of W seconds (2 s) and refuses a request when L
were accepted within the W seconds before it. The row keeps a GCRA token bucket, one timestamp
`tat`, and schedules every slot *individually*:

* A lease of C slots starts at `start = max(now, tat, paused_until)` (database clock, under the row
  lock), gives slot j the time `s_j = start + j*g` (j = 0..C-1) and moves `tat` to `start + C*g`
  (plus 1 us against rounding). So any two slots ever granted for the account, by any process, are
  at least g apart.
* A slot may be sent only within [s_j, s_j + ttl] (`lease_ttl`; unsent, it expires), and the
  request reaches the source's counter at most `latency_margin` m after the check that let it go
  (m bounds the jitter of the one-way delay and the client's own time from check to socket: a
  constant delay shifts every request alike and changes no count). So it arrives in
  [s_j, s_j + d] with d = ttl + m.
* The requests that arrive in any window (t - W, t] therefore hold slots with s_j in
  (t - W - d, t], a half-open interval of length W + d; points at least g apart number at most
  ceil((W + d) / g) in it. With g = (W + d) / L that is L: never more than the limit, summed over
  every worker sharing the account, at any alignment of the window. The sustained rate is
  L / (W + d): with ttl = 0.05 s and m = 0.075 s, 0.94 of the allowed L / W.
* Every worker maps a database time onto its own monotonic clock conservatively: the database read
  its clock between `before` and `after` (local) of a lease statement, so the offset between the
  clocks lies in [before - db_now, after - db_now]; the tightest of the last 10 s of leases, each
  widened by 500 ppm of drift per second since, gives [lo, hi], and slot j is valid locally from
  `s_j + hi` to `s_j + lo + ttl` - an interval inside [s_j, s_j + ttl] on the database's clock. A
  slow statement only shortens slots' lives (they expire unspent: lost rate, never an extra
  request), and one fast lease in ten seconds is enough to keep them whole.

Two choices keep the bound tight: the chunk does not start all its slots at once (that would cost
C per window), and a slot lives for `ttl` after its own time rather than a whole chunk's worth of
time (that would cost ttl + m of every W + ttl + m). A fetch round's `reserve(n)` holds
n *scheduled* slots; each fetch thread waits locally for its slot's time, with no database.

Self-correction from what the source says
-----------------------------------------
The proof assumes the account's token is spent only through this row. What the source reports
corrects it when that is not so (another integration on the same token, a jitter beyond m). The
provider's client reads it into a `RateObservation` (Pipedrive: the `x-ratelimit-*` headers):

* a `limit` lower than configured lowers the limit in force at the next lease.
* `remaining` 0 on an accepted request: the window was full when it arrived, which
  at L / (W + d) happens only when a jitter beyond m (or another spender) used the margin up. This
  process holds off until the window resets (`reset`, capped at W), and every worker
  slows down before the source has to refuse anything: `rate_scale` drops to 0.9 of what was in
  force (one row write per process per window at most).
* A burst 429 (`Retry-After`): `paused_until` is written once, so no slot of any worker starts
  before the window has emptied, and `rate_scale` drops to 3/4 of what was in force (at least
  `min_rate_scale`): every lease's spacing is g / rate_scale, recovering linearly to g at
  `rate_recovery` per second from `last_burst_at`. A larger spacing keeps the proof.

The daily token budget, and our share of it
-------------------------------------------
The source charges every accepted request its token cost against a daily budget per company
shared by all its integrations. The engine spends at most `daily_share` of it (default from
MIGRATE_DAILY_TOKEN_SHARE, 0.8): it never lets the source's remaining tokens fall below the floor
F = ceil((1 - share) * limit), `limit` being the observed `daily_limit`.

* Each granted slot has a sequence number (the row's `slots_leased` count). A response's
  observed `daily_remaining` R, reported with the number k of the slot its request used,
  counts every request that reached the source before it; slots numbered below k - lag (lag =
  ceil(d / g) + 1) arrived before slot k did (they are >= lag*g > d earlier), so they are in R.
* Every request costs at most `max_cost` tokens (80: the largest `x-token-cost` in the spec). So
  after a lease that brings the count to n, the tokens our requests may have spent beyond R are at
  most max_cost * (n - k + lag). A lease is granted only if R - max_cost * (n - k + lag) >= F;
  otherwise the row parks the account (`daily_reset_at`, `daily_reason = 'share'`) until the day
  resets - the observed `daily_reset` when the source sends one, else the next UTC midnight (the
  `daily_reset` callable). With no other integration spending, the source's count of our tokens
  in a day never exceeds share * limit; with others spending, we stop as soon as R says so.
* The row keeps the tightest report (R + max_cost * k smallest) or a newer one (k beyond the
  kept k + lag: a day that reset reports a larger R), and forgets its numbers when a parked day's
  reset time has passed. A report carried by a slot leased before that reset is the old day's and
  is not taken (a worker parked with a report of the old day delivers it with its first lease of
  the new one: taken, it parked the account for the whole new day). Before the source has reported a limit nothing is known and nothing is
  held back.
* A share of 1 (the whole budget) leaves the source to say when the day is spent: no share
  check, and the park's exact wait comes from the daily 429's `Retry-After`. (A share below 1
  parks on the `daily_reset` rule instead, so that rule must not be early: an early resume spends
  up to a chunk per worker of the old day before the reports park it again.)
* A daily 429 (the budget spent by everyone together) parks every worker with the exact wait
  (`Retry-After`, `daily_reason = 'spent'`). A parked worker raises `RateLimitParked` at once and
  its task parks until the reset instead of burning attempts on a wait measured in hours;
  `waiting_state(db, account)` says why and until when, for the run's status.

Statements on the row: one per C requests, plus one per burst 429 or daily park.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, NamedTuple

from engine_core.config import daily_token_share
from engine_core.db import Database
from engine_core.errors import RateLimitParked, TaskStopped
from engine_core.source import RateObservation

log = logging.getLogger(__name__)

POLL = 0.1  # how often a waiter looks at its cancel event
OFFSET_MEMORY = 10.0  # seconds of lease round trips that bound this process's clock offset
CLOCK_DRIFT = 5e-4  # the most two clocks drift apart per second (NTP slews at most 500 ppm)
MAX_TOKEN_COST = 80  # the largest x-token-cost in Pipedrive's spec (/v1/deals/summary/archived)


class BudgetCancelled(TaskStopped):
    """The wait for a rate-limit slot was abandoned because the task was asked to stop."""


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
class _Slot:
    """One scheduled slot on this process's monotonic clock: send within [valid_from, expires_at]."""

    valid_from: float
    expires_at: float
    seq: int  # the row's slot numbering (slots_leased before this chunk + j)


def seconds_to_utc_midnight(now: float) -> float:
    """Seconds from `now` (epoch seconds) to the next UTC midnight: Pipedrive's daily budget is
    counted per UTC day when the source does not say when it resets (at least 1 s)."""
    moment = datetime.fromtimestamp(now, tz=timezone.utc)
    midnight = (moment + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1.0, midnight.timestamp() - now)


# The statements on the row. They live here, beside the proof they implement.
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
           GREATEST(k.now, k.tat, COALESCE(k.paused_until, k.now)) AS start,
           %(spacing)s::float8 / k.scale AS slot_spacing,
           (k.reset_at IS NOT NULL AND k.reset_at > k.now) AS parked_before,
           (%(share)s::float8 < 1.0 AND k.rem IS NOT NULL AND k.kseq IS NOT NULL AND k.lim IS NOT NULL
            AND k.rem - %(max_cost)s * (k.slots_leased + %(chunk)s - k.kseq + %(lag)s)
                < CEIL((1.0 - %(share)s::float8) * k.lim)) AS share_reached
      FROM known k
), decided AS (
    SELECT p.*,
           (NOT p.parked_before AND NOT p.share_reached
            AND p.start <= p.now + make_interval(secs => %(max_ahead)s)) AS grant_it,
           (NOT p.parked_before AND p.share_reached) AS park_now
      FROM plan p
), written AS (
    UPDATE source_budgets b
       SET tat = CASE WHEN d.grant_it
                      THEN d.start + make_interval(secs => d.slot_spacing * %(chunk)s + 0.000001)
                      ELSE b.tat END,
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
SELECT EXTRACT(EPOCH FROM d.start - d.now)::float8 AS delay,
       EXTRACT(EPOCH FROM d.now)::float8 AS db_now,
       EXTRACT(EPOCH FROM d.start)::float8 AS db_start,
       d.slot_spacing,
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
# the reset. A stale reset from an
# earlier day is replaced; a later one recorded by another worker is kept.
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

WAITING_SQL = """
SELECT clock_timestamp() AS now, paused_until, daily_reset_at, daily_reason, daily_limit, daily_remaining
  FROM source_budgets WHERE source = %(source)s AND account = %(account)s
"""


# "may be spent": the park is the proof's bound (module docstring), not the source's count - a fresh
# user read "is used" while the source reported 8% spent (a small day, requests counted at max_cost)
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


class Budget:
    """A source account's rate-limit budget: lease chunks of scheduled slots, spend them locally.

    `burst_limit` L per `window_seconds` W; `chunk` C slots per lease statement (at most L / 4);
    `lease_ttl` how long after its scheduled time a slot may still be sent; `latency_margin` the
    bound on the jitter from a slot's check to the request's arrival at the source (both seconds;
    see the module's proof); `max_ahead` how far in the future a lease may start; `daily_share`
    the share of the daily token budget this engine may spend (default MIGRATE_DAILY_TOKEN_SHARE);
    `max_cost` the largest token cost of one request; `daily_reset` seconds from an epoch time to
    the source's daily reset when it does not say. Raises ValueError on a bad number.
    """

    def __init__(
        self,
        db: Database,
        source: str,
        account: str,
        *,
        burst_limit: int = 80,
        window_seconds: float = 2.0,
        chunk: int = 8,
        lease_ttl: float = 0.05,
        latency_margin: float = 0.075,
        max_ahead: float = 5.0,
        daily_share: float | None = None,
        max_cost: int = MAX_TOKEN_COST,
        daily_reset: Callable[[float], float] = seconds_to_utc_midnight,
        daily_probe_seconds: float = 30.0,
        rate_recovery: float = 0.02,
        min_rate_scale: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if burst_limit < 2:
            raise ValueError(f"burst_limit must be >= 2, got {burst_limit}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if window_seconds <= 0 or lease_ttl <= 0 or latency_margin < 0 or max_ahead < 0:
            raise ValueError("window_seconds and lease_ttl must be > 0; latency_margin and max_ahead >= 0")
        share = daily_token_share() if daily_share is None else daily_share
        if not 0.0 < share <= 1.0:
            raise ValueError(f"daily_share must be in (0, 1], got {share}")
        if max_cost < 1:
            raise ValueError(f"max_cost must be >= 1, got {max_cost}")
        if not 0.0 < min_rate_scale <= 1.0 or rate_recovery < 0:
            raise ValueError("min_rate_scale must be in (0, 1] and rate_recovery >= 0")
        self.db = db
        self.source = source
        self.account = account
        self.burst_limit = burst_limit
        self.window_seconds = window_seconds
        self.chunk = chunk
        self.lease_ttl = lease_ttl
        self.latency_margin = latency_margin
        self.max_ahead = max_ahead
        self.daily_share = share
        self.max_cost = max_cost
        self.daily_probe_seconds = daily_probe_seconds
        self.rate_recovery = rate_recovery
        self.min_rate_scale = min_rate_scale
        self._daily_reset = daily_reset
        self._clock = clock
        self._wall = wall_clock
        self._cond = threading.Condition(threading.Lock())
        self._local = threading.local()  # .seq: the slot this thread's last request used
        self._slots: list[_Slot] = []  # held, sorted by valid_from
        self._leasing = False
        self._reported_limit: int | None = None
        self._paused_until = -math.inf  # local: no slot is spent before this
        self._row_paused_until = -math.inf  # what this process last wrote to the row
        self._row_slowed_until = -math.inf  # no second "near" slow-down from this process before this
        self._parked_until = -math.inf  # local: the daily budget is parked until this
        self._parked_reason: str | None = None
        self._not_before = -math.inf  # a refused lease: the queue was longer than max_ahead
        self._report: tuple[int, int] | None = None  # (daily remaining, seq), for the next lease
        self._daily_limit: int | None = None
        self._daily_reset_at: float | None = None  # local clock: the observed daily_reset
        self._offsets: deque[tuple[float, float, float]] = deque()  # (local time, lo, hi): see _offset
        self._statements = 0
        self._writes = 0
        self._lease_count = 0
        self._slots_leased = 0
        self._slots_spent = 0
        self._slots_expired = 0

    def __repr__(self) -> str:
        return f"Budget(source={self.source!r}, account={self.account!r}, limit={self.limit})"

    # --- the numbers --------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The burst limit in force: the configured one, lowered by what the source reports."""
        if self._reported_limit is not None:
            return max(2, min(self.burst_limit, self._reported_limit))
        return self.burst_limit

    def lease_size(self, limit: int | None = None) -> int:
        """Slots per lease: the configured chunk, at most a quarter of the limit."""
        limit = self.limit if limit is None else limit
        return max(1, min(self.chunk, limit // 4))

    @property
    def horizon(self) -> float:
        """W + d, d = ttl + margin: the span whose slots may land in one window (seconds)."""
        return self.window_seconds + self.lease_ttl + self.latency_margin

    def spacing(self, limit: int | None = None) -> float:
        """Seconds between two slots at full rate: g = (W + ttl + margin) / L (the proof's g)."""
        limit = self.limit if limit is None else limit
        return self.horizon / limit

    def rate(self, limit: int | None = None) -> float:
        """The sustained rate the proof allows, requests per second: L / (W + ttl + margin)."""
        return 1.0 / self.spacing(limit)

    def lag(self, limit: int | None = None) -> int:
        """Slots that may still be on their way when a later slot's response reports (ceil(d/g)+1)."""
        return math.ceil((self.lease_ttl + self.latency_margin) / self.spacing(limit)) + 1

    def stats(self) -> BudgetStats:
        """Counters of this budget object so far (statements, row writes, leases, slots leased and
        spent): what the tests and benches measure the budget's database cost with."""
        with self._cond:
            return BudgetStats(
                statements=self._statements,
                writes=self._writes,
                leases=self._lease_count,
                slots_leased=self._slots_leased,
                slots_spent=self._slots_spent,
                slots_expired=self._slots_expired,
            )

    # --- spending -----------------------------------------------------------------------------

    def acquire(self, cancel: threading.Event | None = None) -> None:
        """Take one slot for a request about to be sent: blocks until its scheduled time has come.
        Raises BudgetCancelled on a stop, RateLimitParked when the daily budget is parked."""
        self.acquire_seq(cancel)

    def acquire_seq(self, cancel: threading.Event | None = None) -> int:
        """`acquire`, returning the slot's sequence number (also kept for this thread's `observe`)."""
        while True:
            (slot,) = self._take(1, cancel)
            if self._wait_for(slot, cancel):
                with self._cond:
                    self._slots_spent += 1
                self._local.seq = slot.seq
                return slot.seq

    def reserve(self, n: int, *, cancel: threading.Event | None = None, deferred: bool = False) -> Reservation:
        """Hold n scheduled slots for a fetch round, so the fetch threads spend them with no database.

        `deferred`: from now until `serve` returns (or `release`), whatever else the fetch threads
        need of the budget waits for this thread's `serve` (see `Reservation`).
        """
        return Reservation(self, self._take(n, cancel), deferred=deferred)

    def _wait_for(self, slot: _Slot, cancel: threading.Event | None) -> bool:
        """Wait until the slot's time (and any pause); True when it is then still valid to send."""
        while True:
            with self._cond:
                self._check(cancel)
                now = self._clock()
                start = max(slot.valid_from, self._paused_until)
                if now >= start:
                    if now <= slot.expires_at:
                        return True
                    self._slots_expired += 1
                    return False
                if start > slot.expires_at:
                    self._slots_expired += 1  # a pause outlives the slot
                    return False
            wait = min(start - now, POLL if cancel is not None else 1.0)
            if cancel is not None:
                if cancel.wait(wait):
                    raise BudgetCancelled()
            else:
                time.sleep(wait)

    def _take(self, n: int, cancel: threading.Event | None) -> list[_Slot]:
        """Take the n earliest held slots (valid now or later), leasing chunks as needed."""
        if not 1 <= n <= self.lease_size():
            raise ValueError(f"can hold 1..{self.lease_size()} slots at once, asked for {n}")
        taken: list[_Slot] = []
        try:
            while len(taken) < n:
                i_lease = False
                with self._cond:
                    self._check(cancel)
                    now = self._clock()
                    self._drop_expired(now)
                    k = min(n - len(taken), len(self._slots))
                    taken.extend(self._slots[:k])
                    del self._slots[:k]
                    if len(taken) >= n:
                        break
                    wait: float | None = None  # None: until another thread's lease lands
                    if now < self._not_before:
                        wait = self._not_before - now
                    elif not self._leasing:
                        # One lease in flight per process: the other threads wait for it.
                        self._leasing = i_lease = True
                    if not i_lease:
                        self._cond.wait(self._wait_time(wait, cancel))
                        continue
                try:
                    self._lease()
                finally:
                    with self._cond:
                        self._leasing = False
                        self._cond.notify_all()
        except BaseException:
            self._give_back(taken)
            raise
        return taken

    def _wait_time(self, wait: float | None, cancel: threading.Event | None) -> float:
        limit = POLL if cancel is not None else 1.0
        return limit if wait is None else max(0.0, min(wait, limit))

    def _drop_expired(self, now: float) -> None:
        kept = [s for s in self._slots if s.expires_at > now]
        self._slots_expired += len(self._slots) - len(kept)
        self._slots = kept

    def _give_back(self, slots: list[_Slot]) -> None:
        if not slots:
            return
        with self._cond:
            now = self._clock()
            for slot in slots:
                if slot.expires_at > now:
                    self._slots.append(slot)
                else:
                    self._slots_expired += 1
            self._slots.sort(key=lambda s: s.valid_from)
            self._cond.notify_all()

    def _check(self, cancel: threading.Event | None) -> None:
        """Under the lock: a stop request or a parked daily budget ends the wait."""
        if cancel is not None and cancel.is_set():
            raise BudgetCancelled()
        now = self._clock()
        if now < self._parked_until:
            raise RateLimitParked(self._parked_until - now, self._park_message(self._parked_until - now))

    def _park_message(self, wait: float) -> str:
        why = ("our share of the daily token budget is used" if self._parked_reason == "share"
               else "the daily token budget is spent")
        return f"{why} ({self.daily_share:.0%} share); parked for {wait:.0f}s"

    # --- the row ------------------------------------------------------------------------------

    def _daily_wait(self) -> float:
        """Seconds to the source's next daily reset: its own report when it sent one, else the
        `daily_reset` rule (UTC midnight)."""
        now = self._clock()
        if self._daily_reset_at is not None and self._daily_reset_at > now:
            return self._daily_reset_at - now
        return self._daily_reset(self._wall())

    def _lease(self) -> None:
        """One statement: lease a chunk (or learn that the account is parked). Called unlocked."""
        with self._cond:
            limit = self.limit
            size = self.lease_size(limit)
            report = self._report
            params: dict[str, Any] = {
                "source": self.source,
                "account": self.account,
                "spacing": self.spacing(limit),
                "burst_limit": limit,
                "chunk": size,
                "max_ahead": self.max_ahead,
                "rem": report[0] if report else None,
                "seq": report[1] if report else None,
                "daily_limit": self._daily_limit,
                "lag": self.lag(limit),
                "max_cost": self.max_cost,
                "share": self.daily_share,
                "recovery": self.rate_recovery,
                "daily_wait": self._daily_wait(),
            }
        before = self._clock()
        rows = self._run(LEASE_SQL, params)
        if not rows:
            self._create_row(limit)
            before = self._clock()
            rows = self._run(LEASE_SQL, params)
        after = self._clock()
        row = rows[0]
        with self._cond:
            self._writes += 1
            if self._report == report:
                self._report = None  # delivered, unless a newer report arrived meanwhile
            if self._daily_limit == params["daily_limit"]:
                self._daily_limit = None
            if row["parked"]:
                wait = float(row["daily_wait"] or 0.0)
                self._parked_until = max(self._parked_until, before + wait)
                self._parked_reason = row["reason"]
                return
            delay = max(0.0, float(row["delay"]))
            if not row["granted"]:
                # The queue is longer than max_ahead: come back when it is not, without asking.
                self._not_before = after + delay - self.max_ahead
                return
            self._lease_count += 1
            self._slots_leased += size
            g = float(row["slot_spacing"])
            first = int(row["first_seq"])
            lo, hi = self._offset(before, after, float(row["db_now"]))
            start = float(row["db_start"])
            if hi - lo > self.lease_ttl / 2:
                log.debug("budget lease for %s/%s: clock offset known to %.3fs of a %.3fs ttl", self.source, self.account, hi - lo, self.lease_ttl)
            for j in range(size):
                self._slots.append(_Slot(start + j * g + hi, start + j * g + lo + self.lease_ttl, first + j))
            self._slots.sort(key=lambda s: s.valid_from)

    def _offset(self, before: float, after: float, db_now: float) -> tuple[float, float]:
        """Under the lock: bounds [lo, hi] on (local monotonic clock - database clock), from this
        lease (the database read its clock between `before` and `after`) and the leases of the last
        OFFSET_MEMORY seconds, each widened by the worst clock drift since (CLOCK_DRIFT). A slot at
        database time s is sent within [s + hi, s + lo + ttl] local: inside [s, s + ttl] on the
        database's clock, however slow this lease statement was (the tightest recent one counts)."""
        self._offsets.append((after, before - db_now, after - db_now))
        while self._offsets and self._offsets[0][0] < after - OFFSET_MEMORY:
            self._offsets.popleft()
        lo = max(l - CLOCK_DRIFT * (after - t) for t, l, _ in self._offsets)
        hi = min(h + CLOCK_DRIFT * (after - t) for t, _, h in self._offsets)
        if lo > hi:  # a clock stepped: trust this lease alone
            self._offsets.clear()
            self._offsets.append((after, before - db_now, after - db_now))
            lo, hi = before - db_now, after - db_now
        return lo, hi

    def _create_row(self, limit: int) -> None:
        self._run(CREATE_SQL, {
            "source": self.source,
            "account": self.account,
            "burst_limit": limit,
            "window_seconds": self.window_seconds,
        })
        with self._cond:
            self._writes += 1

    def _run(self, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._cond:
            self._statements += 1
        return self.db.sql(sql, params)

    # --- what the source said -----------------------------------------------------------------

    def observe(self, seen: RateObservation, note: Callable[[Literal["burst", "daily"], float], None] | None = None) -> None:
        """Keep what a response said about the rate limits (no database unless the day is spent;
        then `note`, default `note_rate_limited`, tells the other workers). Called on the thread
        that sent the request, after its `acquire`/`spend` (the report is tied to that slot)."""
        limit, remaining, reset = seen.limit, seen.remaining, seen.reset
        daily_remaining, daily_limit, daily_reset = seen.daily_remaining, seen.daily_limit, seen.daily_reset
        seq = getattr(self._local, "seq", None)
        floor_hit = False
        with self._cond:
            now = self._clock()
            if limit is not None and limit >= 2 and limit != self._reported_limit:
                if self._reported_limit is None or limit < self.limit:
                    log.info("%s/%s: the source reports a burst limit of %d", self.source, self.account, limit)
                self._reported_limit = limit
            full = remaining is not None and remaining <= 0
            if full and reset is not None:
                # The window is full (someone else spends this token too): hold off locally.
                self._paused_until = max(self._paused_until, now + min(reset, self.window_seconds))
            if daily_reset is not None:
                self._daily_reset_at = now + daily_reset
            if daily_limit is not None:
                self._daily_limit = daily_limit
            if daily_remaining is not None and seq is not None:
                old = self._report
                if (old is None or seq > old[1] + self.lag()
                        or daily_remaining + self.max_cost * seq < old[0] + self.max_cost * old[1]):
                    self._report = (daily_remaining, seq)
            if daily_remaining is not None and daily_limit is not None and self.daily_share < 1.0:
                floor_hit = daily_remaining < math.ceil((1.0 - self.daily_share) * daily_limit) + self.max_cost
        if full:
            # Our margin was used up (a jitter beyond it, or another spender): every worker slows
            # down a little before the source has to say 429 (one row write per window at most).
            (note or self.note_rate_limited)("near", 0.0)
        if daily_remaining is not None and daily_remaining <= 0:
            wait = daily_reset if daily_reset is not None else self.daily_probe_seconds
            (note or self.note_rate_limited)("daily", wait)
        elif floor_hit:
            # Within one request of our share's floor: park now, and every worker at its next lease.
            (note or self.note_rate_limited)("share", self._daily_wait())

    def note_rate_limited(self, scope: Literal["burst", "near", "daily", "share"], retry_after: float) -> None:
        """A 429, a spent daily budget or our share of it used: tell every worker sharing the
        account, once."""
        pending = self.note_locally(scope, retry_after)
        if pending is not None:
            self.write_note(pending)

    def note_locally(self, scope: Literal["burst", "near", "daily", "share"], retry_after: float) -> PendingNote | None:
        """The in-process half of `note_rate_limited`: this process pauses (or parks) at once. Returns
        the row write still owed to the other workers, or None when the row already says as much."""
        retry_after = max(0.0, float(retry_after))
        now = self._clock()
        with self._cond:
            if scope in ("daily", "share"):
                if now + retry_after <= self._parked_until + 0.5:
                    return None  # already parked at least that long: no second write
                self._parked_until = now + retry_after
                self._parked_reason = "spent" if scope == "daily" else "share"
                params = {"reason": self._parked_reason}
                statement = PARK_SQL
            elif scope == "near":
                if now < self._row_slowed_until:
                    return None  # this window's slow-down is already on the row
                self._row_slowed_until = now + self.window_seconds
                params = {"min_scale": self.min_rate_scale, "recovery": self.rate_recovery, "factor": 0.9, "pause": False}
                statement = PAUSE_SQL
            else:
                self._paused_until = max(self._paused_until, now + retry_after)
                if now + retry_after <= self._row_paused_until + 0.25:
                    return None  # this pause is already on the row
                self._row_paused_until = now + retry_after
                self._row_slowed_until = now + self.window_seconds
                params = {"min_scale": self.min_rate_scale, "recovery": self.rate_recovery, "factor": 0.75, "pause": True}
                statement = PAUSE_SQL
            self._cond.notify_all()
        return PendingNote(statement, now + retry_after, params)

    def write_note(self, note: PendingNote) -> None:
        """The row half: one statement, for the time still left of the wait."""
        wait = max(0.0, note.until - self._clock())
        self._run(note.statement, {"source": self.source, "account": self.account, "wait": wait, **note.params})
        with self._cond:
            self._writes += 1


@dataclass(frozen=True)
class PendingNote:
    """A rate-limit note owed to the shared row: the statement (PAUSE_SQL or PARK_SQL), until when
    it holds on the local clock, and its parameters. Made by `note_locally` on any thread,
    written by `write_note` on a thread that may use the database."""
    statement: str  # PAUSE_SQL | PARK_SQL
    until: float  # local clock
    params: dict[str, Any]


class _Reply:
    """A fetch thread's request to the reservation's owner, answered."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

    def ok(self) -> None:
        """Mark the call done."""
        self._done.set()

    def fail(self, error: BaseException) -> None:
        """Mark the call failed with `error`, raised to its waiter."""
        self._error = error
        self._done.set()

    def wait(self) -> None:
        """Wait for the call; re-raises the error it failed with."""
        self._done.wait()
        if self._error is not None:
            raise self._error


class Reservation:
    """Scheduled slots held for a fetch round: spending one is local (the fetch thread waits for the
    slot's time); unspent ones go back on `release()`.

    It is also the fetch threads' only door to the budget, so that they never touch the database.
    What needs it - a slot beyond the reserved ones (a retried request, or held slots that lapsed)
    and telling the other workers of a 429 - is handed to the thread that made the reservation (the
    task's), which `serve`s such requests while it joins the round; a 429's pause takes effect in
    this process at once, and the row hears of it from the task's thread moments later. A
    reservation made `deferred` holds such requests from the start (a fetch thread may need one
    before its owner reaches `serve`); otherwise, and on the owner's own thread, the budget is
    called directly.
    """

    def __init__(self, budget: Budget, slots: list[_Slot], *, deferred: bool = False) -> None:
        self._budget = budget
        self._slots = sorted(slots, key=lambda s: s.valid_from)
        self._lock = threading.Lock()
        self._owner = threading.get_ident()
        self._serving = deferred
        self._requests: deque[tuple[Callable[[], None], _Reply | None]] = deque()
        self._requests_cond = threading.Condition(threading.Lock())

    @property
    def held(self) -> int:
        """Slots this reservation still holds, unspent."""
        with self._lock:
            return len(self._slots)

    def spend(self, cancel: threading.Event | None = None) -> None:
        """Spend one held slot - the earliest, waiting for its time; when none is left valid, take a
        fresh one from the budget (through the owner's thread)."""
        budget = self._budget
        while True:
            with self._lock:
                slot = self._slots.pop(0) if self._slots else None
            if slot is None:
                self.acquire(cancel)
                return
            if budget._wait_for(slot, cancel):
                with budget._cond:
                    budget._slots_spent += 1
                budget._local.seq = slot.seq
                return

    # --- what the client asks of its budget, from a fetch thread -------------------------------

    def acquire(self, cancel: threading.Event | None = None) -> None:
        """A slot beyond the reserved ones (a retry): leased by the owner's thread if need be."""
        got: list[int] = []
        self._on_owner(lambda: got.append(self._budget.acquire_seq(cancel)), wait=True)
        if got:
            self._budget._local.seq = got[0]

    def observe(self, seen: RateObservation) -> None:
        """`Budget.observe` from a fetch thread: a note it owes is written by the owner's thread."""
        self._budget.observe(seen, note=self.note_rate_limited)

    def note_rate_limited(self, scope: Literal["burst", "near", "daily", "share"], retry_after: float) -> None:
        """`Budget.note_rate_limited` from a fetch thread: this process pauses at once, and the row
        write owed to the other workers is left to the owner's thread."""
        pending = self._budget.note_locally(scope, retry_after)
        if pending is not None:
            self._on_owner(lambda: self._budget.write_note(pending), wait=False)

    def _on_owner(self, fn: Callable[[], None], *, wait: bool) -> None:
        reply = _Reply() if wait else None
        with self._requests_cond:
            direct = threading.get_ident() == self._owner or not self._serving
            if not direct:
                self._requests.append((fn, reply))
                self._requests_cond.notify_all()
        if direct:
            fn()
        elif reply is not None:
            reply.wait()

    # --- on the owner's thread -----------------------------------------------------------------

    def serve(self, futures: Sequence[Future[Any]], poll: float = 0.05) -> None:
        """Run the fetch threads' budget requests here until every future is done."""
        with self._requests_cond:
            self._serving = True
        for f in futures:  # a finished fetch wakes the owner at once, not at its next poll
            f.add_done_callback(self._wake)
        failed: BaseException | None = None
        try:
            while True:
                with self._requests_cond:
                    if not self._requests:
                        if all(f.done() for f in futures):
                            break
                        self._requests_cond.wait(poll)
                        continue
                    fn, reply = self._requests.popleft()
                self._run_request(fn, reply)
        except BaseException as e:
            failed = e
            raise
        finally:
            self._stop_serving(failed is not None)

    def _stop_serving(self, failed: bool) -> None:
        """No more deferring: what is queued runs now (the notes), or - when the owner failed -
        the waiting fetch threads are let go with BudgetCancelled."""
        with self._requests_cond:
            self._serving = False
            left, self._requests = list(self._requests), deque()
        for fn, reply in left:
            if failed and reply is not None:
                reply.fail(BudgetCancelled())  # nobody will serve it: let the fetch thread unwind
            else:
                self._run_request(fn, reply)

    def _wake(self, _future: Future[Any]) -> None:
        with self._requests_cond:
            self._requests_cond.notify_all()

    @staticmethod
    def _run_request(fn: Callable[[], None], reply: _Reply | None) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the fetch thread that asked
            if reply is None:
                log.warning("could not tell the other workers of a rate limit: %s", type(e).__name__)
            else:
                reply.fail(e)
            if not isinstance(e, Exception):
                raise
        else:
            if reply is not None:
                reply.ok()

    def release(self) -> None:
        """Give the unspent slots back to the budget (they are not lost rate) and stop serving
        fetch threads; idempotent."""
        if self._serving:  # deferred but never served (the round failed before): let go
            self._stop_serving(True)
        with self._lock:
            slots, self._slots = self._slots, []
        self._budget._give_back(slots)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
