"""Issue 11: a catch-up task's pages are fetched ahead by a reader thread of its own
(`inventory.ReadAhead`) while the task compares and writes the page before - and only the reading
moves. Pinned here, on a real sandbox (pages capped at 15 rows) and real Postgres:

* the outcome is the walk in line's: the same ledger rows, inventory, per-task stats and requests
  (the sandbox's own count) as the same catch-up fetching every page in line, on the same account
  changed before the catch-up, every page taken from the reader;
* a page fetched ahead is only ever used for the cursor it was fetched for;
* a task stopped mid-walk leaves no reader thread behind, and the walk lists no page twice;
* a fetch that fails in the reader fails the task where the fetch in line would, with the same
  error, its cursor on the failed page; a 429 is retried inside the reader, as in line.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from engine_core.context import TaskContext
from engine_core.errors import TaskStopped
from engine_core.providers.pipedrive import inventory
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import TransientHTTPError
from engine_core.worker import Worker, drain_threads
from tests.pipedrive.support import FAST, TOKEN, failed_tasks, sandbox, start

ALL = ["organizations", "persons", "deals", "deals_archived", "leads", "leads_archived", "activities", "notes"]
TWO = ["organizations", "persons"]
# the stats a catch-up task's outcome shows (not its timings)
OUTCOME_STATS = ("requests", "tokens", "inventory_listed", "unchanged", "deleted_at_source", "delete_candidates",
                 "imported", "updated", "already_here", "skipped", "failed", "matched", "mail_deals")


class InLine:
    """The walk fetching every page in line: `ReadAhead`'s interface, no thread."""

    def __init__(self, client: Any, run: Any, cursor: Any, since: str | None, pages: int, cancel: Any = None,
                 **_: Any) -> None:
        self.taken = self.in_line = 0

    def step(self, meter: inventory.Meter, cursor: dict[str, Any], since: str | None) -> inventory.Step:
        self.in_line += 1
        return inventory.list_step(meter, cursor["list"], cursor, since)

    def close(self) -> None:
        pass


@contextmanager
def readers(monkeypatch: pytest.MonkeyPatch, kind: type) -> Iterator[list[Any]]:
    """Catch-up tasks use `kind` as their reader; yields every reader made."""
    made: list[Any] = []

    class Recorded(kind):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            made.append(self)

    with monkeypatch.context() as m:
        m.setattr(inventory, "ReadAhead", Recorded)
        yield made


def _reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("catchup-read")]


def _ledger(db, tenant: str) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = db.sql("SELECT kind, source_id, action, source_version, deleted_at_source IS NOT NULL AS gone, reason"
                  " FROM migration_records WHERE tenant_id = %(t)s", {"t": tenant})
    return {(r["kind"], r["source_id"]): (r["action"], r["source_version"], r["gone"], r["reason"]) for r in rows}


def _inventory(db, run_id: int) -> set[tuple[str, str]]:
    return {(r["kind"], r["source_id"]) for r in db.sql(
        "SELECT kind, source_id FROM migration_inventory WHERE migration_id = %(r)s", {"r": run_id})}


def _catchup_tasks(db, run_id: int) -> dict[str, tuple[str, dict[str, int]]]:
    rows = db.sql("SELECT cursor_key, status, stats FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'catchup'",
                  {"r": run_id})
    return {r["cursor_key"]: (r["status"], {k: v for k, v in r["stats"].items() if k in OUTCOME_STATS or "@" in k})
            for r in rows}


def _listing_requests(sb: Any) -> int:
    """Answered list requests the sandbox served (its own count)."""
    codes = sb.stats()["status_codes"]
    return sum(c.get("200", 0) for path, c in codes.items() if "{" not in path)


def test_the_catchup_with_its_pages_read_ahead_ends_as_the_walk_in_line(db, monkeypatch) -> None:
    """Two tenants walk the same account up to the catch-up; the account changes (creates,
    updates, deletes, archive flips, merges); one catch-up reads ahead, the other fetches in line.
    Tasks of 4 pages: the walk crosses lists and hands on to successor tasks."""
    monkeypatch.setattr(inventory, "PAGES_PER_TASK", 4)
    with sandbox(page_cap=15, live_mix="create:3,update:6,delete:1,archive:1,unarchive:0.5,merge:0.5") as sb:
        runs_ = {"ahead": start(db, sb, "ahead", kinds=ALL), "inline": start(db, sb, "inline", kinds=ALL)}
        for run in runs_.values():
            Worker(db, settings=FAST).drain(run.id, until_phase_closed=len(run.plan) - 2)
        changes = sb.live_step(40)
        assert {c["op"] for c in changes} >= {"update", "delete", "create"}, changes
        made: dict[str, list[Any]] = {}
        served: dict[str, int] = {}
        for name, kind in (("ahead", inventory.ReadAhead), ("inline", InLine)):
            run = runs_[name]
            sb.reset_stats()
            with readers(monkeypatch, kind) as made[name]:
                drain_threads(db, run.id, width=4, settings=FAST)
            served[name] = _listing_requests(sb)
            assert db.sql("SELECT status FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["status"] == "succeeded", \
                failed_tasks(db, run.id)
        truth = sb.truth()["ids"]

    ahead, inline = runs_["ahead"], runs_["inline"]
    assert _ledger(db, "ahead") == _ledger(db, "inline")
    assert _inventory(db, ahead.id) == _inventory(db, inline.id)
    assert {sid for k, sid in _inventory(db, ahead.id) if k == "persons"} == {str(i) for i in truth["persons"]}
    tasks = _catchup_tasks(db, ahead.id)
    assert tasks == _catchup_tasks(db, inline.id)
    assert len([k for k in tasks if ":p" in k and ":mail:" not in k]) >= 4, sorted(tasks)
    # the catch-up had real work: rows changed before it were written, deletions marked
    assert sum(s.get("updated", 0) + s.get("imported", 0) for _, s in tasks.values()) > 0, tasks
    assert sum(s.get("deleted_at_source", 0) for _, s in tasks.values()) > 0, tasks
    # every request counted, once: the tasks' counts are the sandbox's, the same in line
    assert served["ahead"] == served["inline"] == sum(s.get("requests", 0) for k, (_, s) in tasks.items()
                                                       if ":deletes" not in k)
    # and the reader did read ahead: every page of the walk was taken from it
    assert sum(r.taken for r in made["ahead"]) == served["ahead"] and not any(r.in_line for r in made["ahead"])
    assert sum(r.in_line for r in made["inline"]) == served["inline"]
    assert not _reader_threads()


def test_a_page_read_ahead_is_only_used_for_the_cursor_it_was_fetched_for(db) -> None:
    with sandbox(page_cap=15) as sb:
        run = start(db, sb, "acme", kinds=TWO)
        client = inventory.CountingClient(PipedriveClient(sb.base_url, TOKEN))
        in_line = inventory.Meter(PipedriveClient(sb.base_url, TOKEN), {})
        persons = {"list": "persons", "page": 0}
        reader = inventory.ReadAhead(client, run, persons, None, 3)
        try:
            asked = {"list": "organizations", "page": 0}  # not the page the reader walks from
            step = reader.step(inventory.Meter(client, {}), asked, None)
            expected = inventory.list_step(in_line, "organizations", asked)
            assert [r["id"] for r in step.rows] == [r["id"] for r in expected.rows], "a persons page served as organizations"
            assert step.after == expected.after
            assert (reader.taken, reader.in_line) == (0, 1)
        finally:
            reader.close()
        assert not _reader_threads()

        reader = inventory.ReadAhead(client, run, persons, None, 3)
        try:
            first = reader.step(inventory.Meter(client, {}), persons, None)
            assert first.after is not None
            second_at = inventory.page_task("persons", 1, first.after).cursor
            second = reader.step(inventory.Meter(client, {}), second_at, None)
            want = [inventory.list_step(in_line, "persons", c) for c in (persons, second_at)]
            assert [[r["id"] for r in s.rows] for s in (first, second)] == [[r["id"] for r in s.rows] for s in want]
            assert (reader.taken, reader.in_line) == (2, 0)
        finally:
            reader.close()
        assert not _reader_threads()


def test_a_catchup_task_stopped_mid_walk_leaves_no_reader_thread_and_lists_no_page_twice(db, monkeypatch) -> None:
    listed: list[tuple[str, str]] = []
    real_step = inventory.list_step

    def list_step(meter, kind, at, since=None):
        listed.append((kind, str(at.get("cursor"))))
        return real_step(meter, kind, at, since)

    stops: list[int] = []
    real_stop = TaskContext.stop_point

    def stop_point(self: TaskContext) -> None:  # the walk's second page done: the task is stopped there
        if self.task.kind == "catchup" and "list" in self.task.cursor and not stops:
            row = self.db.sql("SELECT cursor FROM migration_tasks WHERE id = %(i)s", {"i": self.task.id})[0]
            if row["cursor"].get("page", 0) >= 2 or row["cursor"]["list"] != "organizations":
                stops.append(self.task.id)
                raise TaskStopped()
        return real_stop(self)

    left_behind: list[list[str]] = []
    real_run_page = inventory.run_page

    def run_page(ctx, client, mapper_of):
        try:
            return real_run_page(ctx, client, mapper_of)
        finally:  # the task is over: its reader must be too
            left_behind.append([n for n in _reader_threads() if n == f"catchup-read:{ctx.task.id}"])

    monkeypatch.setattr(inventory, "list_step", list_step)
    monkeypatch.setattr(TaskContext, "stop_point", stop_point)
    monkeypatch.setattr(inventory, "run_page", run_page)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = start(db, sb, "acme", kinds=TWO)
        Worker(db, settings=FAST).drain(run.id, until_phase_closed=len(run.plan) - 2)
        with readers(monkeypatch, inventory.ReadAhead) as made:
            drain_threads(db, run.id, width=4, settings=FAST)
    assert db.sql("SELECT status FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["status"] == "succeeded"
    assert len(stops) == 1 and len(left_behind) >= 2
    assert left_behind == [[]] * len(left_behind), left_behind
    assert made[0].taken < len(listed), "the stopped task's reader had read ahead of it"
    assert len(listed) == len(set(listed)), f"a page was listed twice: {listed}"
    assert _inventory(db, run.id) == {(k, str(i)) for k in TWO for i in truth[k]}
    assert not _reader_threads()


@pytest.mark.parametrize("reader", [inventory.ReadAhead, InLine], ids=["ahead", "in-line"])
def test_a_fetch_failing_in_the_reader_fails_the_task_as_the_fetch_in_line(db, monkeypatch, reader: type) -> None:
    """The persons' second page fails (a 503 the client gave up on): the task fails with that error,
    its cursor on that page, the pages before it compared; the retry lists the page again."""
    failed: list[str] = []
    real_step = inventory.list_step

    def list_step(meter, kind, at, since=None):
        if kind == "persons" and at.get("page") == 1 and not failed:
            failed.append(str(at.get("cursor")))
            raise TransientHTTPError(method="GET", path="/api/v2/persons", status=503)
        return real_step(meter, kind, at, since)

    seen: list[tuple[str, Any, Any]] = []  # (what run_page raised, the task's cursor then, reader threads)
    real_run_page = inventory.run_page

    def run_page(ctx, client, mapper_of):
        try:
            return real_run_page(ctx, client, mapper_of)
        except BaseException as e:
            cursor = ctx.db.sql("SELECT cursor FROM migration_tasks WHERE id = %(i)s", {"i": ctx.task.id})[0]["cursor"]
            seen.append((f"{type(e).__name__}: {e}", cursor, _reader_threads()))
            raise

    monkeypatch.setattr(inventory, "list_step", list_step)
    monkeypatch.setattr(inventory, "run_page", run_page)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = start(db, sb, "acme", kinds=TWO)
        Worker(db, settings=FAST).drain(run.id, until_phase_closed=len(run.plan) - 2)
        with readers(monkeypatch, reader):
            drain_threads(db, run.id, width=4, settings=FAST)
    assert db.sql("SELECT status FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["status"] == "succeeded"
    assert len(failed) == 1 and len(seen) == 1, seen
    error, cursor, threads = seen[0]
    assert error == f"TransientHTTPError: {TransientHTTPError(method='GET', path='/api/v2/persons', status=503)}"
    assert cursor["list"] == "persons" and cursor["page"] == 1 and str(cursor.get("cursor")) == failed[0]
    assert threads == []
    assert _inventory(db, run.id) == {(k, str(i)) for k in TWO for i in truth[k]}


def test_a_429_on_a_page_read_ahead_is_retried_by_the_reader_as_in_line(db, monkeypatch) -> None:
    """The sandbox's burst window is cut to one request a second for the catch-up: its pages are answered
    429 and asked again after the wait (`Retry-After`), inside the reader; every page counted once."""
    threads: list[str] = []
    real_step = inventory.list_step

    def list_step(meter, kind, at, since=None):
        threads.append(threading.current_thread().name)
        return real_step(meter, kind, at, since)

    monkeypatch.setattr(inventory, "list_step", list_step)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = start(db, sb, "acme", kinds=TWO)
        Worker(db, settings=FAST).drain(run.id, until_phase_closed=len(run.plan) - 2)
        sb.configure(burst_limit=1, burst_window_seconds=1.0)
        sb.reset_stats()
        drain_threads(db, run.id, width=4, settings=FAST)
        stats = sb.stats()
    assert db.sql("SELECT status FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["status"] == "succeeded", \
        failed_tasks(db, run.id)
    assert stats["rate_limited"]["burst"] > 0, stats["rate_limited"]
    # waited out as in line (the client's Retry-After wait, in the reader): no task gave up on a page
    attempts = db.sql("SELECT cursor_key, attempts, error FROM migration_tasks WHERE migration_id = %(r)s"
                      " AND kind = 'catchup'", {"r": run.id})
    assert all(t["attempts"] == 1 for t in attempts), attempts
    assert threads and all(t.startswith("catchup-read") for t in threads), threads
    tasks = _catchup_tasks(db, run.id)
    answered = sum(c.get("200", 0) for path, c in stats["status_codes"].items() if "{" not in path)
    assert answered == len(threads) == sum(s.get("requests", 0) for _, s in tasks.values()), (answered, threads, tasks)
    assert _inventory(db, run.id) == {(k, str(i)) for k in TWO for i in truth[k]}
    assert not _reader_threads()
