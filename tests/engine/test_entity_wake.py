"""The entity path: a lane with nothing to claim is woken when its process enqueues work
(`topup.WORK`), instead of sleeping out its poll interval - a discovery's walkers start together
on the idle lanes. Real Postgres, real lane threads; the idle lanes poll every 60 s here, and the
walkers wait for one another (a barrier that breaks after 10 s), so only the wake-up can pass.
And only as many lanes are woken as tasks were enqueued: a page's successor wakes one idle lane,
not every one (each wake-up costs a claim and a look on the database)."""
from __future__ import annotations

import threading
import time

from engine_core import claim, runs
from engine_core.context import TaskContext
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.registry import register, for_run
from engine_core.topup import WorkSignal
from engine_core.worker import Worker
from tests.engine.support import FAST, task_rows

WALKERS = 3
_met = threading.Barrier(WALKERS)


class DiscoveryProvider:
    """One discovery task seeding WALKERS walkers, each of which waits for all the others."""

    source = "test-wake"

    def __init__(self, run: Run | None = None) -> None:
        pass

    def phases(self) -> list[list[str]]:
        return [["things"]]

    def account(self) -> str:
        return "wake-account"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        return [Successor("things:discover", {"discover": True})]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        if ctx.task.cursor.get("discover"):
            return TaskOutcome(tuple(Successor(f"things:{i}", {"i": i}) for i in range(WALKERS)))
        _met.wait(10)  # BrokenBarrierError (the task fails) unless every walker runs at once
        return TaskOutcome()


register("test-wake", DiscoveryProvider)


def test_idle_lanes_are_woken_for_a_discoverys_walkers(db) -> None:
    _met.reset()
    run = runs.start_run(db, DiscoveryProvider(), "acme", settings=FAST)
    results: list = []

    def lane() -> None:
        results.append(Worker(db, settings=FAST, providers=for_run).drain(run.id, poll_seconds=60.0))

    lanes = [threading.Thread(target=lane, name=f"lane-{i}", daemon=True) for i in range(WALKERS)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join(45)
    assert not any(t.is_alive() for t in lanes), "the lanes finished"
    tasks = task_rows(db, run.id)
    assert sorted((t["cursor_key"], t["status"]) for t in tasks) == [
        ("things:0", "succeeded"), ("things:1", "succeeded"), ("things:2", "succeeded"), ("things:discover", "succeeded")]
    assert runs.get_run(db, run.id).status == "succeeded"


class PageProvider:
    """One task whose successor is the next page: the serial entity path in miniature. The first
    page waits until both other lanes have looked and found nothing (they are idle); the second
    records how many claims were made while it ran."""

    source = "test-page"
    idle_looks = threading.Event()
    claims_during_second_page: list[int] = []
    claims: list[int] = [0]

    def __init__(self, run: Run | None = None) -> None:
        pass

    def phases(self) -> list[list[str]]:
        return [["pages"]]

    def account(self) -> str:
        return "page-account"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        return [Successor("pages:1", {"page": 1})]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        if ctx.task.cursor["page"] == 1:
            assert self.idle_looks.wait(10), "the two other lanes looked"
            return TaskOutcome((Successor("pages:2", {"page": 2}),))
        time.sleep(0.5)  # room for a wrongly woken idle lane to claim (it would within milliseconds)
        self.claims_during_second_page.append(self.claims[0])
        return TaskOutcome()


register("test-page", PageProvider)


def test_a_pages_successor_wakes_one_idle_lane_not_all(db, monkeypatch) -> None:
    PageProvider.idle_looks.clear()
    PageProvider.claims_during_second_page.clear()
    PageProvider.claims[0] = 0
    lock = threading.Lock()
    real_claim_next = claim.claim_next

    def counted(*args, **kwargs):
        got = real_claim_next(*args, **kwargs)
        with lock:
            PageProvider.claims[0] += 1
            if PageProvider.claims[0] == 3:  # the first page's claim and two idle lanes' empty looks
                PageProvider.idle_looks.set()
        return got

    monkeypatch.setattr(claim, "claim_next", counted)
    run = runs.start_run(db, PageProvider(), "acme", settings=FAST)

    def lane() -> None:
        Worker(db, settings=FAST, providers=for_run).drain(run.id, poll_seconds=60.0)

    lanes = [threading.Thread(target=lane, name=f"lane-{i}", daemon=True) for i in range(3)]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join(45)
    assert not any(t.is_alive() for t in lanes), "the lanes finished (the run's end wakes them all)"
    assert runs.get_run(db, run.id).status == "succeeded"
    # three looks before the second page, then its claim by the one idle lane woken and the first
    # lane's look after its bookkeeping; every idle lane woken would make it 6
    assert PageProvider.claims_during_second_page == [5]


def test_an_announce_between_a_lanes_look_and_its_wait_is_not_missed() -> None:
    signal = WorkSignal()
    seen = signal.generation()  # the lane looks for work (finds none) ...
    signal.announce(7, 1)  # ... a task of its run is enqueued before it waits
    signal.announce(8, 1)
    assert signal.wait(seen, 5.0, run_id=7), "the permit announced after its look wakes it"
    assert not signal.wait(seen, 0.01, run_id=7), "one task, one wake-up"
    later = signal.generation()
    signal.looked_empty(8, later)  # a look after run 8's task: that task was taken, the permit is stale
    signal.announce(7, 1)
    assert not signal.wait(later, 0.01, run_id=8), "run 7's task wakes none of run 8's lanes"
    signal.notify()
    assert signal.wait(later, 5.0, run_id=8), "a phase's end wakes every lane"
