"""The entity path: a lane with nothing to claim is woken when its process enqueues work
(`topup.WORK`), instead of sleeping out its poll interval - a discovery's walkers start together
on the idle lanes. Real Postgres, real lane threads; the idle lanes poll every 60 s here, and the
walkers wait for one another (a barrier that breaks after 10 s), so only the wake-up can pass."""
from __future__ import annotations

import threading

from engine_core import runs
from engine_core.context import TaskContext
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.registry import register, for_run
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
