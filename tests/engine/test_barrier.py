"""Behaviour 8: current_phase moves by a fenced update. 50 tasks finishing at once seed the next
phase exactly once; a late task of an earlier phase advances nothing; the last phase finalises."""
from __future__ import annotations

import threading

from engine_core import db as dbmod
from engine_core import barrier, runs
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST, task_rows


def _finish_all(db, run_id: int, phase: int) -> None:
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s AND phase = %(p)s", {"r": run_id, "p": phase})


def test_fifty_finishers_at_once_seed_the_next_phase_exactly_once(db_url) -> None:
    database = dbmod.Database(db_url, max_size=55)
    p = provider_for("counter")
    run = runs.start_run(database, p, "acme", options={"tasks": 50}, settings=FAST)
    _finish_all(database, run.id, 0)
    wins: list[bool] = []
    gate = threading.Barrier(50)

    def finisher() -> None:
        gate.wait()
        wins.append(barrier.advance_phase(database, run.id, 0, p, FAST))

    threads = [threading.Thread(target=finisher) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins.count(True) == 1
    assert runs.get_run(database, run.id).current_phase == 1
    assert len(task_rows(database, run.id, phase=1)) == 50
    database.close()


def test_phase_does_not_advance_while_a_task_is_open(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 3}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id = (SELECT min(id) FROM migration_tasks)")
    assert not barrier.advance_phase(db, run.id, 0, p, FAST)
    assert runs.get_run(db, run.id).current_phase == 0


def test_a_late_task_of_an_earlier_phase_cannot_advance_anything(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", options={"tasks": 2}, settings=FAST)
    _finish_all(db, run.id, 0)
    assert barrier.advance_phase(db, run.id, 0, p, FAST)
    _finish_all(db, run.id, 1)  # phase 1 done too, but the late finisher says "phase 0"
    assert not barrier.advance_phase(db, run.id, 0, p, FAST)
    assert runs.get_run(db, run.id).current_phase == 1
    assert task_rows(db, run.id, phase=2) == []


def test_the_last_phase_finalises_the_run(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    _finish_all(db, run.id, 0)
    barrier.advance_phase(db, run.id, 0, p, FAST)
    _finish_all(db, run.id, 1)
    assert barrier.advance_phase(db, run.id, 1, p, FAST)
    final = runs.get_run(db, run.id)
    assert final.status == "succeeded" and final.current_phase == 2 and final.finished_at is not None


def test_a_last_phase_with_a_failed_task_fails_the_run_at_that_phase(db) -> None:
    # a phase that closes with failed tasks fails the run there (it used to advance past
    # the plan and finalise as failed); current_phase stays on the failed phase for a retry.
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    _finish_all(db, run.id, 0)
    barrier.advance_phase(db, run.id, 0, p, FAST)
    _finish_all(db, run.id, 1)
    db.sql("UPDATE migration_tasks SET status = 'failed' WHERE id = (SELECT max(id) FROM migration_tasks)")
    assert barrier.advance_phase(db, run.id, 1, p, FAST)
    final = runs.get_run(db, run.id)
    assert final.status == "failed" and final.current_phase == 1 and final.finished_at is not None
