"""The source's rate-limit budget: slots scheduled centrally in chunks, spent locally at their time.

One row in `source_budgets` per source account - not per tenant: two tenants importing one account
share its allowance, and so do every lane thread, fetch thread and worker process. A worker leases
a *chunk* of up to C slots with one statement under the row lock, spends them in-process, and
reports what the responses said (`source.RateObservation`) on its next lease: one statement per
chunk, plus a write when every worker must know something at once (a burst 429, a spent day).

The guarantee, and why it holds (the rate the source allows, not 0.55 of it)
-------------------------------------------------------------------------------------
The source counts requests in a *rolling* window of W seconds (2 s) and refuses a request when L
were accepted within the W seconds before it. The row remembers the times of the account's last L
granted slots (`recent`, migration 0024) and schedules every slot *individually*:

* A slot may be sent only within [s_j, s_j + ttl] (`lease_ttl`; unsent, it expires), and the
  request reaches the source's counter at most `latency_margin` m after the check that let it go
  (m bounds the jitter of the one-way delay and the client's own time from check to socket: a
  constant delay shifts every request alike and changes no count). So it arrives in
  [s_j, s_j + d] with d = ttl + m, and the requests that arrive in any window (t - W, t] hold
  slots with s_j in (t - W - d, t], a half-open interval of length W + d.
* A lease of C slots (database clock, under the row lock) gives each the earliest time at or after
  `max(now, paused_until)` that is at least W + d after the L-th slot granted before it, by any
  process (`budget_slots`). So L + 1 slots never fit in W + d: never more than the limit, summed
  over every worker sharing the account, at any alignment of the window. The sustained rate is
  L / (W + d): with ttl = 0.05 s and m = 0.075 s, 0.94 of the allowed L / W.
* Into the first half of a window slots come at once: as many of a chunk as threads wait for
  start together (a read-ahead of 14 pages does not wait 14 x g, g = (W + d) / L); the rest,
  spares, are spread g apart, and fewer are leased once spares expire unsent (an unsent slot still
  takes the window's room). Once L / 2 slots lie within W + d before it, a slot comes g after the
  one before: a busy account's slots are even (bursts filling whole windows measured 0.75 of the
  allowed rate against 0.94). Each slot is also more than d after the B-th before it (`lag`,
  B = `burst_slots`): what the daily share's proof below needs. Every request to the account must
  take a slot - one sent beside the budget is one beyond L in a window the schedule filled.
* Every worker maps a database time onto its own monotonic clock conservatively: the database read
  its clock between `before` and `after` (local) of a lease statement, so the offset between the
  clocks lies in [before - db_now, after - db_now]; the tightest of the last 10 s of leases, each
  widened by 500 ppm of drift per second since, gives [lo, hi], and slot j is valid locally from
  `s_j + hi` to `s_j + lo + ttl` - an interval inside [s_j, s_j + ttl] on the database's clock. A
  slow statement only shortens slots' lives (they expire unspent: lost rate, never an extra
  request), and one fast lease in ten seconds is enough to keep them whole. A fetch round's
  `reserve(n)` holds n *scheduled* slots; each fetch thread waits for its locally.

Self-correction from what the source says
-----------------------------------------
The proof assumes the account's token is spent only through this row. What the source reports
corrects it when that is not so (another integration on the same token, a jitter beyond m). The
provider's client reads it into a `RateObservation` (Pipedrive: the `x-ratelimit-*` headers):

* a `limit` lower than configured lowers the limit in force at the next lease.
* `remaining` 0 on an accepted request: the window was full when it arrived. This process holds
  off until the window resets (`reset`, capped at W), and every worker slows down before the
  source has to refuse anything: `rate_scale` drops to 0.9 of what was in force (one row write
  per process per window at most).
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
  counts every request that reached the source before it; slots numbered below k - lag (lag = B)
  arrived before slot k did (they are more than d earlier), so they are in R.
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
  the new one: taken, it parked the account for the whole new day). Before the source has
  reported a limit nothing is known and nothing is held back.
* A share of 1 (the whole budget) leaves the source to say when the day is spent: no share
  check, and the park's exact wait comes from the daily 429's `Retry-After`. (A share below 1
  parks on the `daily_reset` rule instead, so that rule must not be early: an early resume spends
  up to a chunk per worker of the old day before the reports park it again.)
* A daily 429 (the budget spent by everyone together) parks every worker with the exact wait
  (`Retry-After`, `daily_reason = 'spent'`). A parked worker raises `RateLimitParked` at once and
  its task parks until the reset instead of burning attempts on a wait measured in hours;
  `budget_waiting.waiting_state(db, account)` says why and until when, for the run's status.

Statements: `budget_row.py`; a fetch round's slots: `budget_reservation.py`; status: `budget_waiting.py`.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from engine_core.budget_reservation import Reservation
from engine_core.budget_row import CREATE_SQL, LEASE_SQL, PARK_SQL, PAUSE_SQL, BudgetStats, PendingNote, Slot, seconds_to_utc_midnight
from engine_core.config import daily_token_share
from engine_core.db import Database
from engine_core.errors import BudgetCancelled, RateLimitParked
from engine_core.source import RateObservation

log = logging.getLogger(__name__)

POLL = 0.1  # how often a waiter looks at its cancel event
OFFSET_MEMORY = 10.0  # seconds of lease round trips that bound this process's clock offset
CLOCK_DRIFT = 5e-4  # the most two clocks drift apart per second (NTP slews at most 500 ppm)
MAX_TOKEN_COST = 80  # the largest x-token-cost in Pipedrive's spec (/v1/deals/summary/archived)


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
        burst_slots: int = 16,
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
        if chunk < 1 or burst_slots < 1:
            raise ValueError(f"chunk and burst_slots must be >= 1, got {chunk} and {burst_slots}")
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
        self.burst_slots = burst_slots
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
        self._slots: list[Slot] = []  # held, sorted by valid_from
        self._leasing = False
        self._wanting = 0  # slots asked for by threads in `_take` now
        self._reported_limit: int | None = None
        self._gap = self.spacing()  # seconds between the last lease's spare slots
        self._spares = self.lease_size() - 1  # slots a lease holds beyond the waiting threads'
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
        """B: slots that may still be on their way when a later slot's response reports - the
        schedule keeps slot k more than d after slot k - B (`burst_slots`, at least ceil(d/g)+1,
        at most L): also the most slots that start within d of each other."""
        limit = self.limit if limit is None else limit
        least = math.ceil((self.lease_ttl + self.latency_margin) / self.spacing(limit)) + 1
        return min(limit, max(least, self.burst_slots))

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
            if self.spend_slot(slot, cancel):
                return slot.seq

    def spend_slot(self, slot: Slot, cancel: threading.Event | None = None) -> bool:
        """Wait for `slot`'s time, count it spent and tie this thread's next `observe` to it; False
        when it lapsed unsent. Raises BudgetCancelled on a stop, RateLimitParked when parked."""
        if not self._wait_for(slot, cancel):
            return False
        with self._cond:
            self._slots_spent += 1
        self.mark_seq(slot.seq)
        return True

    def mark_seq(self, seq: int) -> None:
        """Make slot number `seq` this thread's: the daily report of its next `observe` is tied to it."""
        self._local.seq = seq

    def reserve(self, n: int, *, cancel: threading.Event | None = None, deferred: bool = False) -> Reservation:
        """Hold n scheduled slots for a fetch round, so the fetch threads spend them with no database.

        `deferred`: from now until `serve` returns (or `release`), whatever else the fetch threads
        need of the budget waits for this thread's `serve` (see `Reservation`).
        """
        return Reservation(self, self._take(n, cancel), deferred=deferred)

    def _wait_for(self, slot: Slot, cancel: threading.Event | None) -> bool:
        """Wait until the slot's time (and any pause); True when it is then still valid to send."""
        while True:
            with self._cond:
                self._check(cancel)
                now = self._clock()
                start = max(slot.valid_from, self._paused_until)
                if now >= start:
                    if now <= slot.expires_at:
                        return True
                    self._lapsed(1)
                    return False
                if start > slot.expires_at:
                    self._lapsed(1)  # a pause outlives the slot
                    return False
            wait = min(start - now, POLL if cancel is not None else 1.0)
            if cancel is not None:
                if cancel.wait(wait):
                    raise BudgetCancelled()
            else:
                time.sleep(wait)

    def _take(self, n: int, cancel: threading.Event | None) -> list[Slot]:
        """Take the n earliest held slots, leasing chunks as needed: a held slot further than one of
        the last lease's gaps away is not waited for while fewer than a chunk are held - a lease
        starts the waiting threads' slots at once, window permitting."""
        if not 1 <= n <= self.lease_size():
            raise ValueError(f"can hold 1..{self.lease_size()} slots at once, asked for {n}")
        taken: list[Slot] = []
        with self._cond:
            self._wanting += n  # a lease starts as many slots at once as threads wait for
        try:
            while len(taken) < n:
                i_lease = False
                with self._cond:
                    self._check(cancel)
                    now = self._clock()
                    self._drop_expired(max(now, self._paused_until))  # a paused process leases after the pause
                    need, soon = n - len(taken), self._soon(now)
                    k = min(need, len(self._slots)) if soon >= need or len(self._slots) >= self.lease_size() else soon
                    self._spares = min(self.lease_size() - 1, self._spares + sum(s.spare for s in self._slots[:k]))
                    self._wanting -= k
                    taken.extend(self._slots[:k])
                    del self._slots[:k]
                    if len(taken) >= n:
                        break
                    wait: float | None = None  # None: until another thread's lease lands
                    if now < max(self._not_before, self._paused_until):
                        wait = max(self._not_before, self._paused_until) - now
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
            self.give_back(taken)
            raise
        finally:
            with self._cond:
                self._wanting -= n - len(taken)
        return taken

    def _soon(self, now: float) -> int:
        """Under the lock: held slots valid within one gap of the last lease's spares from now."""
        soon = max(now, self._paused_until) + self._gap
        return next((i for i, slot in enumerate(self._slots) if slot.valid_from > soon), len(self._slots))

    def _wait_time(self, wait: float | None, cancel: threading.Event | None) -> float:
        limit = POLL if cancel is not None else 1.0
        return limit if wait is None else max(0.0, min(wait, limit))

    def _drop_expired(self, now: float) -> None:
        kept = [s for s in self._slots if s.expires_at > now]
        self._lapsed(len(self._slots) - len(kept))
        self._slots = kept

    def _lapsed(self, n: int) -> None:
        """Under the lock: n slots expired unsent - and the next leases hold as many fewer spares."""
        self._slots_expired += n
        self._spares = max(0, self._spares - n)

    def give_back(self, slots: list[Slot]) -> None:
        """Take unspent `slots` back into this process's held ones (a lapsed one counts as expired)."""
        if not slots:
            return
        with self._cond:
            now = self._clock()
            for slot in slots:
                if slot.expires_at > now:
                    self._slots.append(slot)
                else:
                    self._lapsed(1)
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
            ready = max(1, min(self.lease_size(limit), self._wanting - self._soon(self._clock())))
            size = min(self.lease_size(limit), ready + self._spares)  # spares that expired are not leased again
            report = self._report
            params: dict[str, Any] = {
                "source": self.source,
                "account": self.account,
                "spacing": self.spacing(limit),
                "burst_limit": limit,
                "chunk": size,
                "ready": ready,
                "horizon": self.horizon,
                "gap": self.lease_ttl + self.latency_margin + 1e-5,
                "half": max(1, limit // 2),
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
            first = int(row["first_seq"])
            lo, hi = self._offset(before, after, float(row["db_now"]))
            if hi - lo > self.lease_ttl / 2:
                log.debug("budget lease for %s/%s: clock offset known to %.3fs of a %.3fs ttl", self.source, self.account, hi - lo, self.lease_ttl)
            self._gap = max([b - a for a, b in zip(row["slots"], row["slots"][1:])] + [self.spacing(limit)]) + 1e-6
            for j, s in enumerate(row["slots"]):
                self._slots.append(Slot(s + hi, s + lo + self.lease_ttl, first + j, spare=j >= ready))
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
        return self.db.sql(sql, params, prepare=True)  # the lease and its kin: one text each, every request

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
