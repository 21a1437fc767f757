"""Listing pages asked ahead (`Prefetch`): one store per run and database in a process
(`prefetch_store`), shared by the run's clients.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from engine_core.providers.pipedrive.decode import Envelope

if TYPE_CHECKING:
    from engine_core.providers.pipedrive.client import PipedriveClient

log = logging.getLogger(__name__)


def answer_of(future: Future, cancel: threading.Event | None) -> tuple[bool, Any]:
    """(True, the result of `future`), waited for in steps of 0.2 s; (False, None) when `cancel`
    is set while waiting or the future failed - a request asked ahead is only a cache, and its
    taker then asks the source itself, with the client's retries."""
    while True:
        try:
            return True, future.result(timeout=0.2)
        except TimeoutError:
            if cancel is not None and cancel.is_set():
                return False, None
        except BaseException:  # noqa: BLE001 - whatever failed, the taker asks again
            return False, None


class Prefetch:
    """Listing pages asked ahead: a task that knows the request its successor will make
    (the walk's next page) asks it on a background thread while it writes its own page, and the
    successor's identical request takes the answer instead of going to the source.

    Only a cache: a successor's checkpoint, cursor and ledger are its own, and a page nobody took
    (the successor ran in another process, the run stopped) is dropped after `ttl` seconds or
    when `keep` newer ones are held. One store per run and database in a process (the provider's
    clients of one run share it, whichever lane thread runs the successor), so a page never
    crosses runs. An answer is taken once: a retried task asks the source again. A failed
    prefetch is forgotten and the successor asks the source itself, with the client's retries.
    The background request goes through the same budget as any other (and is counted in the
    successor's stats when taken)."""

    TAKEN_KEPT = 1024  # requests remembered as taken (never asked ahead again in this run)
    # Round trips from which a page's parents are asked ahead (`slow`): below it the task's own probe
    # costs less than mapping the page a second time to find them (a page of 500 rows: 50-100 ms of
    # CPU; the sandbox with no latency answers a page in ~40 ms).
    SLOW = 0.1

    def __init__(self, *, keep: int = 32, ttl: float = 20.0, threads: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.ttl = ttl
        self.clock = clock
        self.asked = self.taken = self.held = 0
        self._lock = threading.Lock()
        self._pages: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, Future]] = OrderedDict()
        self._taken: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], None] = OrderedDict()
        self._open = -1  # the latest phase a task of which ran in this process
        self.cut_at = -1  # the catch-up's phase, once its walk started here (`cut`)
        self._waiting: list[tuple[int, Callable[[], None]]] = []
        self._uncounted: dict[str, list[int]] = {}
        self.round_trip: float | None = None  # seconds, a moving average of the pages asked ahead
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prefetch")

    @staticmethod
    def key(path: str, query: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
        """A request's identity: its path and its query as sorted (name, value) strings, so two
        equal queries built in another order find the same page."""
        return path, tuple(sorted((str(k), str(v)) for k, v in query.items()))

    def ask(self, client: PipedriveClient, path: str, query: Mapping[str, Any],
            then: Callable[[dict[str, Any]], None] | None = None, *, once: bool = False) -> None:
        """Start `client`'s GET of `path` with `query` now, unless it is asked already - or, `once`,
        was taken in this run (asked from an answer's `then`, which may run after the task that
        asks it took it: asking again would only cost a request). `then(body)` runs on the store's
        threads once the answer is here (at once when it is held already), never for a failed one;
        what it raises is dropped (it only asks ahead)."""
        key = self.key(path, query)
        with self._lock:
            self._expire()
            if once and key in self._taken:
                return
            entry = self._pages.get(key)
            future: Future = Future() if entry is None else entry[1]
            if entry is None:
                self._pages[key] = (self.clock(), future)
                self.asked += 1
        if then is not None:
            future.add_done_callback(lambda done: self._then(done, then))
        if entry is not None:
            return
        try:
            self._pool.submit(self._fetch, client, path, dict(query), future)
        except RuntimeError:  # the interpreter is shutting down: nothing asked ahead
            with self._lock:
                self._pages.pop(key, None)

    WAITING_KEPT = 64  # jobs waiting for their phase (the oldest dropped: only a cache)

    def when_open(self, phase: int, job: Callable[[], None]) -> None:
        """Run `job` on the store's threads once a task of `phase` has run in this process (at once
        when one has: `opened`): work that may only start when the phases before it are closed.
        A job whose phase never opens here (it runs in another process) never runs."""
        with self._lock:
            ready = phase <= self._open
            if not ready:
                self._waiting.append((phase, job))
                del self._waiting[:-self.WAITING_KEPT]
        if ready:
            self._submit(job)

    def opened(self, phase: int) -> None:
        """A task of `phase` runs: the phases before it are closed; their waiting jobs start."""
        with self._lock:
            if phase <= self._open:
                return
            self._open = phase
            ready = [job for p, job in self._waiting if p <= phase]
            self._waiting = [(p, job) for p, job in self._waiting if p > phase]
        for job in ready:
            self._submit(job)

    def cut(self, phase: int) -> None:
        """The catch-up's walk starts here (its `phase`): every page held now was asked for an
        earlier phase's walk and must not stand for a page of this one - a parent's list is proved
        whole only by pages listed after every child page of the walks (`walk_proof`), and a v1
        list's first page asks the same request in both. Drops them, once a phase."""
        with self._lock:
            if phase <= self.cut_at:
                return
            self.cut_at = phase
            self._pages.clear()

    def count(self, kind: str, requests: int, tokens: int) -> None:
        """Requests made ahead for `kind`'s tasks (and their tokens), for one of them to count."""
        with self._lock:
            spent = self._uncounted.setdefault(kind, [0, 0])
            spent[0] += requests
            spent[1] += tokens

    def uncounted(self, kind: str) -> tuple[int, int]:
        """The requests and tokens asked ahead for `kind` that no task counted yet, now counted."""
        with self._lock:
            requests, tokens = self._uncounted.pop(kind, [0, 0])
        return requests, tokens

    def _submit(self, job: Callable[[], None]) -> None:
        try:
            self._pool.submit(_quietly, job)
        except RuntimeError:  # the interpreter is shutting down
            pass

    def _then(self, done: Future, then: Callable[[dict[str, Any]], None]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        body = done.result()
        self._submit(lambda: then(body))

    def _fetch(self, client: PipedriveClient, path: str, query: dict[str, Any], future: Future) -> None:
        started = time.monotonic()
        try:
            body = client._call(path, query, cancel=None, ahead=True)
        except BaseException as e:  # noqa: BLE001 - kept for the taker, who asks again
            future.set_exception(e)
            return
        took = time.monotonic() - started
        with self._lock:
            self.round_trip = took if self.round_trip is None else 0.7 * self.round_trip + 0.3 * took
        future.set_result(body)

    def slow(self) -> bool:
        """Whether the source's round trips (the pages asked ahead: a moving average, pacing waits
        included) take `SLOW` seconds or more - what asking a page's parents ahead is for."""
        with self._lock:
            return self.round_trip is not None and self.round_trip >= self.SLOW

    def hold(self, path: str, query: Mapping[str, Any], body: dict[str, Any]) -> None:
        """Hold `body`, an answer already received and paid for, for one later identical request
        (a discovery's page that is the whole list, for the walker it seeds). The taker's page
        says `kept` (its task does not count the request again); expires like any page."""
        kept = Envelope(body)
        kept.kept = True
        future: Future = Future()
        future.set_result(kept)
        with self._lock:
            self._expire()
            self._pages[self.key(path, query)] = (self.clock(), future)
            self.held += 1

    def forget(self, path: str, query: Mapping[str, Any]) -> None:
        """Drop the page held or asked for this request, if any."""
        with self._lock:
            self._pages.pop(self.key(path, query), None)

    def take(self, path: str, query: Mapping[str, Any], cancel: threading.Event | None) -> dict[str, Any] | None:
        """The answer asked ahead for this exact request (waiting for it while in flight), once;
        None when none was asked, it expired, it failed, or `cancel` was set while waiting."""
        key = self.key(path, query)
        with self._lock:
            self._expire()
            entry = self._pages.pop(key, None)
            if entry is not None:  # taken from now on: an `ask(once=True)` meanwhile would ask it again
                self._taken[key] = None
                while len(self._taken) > self.TAKEN_KEPT:
                    self._taken.popitem(last=False)
        if entry is None:
            return None
        answered, body = answer_of(entry[1], cancel)
        if not answered:  # the taker asks the source itself
            return None
        if not getattr(body, "kept", False):
            with self._lock:
                self.taken += 1
        return body

    def _expire(self) -> None:
        now = self.clock()
        while self._pages:
            key, (at, _) = next(iter(self._pages.items()))
            if now - at <= self.ttl and len(self._pages) <= self.keep:
                break
            self._pages.popitem(last=False)


def _quietly(job: Callable[[], None]) -> None:
    try:
        job()
    except Exception:  # noqa: BLE001 - asking ahead is only a cache: the task asks for itself
        log.debug("asking ahead failed", exc_info=True)


_prefetch_stores: OrderedDict[tuple[Any, ...], Prefetch] = OrderedDict()
_prefetch_lock = threading.Lock()
PREFETCH_RUNS_KEPT = 8


def prefetch_store(scope: tuple[Any, ...]) -> Prefetch:
    """The process's store of pages asked ahead for one run (`scope`: database URL, run id, and
    whatever else must match for a page to be served - the provider's credentials)."""
    with _prefetch_lock:
        store = _prefetch_stores.get(scope)
        if store is None:
            store = _prefetch_stores[scope] = Prefetch()
            while len(_prefetch_stores) > PREFETCH_RUNS_KEPT:
                _, old = _prefetch_stores.popitem(last=False)
                old._pool.shutdown(wait=False)
        _prefetch_stores.move_to_end(scope)
        return store
