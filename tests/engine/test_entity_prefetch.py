"""The entity path: a walk's next page asked ahead (`prefetch.Prefetch`) while the current
one is written. Only a cache: the successor's identical request takes the answer once, a retried
one asks the source again, an answer asked ahead that failed or expired is asked again, and a page
never crosses runs (one store per database and run). Real HTTP (a local server); the budget on real Postgres."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.prefetch import Prefetch, prefetch_store
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.models import Run


class Source:
    """A v2 list of ids 1..n, pages of `limit` by cursor (the cursor is the last id served);
    records every request; answers 500 while `failing`."""

    def __init__(self, n: int = 6) -> None:
        self.n = n
        self.requests: list[str] = []
        self.failing = False
        self.status = 400  # what a failing source answers (400: not retried by the client)
        self.lock = threading.Lock()


@pytest.fixture()
def source() -> Iterator[tuple[Source, str]]:
    state = Source()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            from urllib.parse import parse_qs, urlsplit

            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            with state.lock:
                state.requests.append(self.path)
            if state.failing:
                self.send_response(state.status)
                body: dict[str, Any] = {"success": False, "error": "bad request"}
            else:
                after, limit = int(q.get("cursor", 0)), int(q["limit"])
                ids = list(range(after + 1, min(state.n, after + limit) + 1))
                more = bool(ids) and ids[-1] < state.n
                body = {"success": True, "data": [{"id": i} for i in ids],
                        "additional_data": {"next_cursor": str(ids[-1]) if more else None}}
                self.send_response(200)
            data = json.dumps(body).encode()
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


PATH = "/api/v2/persons"


def _until(state: Source, n: int) -> None:
    """Wait (up to 10 s) until the source has seen `n` requests: a request asked ahead is in flight."""
    done = threading.Event()
    for _ in range(1000):
        if len(state.requests) >= n:
            return
        done.wait(0.01)


def test_a_page_asked_ahead_is_taken_once_by_the_identical_request(source) -> None:
    state, url = source
    with PipedriveClient(url, "t0ken", prefetch=Prefetch()) as client:
        first = client.list_v2(PATH, cursor=None, limit=2)
        client.prefetch_v2(PATH, cursor=first.next_cursor, limit=2)
        client.prefetch_v2(PATH, cursor=first.next_cursor, limit=2)  # asked twice: one request
        second = client.list_v2(PATH, cursor=first.next_cursor, limit=2)
        assert [r["id"] for r in second.rows] == [3, 4] and second.next_cursor == "4"
        assert len(state.requests) == 2, "the second page came from the request asked ahead"
        again = client.list_v2(PATH, cursor=first.next_cursor, limit=2)  # a retry: the source again
        assert [r["id"] for r in again.rows] == [3, 4] and len(state.requests) == 3
        client.prefetch_v2(PATH, cursor="4", limit=3)  # another limit is another request
        client.list_v2(PATH, cursor="4", limit=2)
        _until(state, 5)
        assert len(state.requests) == 5


def test_a_failed_or_expired_answer_is_asked_again(source) -> None:
    state, url = source
    now = [0.0]
    store = Prefetch(ttl=5.0, clock=lambda: now[0])
    with PipedriveClient(url, "t0ken", prefetch=store, max_retries=0) as client:
        state.failing = True
        client.prefetch_v2(PATH, limit=2)
        _until(state, 1)
        state.failing = False
        assert [r["id"] for r in client.list_v2(PATH, limit=2).rows] == [1, 2], "asked again after the failure"
        assert len(state.requests) == 2
        client.prefetch_v2(PATH, cursor="2", limit=2)
        _until(state, 3)
        state.n = 3  # the source changed; the answer asked ahead is too old to take
        now[0] = 6.0
        assert [r["id"] for r in client.list_v2(PATH, cursor="2", limit=2).rows] == [3]
        assert len(state.requests) == 4


def test_the_catch_ups_walk_takes_no_page_asked_for_an_earlier_phase(source) -> None:
    # a parent's list is proved whole only by pages listed after every child page of the walks
    # (walk_proof): a v1 list's first page is the same request in its walk and in the catch-up's,
    # and one asked ahead for the walk and not taken would stand for the catch-up's listing
    state, url = source
    store = Prefetch()
    with PipedriveClient(url, "t0ken", prefetch=store) as client:
        client.prefetch_v2(PATH, limit=2)
        _until(state, 1)
        store.cut(9)  # the catch-up (phase 9) starts its walk in this process
        state.n = 1  # the source changed since that page was asked
        assert [r["id"] for r in client.list_v2(PATH, limit=2).rows] == [1], "the page asked before the cut is dropped"
        assert len(state.requests) == 2
        client.prefetch_v2(PATH, cursor="1", limit=2)  # the catch-up's own page asked ahead
        _until(state, 3)
        store.cut(9)  # another catch-up task of the same phase keeps it
        assert list(client.list_v2(PATH, cursor="1", limit=2).rows) == [] and len(state.requests) == 3


def test_a_page_asked_ahead_is_tried_once_and_its_taker_retries(source) -> None:
    # A background request that retried would sleep out the client's backoffs on a thread that
    # the interpreter joins at exit, after its run has ended; the taker has the retries.
    state, url = source
    state.failing, state.status = True, 500
    with PipedriveClient(url, "t0ken", prefetch=Prefetch(), max_retries=3) as client:
        client.prefetch_v2(PATH, limit=2)
        _until(state, 1)
        threading.Event().wait(1.0)  # the client's first backoff is at most 0.5 s: a retry would be here
        assert len(state.requests) == 1, "asked once ahead"
        state.failing = False
        assert [r["id"] for r in client.list_v2(PATH, limit=2).rows] == [1, 2]
        assert len(state.requests) == 2


def test_a_runs_lanes_share_one_store_and_runs_do_not(source, db) -> None:
    state, url = source

    def run(run_id: int) -> Run:
        return Run.from_row({"id": run_id, "tenant_id": "t", "source": "pipedrive", "source_account": "a",
                             "status": "running", "current_phase": 0, "plan": [], "options": {"base_url": url},
                             "dry_run": False, "cancel_requested": False})

    lane_a = PipedriveProvider(run(9101), token="t0ken").client(db)
    lane_b = PipedriveProvider(run(9101), token="t0ken").client(db)
    other = PipedriveProvider(run(9102), token="t0ken").client(db)
    lane_a.prefetch_v2(PATH, limit=2)
    assert [r["id"] for r in lane_b.list_v2(PATH, limit=2).rows] == [1, 2]
    assert len(state.requests) == 1, "lane b took lane a's page"
    other.prefetch_v2(PATH, limit=2)
    _until(state, 2)
    lane_a.list_v2(PATH, limit=2)
    assert len(state.requests) == 3, "another run's page is not taken"
    stranger = PipedriveProvider(run(9101), token="an0ther").client(db)
    lane_a.prefetch_v2(PATH, cursor="2", limit=2)
    _until(state, 4)
    stranger.list_v2(PATH, cursor="2", limit=2)
    assert len(state.requests) == 5, "a page asked under other credentials is not served"
    assert lane_a._prefetch is lane_b._prefetch and lane_a._prefetch is not other._prefetch
    assert lane_a._prefetch is not stranger._prefetch and prefetch_store((db.url, 9101)) is not lane_a._prefetch
