"""A stopped run never stays `stopping` with nothing running. The stop settles (`stopped`) when the
last running task lets go; that settle used to come after the task's cancel had committed
(`Worker._after`), so a worker whose process ended in between (a `migrate run` exiting while its
lane threads stopped, kill -9) left the run `stopping` for good, and every launch then "joined" a
run nobody drove. Here: real workers on threads, several cancelling at once on real Postgres, each
"gone" right after its task's commit; and a run left stopping with nothing running is settled by
the first look for the tenant's live run, so a launch resumes it."""
from __future__ import annotations

import threading
import time

import pytest
from psycopg.types.json import Jsonb

from engine_core import claim, runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import Worker
from tests.engine.support import FAST

OPTS = {"page_size": 5, "row_delay": 0.02,
        "counts": {"companies": 60, "contacts": 60, "deals": 60, "activities": 60, "notes": 60}}


def _running(db, run_id: int) -> int:
    return db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'",
                  {"r": run_id})[0]["n"]


@pytest.mark.timeout(120)
def test_workers_gone_right_after_their_cancels_leave_the_run_stopped(db, monkeypatch) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", options=OPTS, settings=FAST)
    gone = threading.Event()  # from the stop on, a worker's process "ends" right after its task's commit
    after = Worker._after

    def after_unless_gone(self, *args, **kwargs):
        if not gone.is_set():
            after(self, *args, **kwargs)

    monkeypatch.setattr(Worker, "_after", after_unless_gone)
    workers = [Worker(db, settings=FAST, providers=for_run, worker_id=f"w{i}") for i in range(4)]
    threads = [threading.Thread(target=w.drain, args=(run.id,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while _running(db, run.id) < 3 and time.monotonic() < deadline:  # several tasks held at once
        time.sleep(0.005)
    assert _running(db, run.id) >= 3, "the workers never held three tasks at once"
    gone.set()
    stopped = runs.stop(db, run.id, FAST)
    assert stopped.status == "stopping", "the stop found the tasks running (the race this guards)"
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert _running(db, run.id) == 0
    assert runs.get_run(db, run.id).status == "stopped"


def test_a_run_left_stopping_with_nothing_running_is_resumed_not_joined(db) -> None:
    p = provider_for("example")
    run = runs.start_run(db, p, "acme", options=OPTS, settings=FAST)
    task_id = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s AND enqueued_at IS NOT NULL "
                     "ORDER BY id LIMIT 1", {"r": run.id})[0]["id"]
    assert claim.claim(db, task_id, "gone:1:1") is not None
    assert runs.stop(db, run.id, FAST).status == "stopping"
    # its worker let go of the task and ended before settling the stop
    db.execute("release_task", {"task_id": task_id, "worker": "gone:1:1", "error": "released: gone",
                                "not_before": None, "refund": 1})
    assert _running(db, run.id) == 0 and runs.get_run(db, run.id).status == "stopping"
    assert runs.live_run(db, "acme", p.source) is None
    got = runs.attach(db, p, "acme")
    assert (got.run.id, got.action) == (run.id, "rerun") and runs.get_run(db, run.id).status == "stopped"
    assert runs.prepare(db, run.id, p, FAST).action == "resumed"


def test_two_tasks_let_go_in_transactions_open_at_once_settle_the_stop(db) -> None:
    """The last of two concurrent commits sees the other's task gone: each transaction locks the
    stopping run's row before it ends its task (`Worker._stopping_locked`), so the second waits for
    the first to commit instead of settling on a snapshot where the first's task still runs."""
    run = runs.start_run(db, provider_for("example"), "acme", options=OPTS, settings=FAST)
    ids = [r["id"] for r in db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s "
                                   "AND enqueued_at IS NOT NULL ORDER BY id LIMIT 2", {"r": run.id})]
    assert len(ids) == 2
    for i, task_id in enumerate(ids):
        assert claim.claim(db, task_id, f"w{i}") is not None
    assert runs.stop(db, run.id, FAST).status == "stopping"
    settled = [threading.Event(), threading.Event()]
    errors: list[BaseException] = []

    def let_go(i: int) -> None:
        try:
            with db.transaction() as tx:
                stopping = Worker._stopping_locked(tx, run.id)
                tx.execute("cancel_running_task", {"task_id": ids[i], "worker": f"w{i}", "stats": Jsonb({})})
                Worker._settle_stop(tx, run.id, stopping)
                settled[i].set()
                settled[1 - i].wait(2)  # hold the commit while the other one settles, if it can
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=let_go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert _running(db, run.id) == 0
    assert runs.get_run(db, run.id).status == "stopped"
