"""Behaviour 9: at most MAX_INFLIGHT (2 x lane width) of a run's tasks are enqueued or running, and
a finishing task refills to the deficit. Guard for the seed's decay bug (one successor per finisher
let two finishers enqueue the same task, so the pool decayed to one): two tasks finish together and
the pool is back at width."""
from __future__ import annotations

import threading

from engine_core import db as dbmod
from engine_core import runs, topup
from engine_core.providers.registry import provider_for, for_run
from tests.engine.support import FAST, make_executions_table


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
        topup.top_up(database, run.id, FAST)

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
        topup.top_up(database, run.id, FAST)

    threads = [threading.Thread(target=top) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _inflight(database, run.id)["enqueued"] == FAST.max_inflight
    database.close()


class _DiedAfterFinish(Exception):
    """The worker died right after its task's finish committed."""


def test_a_finished_tasks_successor_is_on_the_lane_even_if_its_worker_dies_after_the_finish(db, monkeypatch) -> None:
    """The finish and the lane's refill commit together (`Worker._finish_tx`), so a
    worker that dies between its finish and anything after leaves its successor enqueued, not
    pending off the lane until a poll or the reaper finds it."""
    from engine_core.worker import Worker

    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"],
                         options={"counts": {"companies": 100}, "page_size": 10}, settings=FAST)

    def died(self, *args, **kwargs):
        raise _DiedAfterFinish()

    monkeypatch.setattr(Worker, "_after", died)
    first = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s AND cursor_key = 'companies:0'",
                   {"r": run.id})[0]["id"]
    try:
        Worker(db, settings=FAST, providers=for_run).execute(first)
    except _DiedAfterFinish:
        pass
    successor = db.sql("SELECT status, enqueued_at FROM migration_tasks WHERE migration_id = %(r)s"
                       " AND cursor_key = 'companies:40'", {"r": run.id})
    assert successor and successor[0]["status"] == "pending"
    assert successor[0]["enqueued_at"] is not None, "the successor was left off the lane"


def test_a_task_that_does_not_close_its_phase_looks_at_its_run_once_after_it_settles(db, monkeypatch) -> None:
    """After its finish a task needs one round trip (`after_task`: heartbeat, stop flag,
    the phase's open tasks) - not a heartbeat, a read of the run, a top-up and a barrier attempt -
    when other tasks of its phase are still open."""
    from engine_core import statistics
    from engine_core.worker import Worker

    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 3}, settings=FAST)
    make_executions_table(db)
    statistics.for_db(db).maybe_refresh()  # the growth check has just looked: it does not again
    checkouts: list[str] = []
    real_after = Worker._after

    def after(self, *args, **kwargs):  # the real `_after`, its pool checkouts counted
        real = db.connection

        def counted():
            checkouts.append("connection")
            return real()

        monkeypatch.setattr(db, "connection", counted)
        try:
            return real_after(self, *args, **kwargs)
        finally:
            monkeypatch.setattr(db, "connection", real)

    monkeypatch.setattr(Worker, "_after", after)
    task = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s ORDER BY id LIMIT 1", {"r": run.id})[0]["id"]
    assert Worker(db, settings=FAST, providers=for_run).execute(task) == "succeeded"
    assert checkouts == ["connection"], f"{len(checkouts)} round trips after a task that does not close its phase"
    assert _inflight(db, run.id)["pending"] == 2
