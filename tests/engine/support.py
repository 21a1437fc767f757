"""Test-only providers and helpers for the engine's tests (real Postgres, no mocks)."""
from __future__ import annotations

import time
from typing import Any

from engine_core import db as dbmod
from engine_core.config import Settings
from engine_core.context import TaskContext
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.registry import register

FAST = Settings(lane_width=4, stale_lock_seconds=1800, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)


class CounterProvider:
    """Each task records one execution row: lets tests count executions per task exactly."""

    source = "counter"

    def __init__(self, run: Run | None = None) -> None:
        self.options = dict(run.options) if run else {}

    def phases(self) -> list[list[str]]:
        return [["k0"], ["k1"], ["k2"]]

    def account(self) -> str:
        return "counter-account"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        n = int(run.options.get("tasks", 10))
        return [Successor(f"{kind}:{i}", {"i": i}) for i in range(n)]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        delay = float(ctx.run.options.get("delay", 0))
        if delay:
            time.sleep(delay)
        with ctx.db.transaction() as tx:
            tx.sql(
                "INSERT INTO test_executions (task_id, worker) VALUES (%(t)s, %(w)s)",
                {"t": ctx.task.id, "w": ctx.worker},
            )
        return TaskOutcome()


register("counter", CounterProvider)


def make_executions_table(db: dbmod.Database) -> None:
    db.sql("CREATE TABLE IF NOT EXISTS test_executions (task_id bigint NOT NULL, worker text NOT NULL)")


def task_rows(db: dbmod.Database, run_id: int, **where: Any) -> list[dict[str, Any]]:
    cond = " AND ".join(f"{k} = %({k})s" for k in where)
    return db.sql(
        "SELECT * FROM migration_tasks WHERE migration_id = %(run_id)s" + (f" AND {cond}" if cond else "") + " ORDER BY id",
        {"run_id": run_id, **where},
    )
