"""The source's rate-limit budget, leased centrally in chunks and spent locally.

One row in `source_budgets` per source account - not per tenant: two tenants importing one account
share its allowance, and so do every lane thread, fetch thread and worker process. A worker leases
a *chunk* of slots with one statement under the row lock, spends them in-process (thread-safe, no
database), and reports what the response headers said on its next lease. The hot path never writes
the row per request: one statement per chunk, plus a write only when something happens that every
worker must know at once (a 429, the daily budget spent).

The guarantee, and why it holds
-------------------------------
The source counts requests in a *rolling* window of W seconds (2 s) and refuses the (L+1)-th. Handing
out L slots per fixed W-second window would allow 2L across a window boundary, so the row keeps a
token bucket instead, in its GCRA form: one timestamp `tat`, the earliest start of the next chunk.

* A lease of a chunk of C slots starts at `start = max(now, tat, paused_until)` and moves `tat` to
  `start + C / r`: chunk starts are at least C / r apart, whoever leases them.
* A slot may be spent only within [start, start + ttl] (it expires unspent after that); the source
  sees it within that interval plus the network's one-way delay, bounded by a `latency_margin` m.
* So the requests the source sees in any window [t, t + W] come from chunks that started within
  [t - ttl - m, t + W], an interval of H = W + ttl + m. At most H*r/C + 1 chunk starts fit in it,
  i.e. at most H*r + C slots. With r = (L - C) / H that is exactly L: never more than the limit,
  summed over every worker sharing the account, at any alignment of the window.

Chunk starts are on the database's clock (`clock_timestamp()` under the row lock), so processes on
different machines agree. Each worker maps a start onto its own monotonic clock conservatively:
a slot becomes valid after the lease statement returned (`after + delay`) and expires counted from
before it was sent (`before + delay + ttl`), so the local validity interval lies inside the
database's. A lease may start in the future (a queue of at most `max_ahead` seconds): the worker
waits locally rather than polling the row, so a refused lease costs no statement in steady state.

The cost is headroom: the sustained rate is (L - C) / (W + ttl + m), not L / W. With L = 80, C = 8,
ttl = 1 s and m = 0.25 s that is 22 requests/s against the source's 40; a shorter `lease_ttl` buys
rate at the price of more expired slots when a worker is slow to spend. Statements on the row:
one per C requests (C = 8: 125 per 1,000), plus one per burst 429 or daily exhaustion.

Reconcile
---------
`observe(headers)` keeps what the responses say: `x-ratelimit-limit` lowers the limit in force when
the plan's is lower than configured (taking effect at the next lease), `x-ratelimit-remaining: 0`
pauses this process until the window resets, and the `x-daily-ratelimit-token-*` values ride along
on the next lease statement. A burst 429 (`note_rate_limited("burst", wait)`) writes `paused_until`
once, so no worker leases before the window has emptied. A spent daily budget (a daily 429, or
remaining at or below `daily_floor`) writes `daily_reset_at`; from then on this process's slots are
refused at once and every other worker's next lease raises `RateLimitParked` without calling the
source - the task parks until the reset instead of burning attempts on a wait measured in hours.
A daily 429 carries the exact wait (`Retry-After`); a 200 that merely reports 0 tokens left does
not say when the day ends, so it parks for `daily_probe_seconds`, after which one request learns
the exact reset from the 429 it gets (a refused request costs no tokens). Other processes learn of
a park at their next lease: their slots already in hand (at most one chunk, at most `lease_ttl`
old) may still meet a daily 429, which parks them with the exact wait.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal

from engine_core.db import Database, query
from engine_core.errors import RateLimitParked, TaskStopped

log = logging.getLogger(__name__)

POLL = 0.1  # how often a waiter looks at its cancel event

# The statements are named queries in sql/queries.sql (budget_lease, budget_create, budget_pause,
# budget_park); each is counted by `BudgetStats`.


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


@dataclass
class _Lease:
    """A chunk held locally (mutable: `left` goes down as slots are taken)."""

    valid_from: float
    expires_at: float
    left: int


class Budget:
    """A source account's rate-limit budget: lease chunks from the row, spend them locally."""

    def __init__(
        self,
        db: Database,
        source: str,
        account: str,
        *,
        burst_limit: int = 80,
        window_seconds: float = 2.0,
        chunk: int = 8,
        lease_ttl: float = 1.0,
        latency_margin: float = 0.25,
        max_ahead: float = 5.0,
        daily_floor: int = 0,
        daily_probe_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if burst_limit < 2:
            raise ValueError(f"burst_limit must be >= 2, got {burst_limit}")
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        if window_seconds <= 0 or lease_ttl <= 0 or latency_margin < 0 or max_ahead < 0:
            raise ValueError("window_seconds and lease_ttl must be > 0; latency_margin and max_ahead >= 0")
        self.db = db
        self.source = source
        self.account = account
        self.burst_limit = burst_limit
        self.window_seconds = window_seconds
        self.chunk = chunk
        self.lease_ttl = lease_ttl
        self.latency_margin = latency_margin
        self.max_ahead = max_ahead
        self.daily_floor = daily_floor
        self.daily_probe_seconds = daily_probe_seconds
        self._clock = clock
        self._cond = threading.Condition(threading.Lock())
        self._leases: list[_Lease] = []
        self._leasing = False
        self._row_ready = False
        self._reported_limit: int | None = None
        self._paused_until = -math.inf  # local: no slot is spent before this
        self._row_paused_until = -math.inf  # what this process last wrote to the row
        self._parked_until = -math.inf  # local: the daily budget is spent until this
        self._not_before = -math.inf  # a refused lease: the queue was longer than max_ahead
        self._daily_remaining: int | None = None
        self._daily_limit: int | None = None
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
        """Slots per lease: the configured chunk, at most a quarter of the limit.

        The sustained rate is (L - C) / (W + ttl + m): a chunk near the limit would starve it (on
        the Essential plan's 20 per 2 s, C = 8 leaves 3.7/s, C = 5 leaves 4.6/s).
        """
        limit = self.limit if limit is None else limit
        return max(1, min(self.chunk, limit // 4))

    def spacing(self, limit: int | None = None) -> float:
        """Seconds between chunk starts: C / r with r = (L - C) / (W + ttl + margin)."""
        limit = self.limit if limit is None else limit
        size = self.lease_size(limit)
        horizon = self.window_seconds + self.lease_ttl + self.latency_margin
        return size * horizon / (limit - size)

    def stats(self) -> BudgetStats:
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
        """Take one slot for a request about to be sent; blocks until one is held."""
        self._take(1, cancel)
        with self._cond:
            self._slots_spent += 1

    def reserve(self, n: int, *, cancel: threading.Event | None = None, deferred: bool = False) -> Reservation:
        """Hold n slots for a fetch round, so the fetch threads spend them with no database.

        `deferred`: from now until `serve` returns (or `release`), whatever else the fetch threads
        need of the budget waits for this thread's `serve` (see `Reservation`).
        """
        return Reservation(self, self._take(n, cancel), deferred=deferred)

    def _take(self, n: int, cancel: threading.Event | None) -> list[float]:
        """Take n currently valid slots; returns their expiry times (local clock)."""
        if not 1 <= n <= self.lease_size():
            raise ValueError(f"can hold 1..{self.lease_size()} slots at once, asked for {n}")
        taken: list[float] = []
        try:
            while len(taken) < n:
                i_lease = False
                with self._cond:
                    self._check(cancel)
                    now = self._clock()
                    self._drop_expired(now)
                    wait: float | None = None  # None: until another thread's lease lands
                    if now < self._paused_until:
                        wait = self._paused_until - now
                    else:
                        taken.extend(self._take_valid(n - len(taken), now))
                        if len(taken) >= n:
                            break
                        upcoming = [l for l in self._leases if l.valid_from > now and l.left > 0]
                        if sum(l.left for l in upcoming) >= n - len(taken):
                            wait = min(l.valid_from for l in upcoming) - now
                        elif now < self._not_before:
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

    def _take_valid(self, want: int, now: float) -> list[float]:
        out: list[float] = []
        # Earliest-expiring first, so a slot is spent before it can go to waste.
        for lease in sorted(self._leases, key=lambda l: l.expires_at):
            if want <= 0:
                break
            if lease.valid_from <= now and lease.left > 0:
                k = min(want, lease.left)
                lease.left -= k
                want -= k
                out.extend([lease.expires_at] * k)
        self._leases = [l for l in self._leases if l.left > 0]
        return out

    def _drop_expired(self, now: float) -> None:
        kept = []
        for lease in self._leases:
            if lease.expires_at <= now:
                self._slots_expired += lease.left
            else:
                kept.append(lease)
        self._leases = kept

    def _give_back(self, expiries: list[float]) -> None:
        if not expiries:
            return
        with self._cond:
            now = self._clock()
            for expiry in expiries:
                if expiry > now:
                    self._leases.append(_Lease(valid_from=now, expires_at=expiry, left=1))
                else:
                    self._slots_expired += 1
            self._cond.notify_all()

    def _check(self, cancel: threading.Event | None) -> None:
        """Under the lock: a stop request or a parked daily budget ends the wait."""
        if cancel is not None and cancel.is_set():
            raise BudgetCancelled()
        now = self._clock()
        if now < self._parked_until:
            raise RateLimitParked(self._parked_until - now)

    # --- the row ------------------------------------------------------------------------------

    def _lease(self) -> None:
        """One statement: lease a chunk (or learn that the account is parked). Called unlocked."""
        with self._cond:
            limit = self.limit
            size = self.lease_size(limit)
            params: dict[str, Any] = {
                "source": self.source,
                "account": self.account,
                "spacing": self.spacing(limit),
                "burst_limit": limit,
                "chunk": size,
                "max_ahead": self.max_ahead,
                "daily_remaining": self._daily_remaining,
                "daily_limit": self._daily_limit,
            }
        before = self._clock()
        rows = self._run("budget_lease", params)
        if not rows:
            self._create_row(limit)
            before = self._clock()
            rows = self._run("budget_lease", params)
        after = self._clock()
        row = rows[0]
        with self._cond:
            if row["parked"]:
                self._parked_until = max(self._parked_until, before + float(row["daily_wait"] or 0.0))
                return
            delay = max(0.0, float(row["delay"]))
            if not row["granted"]:
                # The queue is longer than max_ahead: come back when it is not, without asking.
                self._not_before = after + delay - self.max_ahead
                return
            self._writes += 1
            self._lease_count += 1
            self._slots_leased += size
            # delivered, unless a newer report arrived meanwhile (it rides on the next lease)
            if self._daily_remaining == params["daily_remaining"]:
                self._daily_remaining = None
            if self._daily_limit == params["daily_limit"]:
                self._daily_limit = None
            valid_from = after + delay
            expires_at = before + delay + self.lease_ttl
            if expires_at - valid_from < self.lease_ttl / 4:
                log.warning("budget lease for %s/%s took %.2fs of a %.2fs ttl", self.source, self.account, after - before, self.lease_ttl)
            self._leases.append(_Lease(valid_from=valid_from, expires_at=expires_at, left=size))

    def _create_row(self, limit: int) -> None:
        self._run("budget_create", {
            "source": self.source,
            "account": self.account,
            "burst_limit": limit,
            "window_seconds": self.window_seconds,
        })
        with self._cond:
            self._writes += 1

    def _run(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with self._cond:
            self._statements += 1
        return self.db.sql(query(name), params)

    # --- what the source said -----------------------------------------------------------------

    def observe(self, headers: Mapping[str, str], note: Callable[[Literal["burst", "daily"], float], None] | None = None) -> None:
        """Keep what a response's rate-limit headers say (no database unless the day is spent; then
        `note`, default `note_rate_limited`, tells the other workers)."""
        h = {k.lower(): v for k, v in headers.items()}
        limit = _int(h.get("x-ratelimit-limit"))
        remaining = _int(h.get("x-ratelimit-remaining"))
        reset = _float(h.get("x-ratelimit-reset"))
        daily_remaining = _int(h.get("x-daily-ratelimit-token-remaining"))
        daily_limit = _int(h.get("x-daily-ratelimit-token-limit"))
        with self._cond:
            if limit is not None and limit >= 2 and limit != self._reported_limit:
                if self._reported_limit is None or limit < self.limit:
                    log.info("%s/%s: the source reports a burst limit of %d", self.source, self.account, limit)
                self._reported_limit = limit
            if remaining is not None and remaining <= 0 and reset is not None:
                # The window is full (someone else spends this token too): hold off locally.
                self._paused_until = max(self._paused_until, self._clock() + min(reset, self.window_seconds))
            if daily_remaining is not None:
                self._daily_remaining = daily_remaining
            if daily_limit is not None:
                self._daily_limit = daily_limit
        if daily_remaining is not None and daily_remaining <= self.daily_floor:
            wait = _float(h.get("x-daily-ratelimit-reset"))
            (note or self.note_rate_limited)("daily", wait if wait is not None else self.daily_probe_seconds)

    def note_rate_limited(self, scope: Literal["burst", "daily"], retry_after: float) -> None:
        """A 429 (or a spent daily budget): tell every worker sharing the account, once."""
        pending = self.note_locally(scope, retry_after)
        if pending is not None:
            self.write_note(pending)

    def note_locally(self, scope: Literal["burst", "daily"], retry_after: float) -> PendingNote | None:
        """The in-process half of `note_rate_limited`: this process pauses (or parks) at once. Returns
        the row write still owed to the other workers, or None when the row already says as much."""
        retry_after = max(0.0, float(retry_after))
        now = self._clock()
        with self._cond:
            if scope == "daily":
                if now + retry_after <= self._parked_until + 0.5:
                    return None  # already parked at least that long: no second write
                self._parked_until = now + retry_after
                statement = "budget_park"
            else:
                self._paused_until = max(self._paused_until, now + retry_after)
                if now + retry_after <= self._row_paused_until + 0.25:
                    return None  # this pause is already on the row
                self._row_paused_until = now + retry_after
                statement = "budget_pause"
            self._cond.notify_all()
        return PendingNote(statement, now + retry_after)

    def write_note(self, note: PendingNote) -> None:
        """The row half: one statement, for the time still left of the wait."""
        wait = max(0.0, note.until - self._clock())
        self._run(note.statement, {"source": self.source, "account": self.account, "wait": wait})
        with self._cond:
            self._writes += 1


@dataclass(frozen=True)
class PendingNote:
    statement: str  # budget_pause | budget_park
    until: float  # local clock


class _Reply:
    """A fetch thread's request to the reservation's owner, answered."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: BaseException | None = None

    def ok(self) -> None:
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    def wait(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


class Reservation:
    """Slots held for a fetch round: spending one is local; unspent ones go back on `release()`.

    It is also the fetch threads' only door to the budget, so that they never touch the database.
    What needs it - a slot beyond the reserved ones (a retried request, or held slots that lapsed)
    and telling the other workers of a 429 - is handed to the thread that made the reservation (the
    task's), which `serve`s such requests while it joins the round; a 429's pause takes effect in
    this process at once, and the row hears of it from the task's thread moments later. A
    reservation made `deferred` holds such requests from the start (a fetch thread may need one
    before its owner reaches `serve`); otherwise, and on the owner's own thread, the budget is
    called directly.
    """

    def __init__(self, budget: Budget, expiries: list[float], *, deferred: bool = False) -> None:
        self._budget = budget
        self._expiries = sorted(expiries)
        self._lock = threading.Lock()
        self._owner = threading.get_ident()
        self._serving = deferred
        self._requests: deque[tuple[Callable[[], None], _Reply | None]] = deque()
        self._requests_cond = threading.Condition(threading.Lock())

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._expiries)

    def spend(self, cancel: threading.Event | None = None) -> None:
        """Spend one held slot; when none is left valid, take a fresh one from the budget."""
        budget = self._budget
        with budget._cond:
            budget._check(cancel)
            paused = budget._paused_until - budget._clock()
        if paused > 0:
            # A burst 429 since the reservation: the held slots may lapse while the window empties.
            if cancel is not None:
                if cancel.wait(paused):
                    raise BudgetCancelled()
            else:
                time.sleep(paused)
        now = budget._clock()
        with self._lock:
            while self._expiries and self._expiries[0] <= now:
                self._expiries.pop(0)
                with budget._cond:
                    budget._slots_expired += 1
            slot = self._expiries.pop(0) if self._expiries else None
        if slot is None:
            self.acquire(cancel)
            return
        with budget._cond:
            budget._slots_spent += 1

    # --- what the client asks of its budget, from a fetch thread -------------------------------

    def acquire(self, cancel: threading.Event | None = None) -> None:
        """A slot beyond the reserved ones (a retry): leased by the owner's thread if need be."""
        self._on_owner(lambda: self._budget.acquire(cancel), wait=True)

    def observe(self, headers: Mapping[str, str]) -> None:
        self._budget.observe(headers, note=self.note_rate_limited)

    def note_rate_limited(self, scope: Literal["burst", "daily"], retry_after: float) -> None:
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
        if self._serving:  # deferred but never served (the round failed before): let go
            self._stop_serving(True)
        with self._lock:
            expiries, self._expiries = self._expiries, []
        self._budget._give_back(expiries)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(float(raw))
    except ValueError:
        return None


def _float(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None
