"""An early task of the next phase (cursor `early`: it only reads the source and hands on
tasks of its own phase, like a discovery) is seeded with the phase before it and runs on a lane
that phase's tail leaves free; what it hands on waits for the barrier like any task of its phase.
Real Postgres, real lane threads: phase 0's one task is held open while the lanes drain.
"""
from __future__ import annotations

import threading
import time

from engine_core import runs
from engine_core.context import TaskContext
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.registry import register, for_run
from engine_core.worker import drain_threads
from tests.engine.support import FAST, task_rows

HOLD = threading.Event()  # phase 0's task runs until this is set
EVENTS: list[tuple[str, int]] = []  # (what ran, the run's phase when it started)
_lock = threading.Lock()


class EarlyProvider:
    """Phase 0: one task held open. Phase 1: an early discovery seeding two walkers."""

    source = "test-early"

    def __init__(self, run: Run | None = None) -> None:
        pass

    def phases(self) -> list[list[str]]:
        return [["first"], ["second"]]

    def account(self) -> str:
        return "early-account"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        if kind == "first":
            return [Successor("first:0", {})]
        return [Successor("second:discover", {"discover": True, "early": True})]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        phase = runs.get_run(ctx.db, ctx.run.id).current_phase
        with _lock:
            EVENTS.append((ctx.task.cursor_key, phase))
        if ctx.task.kind == "first":
            HOLD.wait(30)
            return TaskOutcome()
        if ctx.task.cursor.get("discover"):
            return TaskOutcome((Successor("second:a", {}), Successor("second:b", {})))
        return TaskOutcome()


register("test-early", EarlyProvider)


def test_the_next_phases_discovery_runs_during_the_phases_tail_and_its_walkers_wait_for_the_barrier(db) -> None:
    HOLD.clear()
    EVENTS.clear()
    run = runs.start_run(db, EarlyProvider(), "acme", settings=FAST)
    lanes = threading.Thread(target=lambda: drain_threads(db, run.id, width=2, settings=FAST, providers=for_run), daemon=True)
    lanes.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done = {t["cursor_key"]: t["status"] for t in task_rows(db, run.id)}
            if done.get("second:discover") == "succeeded":
                break
            time.sleep(0.05)
        tasks = {t["cursor_key"]: t for t in task_rows(db, run.id)}
        assert tasks["second:discover"]["status"] == "succeeded", "the early discovery waited for the barrier"
        assert tasks["first:0"]["status"] == "running", "phase 0 is still open"
        assert tasks["second:discover"]["phase"] == 1
        assert {tasks[k]["status"] for k in ("second:a", "second:b")} == {"pending"}, "walkers wait for the barrier"
        assert runs.get_run(db, run.id).current_phase == 0
    finally:
        HOLD.set()
    lanes.join(30)
    assert not lanes.is_alive()
    assert runs.get_run(db, run.id).status == "succeeded"
    assert dict(EVENTS) == {"first:0": 0, "second:discover": 0, "second:a": 1, "second:b": 1}
