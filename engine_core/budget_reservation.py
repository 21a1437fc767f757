"""A fetch round's reserved rate-limit slots, and the fetch threads' only door to the budget.

The task's thread reserves n scheduled slots (`Budget.reserve`); its fetch threads spend them with no
database, and what needs the database (a slot beyond the reserved ones, a 429's note to the other
workers) is handed to the task's thread, which `serve`s it while it joins the round.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal

from engine_core.errors import BudgetCancelled
from engine_core.source import RateObservation

if TYPE_CHECKING:
    from engine_core.budget import Budget
    from engine_core.budget_row import Slot

log = logging.getLogger(__name__)


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

    def __init__(self, budget: Budget, slots: list[Slot], *, deferred: bool = False) -> None:
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
            if budget.spend_slot(slot, cancel):
                return

    @property
    def waiting(self) -> int:
        """Fetch threads' requests queued for the owner's thread, not yet served."""
        with self._requests_cond:
            return len(self._requests)

    # --- what the client asks of its budget, from a fetch thread -------------------------------

    def acquire(self, cancel: threading.Event | None = None) -> None:
        """A slot beyond the reserved ones (a retry): leased by the owner's thread if need be."""
        got: list[int] = []
        self._on_owner(lambda: got.append(self._budget.acquire_seq(cancel)), wait=True)
        if got:
            self._budget.mark_seq(got[0])

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
        self._budget.give_back(slots)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

