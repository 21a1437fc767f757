"""Listing pages asked ahead (`Prefetch`): one store per run and database in a process
(`prefetch_store`), shared by the run's clients.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from engine_core.providers.pipedrive.decode import Envelope

if TYPE_CHECKING:
    from engine_core.providers.pipedrive.client import PipedriveClient


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

    def __init__(self, *, keep: int = 16, ttl: float = 20.0, threads: int = 8, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep = keep
        self.ttl = ttl
        self.clock = clock
        self.asked = self.taken = self.held = 0
        self._lock = threading.Lock()
        self._pages: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, Future]] = OrderedDict()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prefetch")

    @staticmethod
    def key(path: str, query: Mapping[str, Any]) -> tuple[str, tuple[tuple[str, str], ...]]:
        """A request's identity: its path and its query as sorted (name, value) strings, so two
        equal queries built in another order find the same page."""
        return path, tuple(sorted((str(k), str(v)) for k, v in query.items()))

    def ask(self, client: PipedriveClient, path: str, query: Mapping[str, Any]) -> None:
        """Start `client`'s GET of `path` with `query` now, unless it is asked already."""
        key = self.key(path, query)
        with self._lock:
            self._expire()
            if key in self._pages:
                return
            future: Future = Future()
            self._pages[key] = (self.clock(), future)
            self.asked += 1
        try:
            self._pool.submit(self._fetch, client, path, dict(query), future)
        except RuntimeError:  # the interpreter is shutting down: nothing asked ahead
            with self._lock:
                self._pages.pop(key, None)

    @staticmethod
    def _fetch(client: PipedriveClient, path: str, query: dict[str, Any], future: Future) -> None:
        try:
            future.set_result(client._call(path, query, cancel=None, ahead=True))
        except BaseException as e:  # noqa: BLE001 - kept for the taker, who asks again
            future.set_exception(e)

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
        if entry is None:
            return None
        future = entry[1]
        while True:
            try:
                body = future.result(timeout=0.2)
            except TimeoutError:
                if cancel is not None and cancel.is_set():
                    return None
                continue
            except BaseException:  # noqa: BLE001 - the taker asks the source itself
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


_prefetch_stores: OrderedDict[tuple[str, int], Prefetch] = OrderedDict()
_prefetch_lock = threading.Lock()
PREFETCH_RUNS_KEPT = 8


def prefetch_store(scope: tuple[str, int]) -> Prefetch:
    """The process's store of pages asked ahead for one run (`scope`: database URL, run id)."""
    with _prefetch_lock:
        store = _prefetch_stores.get(scope)
        if store is None:
            store = _prefetch_stores[scope] = Prefetch()
            while len(_prefetch_stores) > PREFETCH_RUNS_KEPT:
                _, old = _prefetch_stores.popitem(last=False)
                old._pool.shutdown(wait=False)
        _prefetch_stores.move_to_end(scope)
        return store
