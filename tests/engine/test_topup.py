"""Behaviour 9: at most MAX_INFLIGHT (2 x lane width) of a run's tasks are enqueued or running, and
a finishing task refills to the deficit. Guard for the seed's decay bug (one successor per finisher
let two finishers enqueue the same task, so the pool decayed to one): two tasks finish together and
the pool is back at width."""
from __future__ import annotations

import threading

from engine_core import db as dbmod
from engine_core import planner, runs
from engine_core.providers.base import provider_for
from tests.engine.support import FAST


def _inflight(db, run_id: int) -> dict:
    return db.fetch_one("inflight_count", {"run_id": run_id})


def test_start_enqueues_up_to_max_inflight(db) -> None:
    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 20}, settings=FAST)
    c = _inflight(db, run.id)
    assert FAST.max_inflight == 8
    assert c["enqueued"] == 8 and c["pending"] == 20


def test_two_tasks_finishing_together_leave_the_pool_at_width(db_url) -> None:
    database = dbmod.Database(db_url, max_size=10)
    run = runs.start_run(database, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 20}, settings=FAST)
    claimed = [database.fetch_one("claim_next", {"run_id": run.id, "worker": f"w{i}", "max_phase": None}) for i in range(2)]
    gate = threading.Barrier(2)

    def finish(row) -> None:
        database.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id = %(i)s", {"i": row["id"]})
        gate.wait()
        planner.top_up(database, run.id, FAST)

    threads = [threading.Thread(target=finish, args=(r,)) for r in claimed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c = _inflight(database, run.id)
    assert c["running"] + c["enqueued"] == FAST.max_inflight, f"pool decayed: {c}"
    database.close()


def test_concurrent_top_ups_never_exceed_the_bound(db_url) -> None:
    database = dbmod.Database(db_url, max_size=12)
    run = runs.start_run(database, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 40}, settings=FAST)
    database.sql("UPDATE migration_tasks SET enqueued_at = NULL")
    gate = threading.Barrier(10)

    def top() -> None:
        gate.wait()
        planner.top_up(database, run.id, FAST)

    threads = [threading.Thread(target=top) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _inflight(database, run.id)["enqueued"] == FAST.max_inflight
    database.close()
