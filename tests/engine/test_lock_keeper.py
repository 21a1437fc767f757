"""A live worker keeps its task's lock fresh whatever it waits on.

Pinned: a task blocked in its provider for three times MIGRATE_STALE_LOCK_SECONDS keeps its lock
(a reaper with that threshold, sweeping all along, releases nothing) and its keeper ends with the
task; a task whose lock is taken while it waits learns it from its keeper, stops, and writes
nothing (its checkpoint is fenced), leaving the task to its new holder.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from engine_core import claim, reaper, runs
from engine_core.config import Settings
from engine_core.context import TaskContext
from engine_core.errors import TaskStopped
from engine_core.models import Run, Successor, Task, TaskOutcome
from engine_core.providers.registry import register, for_run
from engine_core.worker import Worker
from tests.engine.support import task_rows

THRESHOLD = 1.0
SETTINGS = Settings(lane_width=1, stale_lock_seconds=THRESHOLD, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)


class Sleeper:
    """One task that waits `nap` seconds (stopping if asked) and then checkpoints offset 1."""

    source = "sleeper"

    def __init__(self, run: Run | None = None) -> None:
        self.options = dict(run.options) if run else {}

    def phases(self) -> list[list[str]]:
        return [["naps"]]

    def account(self) -> str:
        return "sleeper-account"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        return [Successor("nap:0", {})]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        deadline = time.monotonic() + float(ctx.run.options["nap"])
        while time.monotonic() < deadline:  # a slow source, a 429 wait, a budget wait...
            if ctx.should_stop():
                raise TaskStopped()
            time.sleep(0.02)
        with ctx.db.transaction() as tx:
            ctx.checkpoint(tx, 1)
        return TaskOutcome()


register("sleeper", Sleeper)


def _claim(db, run_id: int, worker: Worker) -> tuple[Task, Run]:
    claimed = claim.claim_next(db, run_id, worker.worker_id)
    assert claimed is not None
    return claimed


def _keepers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lock-keeper-")]


def test_a_task_blocked_three_thresholds_keeps_its_lock(db) -> None:
    run = runs.start_run(db, Sleeper(), "acme", options={"nap": 3 * THRESHOLD}, settings=SETTINGS)
    worker = Worker(db, settings=SETTINGS, providers=for_run)
    task, current = _claim(db, run.id, worker)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(result=worker.run_claimed(task, current)))
    t.start()
    released: list[int] = []
    while t.is_alive():  # the reaper sweeps with the very threshold the worker keeps inside
        released += reaper.release_stale(db, THRESHOLD)
        time.sleep(0.05)
    t.join()
    assert released == [], "a live worker's lock went stale"
    assert out["result"] == "succeeded"
    row = task_rows(db, run.id)[0]
    assert (row["status"], row["processed_offset"], row["attempts"]) == ("succeeded", 1, 1)
    assert _keepers() == [], "the keeper ends with its task"


def test_a_lock_taken_while_waiting_stops_the_task_and_it_writes_nothing(db) -> None:
    run = runs.start_run(db, Sleeper(), "acme", options={"nap": 60}, settings=SETTINGS)
    worker = Worker(db, settings=SETTINGS, providers=for_run)
    task, current = _claim(db, run.id, worker)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(result=worker.run_claimed(task, current)))
    t.start()
    assert reaper.release_stale(db, 0) == [task.id]  # a reaper with a zero threshold takes the lock
    db.sql("UPDATE migration_tasks SET status = 'running', locked_by = 'new-holder', locked_at = now() WHERE id = %(i)s",
           {"i": task.id})
    t.join(timeout=20)
    assert not t.is_alive(), "the keeper did not tell the task its lock was lost"
    assert out["result"] == "lost"
    row = task_rows(db, run.id)[0]
    assert (row["status"], row["locked_by"], row["processed_offset"]) == ("running", "new-holder", 0)
