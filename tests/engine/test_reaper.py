"""Behaviour 10: the reaper's sweeps as plain functions - release stale locks, refill runs below
width, advance phases that closed without a winner, finalise runs whose heartbeat stopped. Each only
repeats what a finishing task would have done."""
from __future__ import annotations

from engine_core import reaper, runs
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST, task_rows


def test_release_only_locks_older_than_the_threshold(db) -> None:
    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 3}, settings=FAST)
    a = db.fetch_one("claim_next", {"run_id": run.id, "worker": "dead", "max_phase": None})
    db.sql("UPDATE migration_tasks SET locked_at = now() - interval '31 minutes', processed_offset = 7 WHERE id = %(i)s", {"i": a["id"]})
    b = db.fetch_one("claim_next", {"run_id": run.id, "worker": "alive", "max_phase": None})
    assert reaper.release_stale(db, 30 * 60) == [a["id"]]
    t = task_rows(db, run.id, id=a["id"])[0]
    assert t["status"] == "pending" and t["processed_offset"] == 7 and t["locked_by"] is None
    assert task_rows(db, run.id, id=b["id"])[0]["status"] == "running"


def test_refill_tops_up_a_run_below_width(db) -> None:
    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 20}, settings=FAST)
    db.sql("UPDATE migration_tasks SET enqueued_at = NULL")  # enqueues lost
    below = reaper.refill(db, FAST)
    assert below == {run.id: 8}
    assert db.fetch_one("inflight_count", {"run_id": run.id})["enqueued"] == 8
    assert reaper.refill(db, FAST) == {run.id: 8}  # idempotent: nothing more enqueued
    assert db.fetch_one("inflight_count", {"run_id": run.id})["enqueued"] == 8


def test_advance_closes_a_phase_whose_winner_died(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded'")  # finished, but nobody advanced
    assert reaper.advance(db, FAST, lambda r: p) == [run.id]
    assert runs.get_run(db, run.id).current_phase == 1
    assert len(task_rows(db, run.id, phase=1)) == 2
    assert reaper.advance(db, FAST, lambda r: p) == []


def test_finalise_runs_whose_heartbeat_stopped(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0"], options={"tasks": 2}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded'")
    db.sql("UPDATE migrations SET current_phase = 1")  # the winner advanced past the last phase, then died
    assert reaper.finalize(db, 60) == []  # heartbeat is fresh: not ours to decide yet
    db.sql("UPDATE migrations SET heartbeat_at = now() - interval '2 hours'")
    assert reaper.finalize(db, 60) == [run.id]
    assert runs.get_run(db, run.id).status == "succeeded"


def test_one_sweep_repairs_a_dead_worker_end_to_end(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    first, second = task_rows(db, run.id)
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id = %(i)s", {"i": first["id"]})
    db.sql("UPDATE migration_tasks SET status = 'running', locked_by = 'dead', locked_at = now() - interval '1 hour' WHERE id = %(i)s", {"i": second["id"]})
    report = reaper.sweep(db, FAST, lambda r: p)
    assert report.released == [second["id"]] and report.advanced == []
    assert report.below_width == {run.id: 1}
    again = reaper.sweep(db, FAST, lambda r: p)
    assert again.quiet


def test_a_stale_task_of_a_stopping_run_is_cancelled_and_the_stop_settles(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0"], options={"tasks": 2}, settings=FAST)
    a = db.fetch_one("claim_next", {"run_id": run.id, "worker": "dead", "max_phase": None})
    assert runs.stop(db, run.id).status == "stopping"  # a task is still running
    db.sql("UPDATE migration_tasks SET locked_at = now() - interval '1 hour' WHERE id = %(i)s", {"i": a["id"]})
    report = reaper.sweep(db, FAST, lambda r: p)
    assert report.released == [a["id"]] and report.finalized == [run.id]
    assert task_rows(db, run.id, id=a["id"])[0]["status"] == "cancelled"
    assert runs.get_run(db, run.id).status == "stopped"


def test_one_run_without_a_provider_does_not_stop_the_sweep(db) -> None:
    p = provider_for("counter")
    good = runs.start_run(db, p, "good", kinds=["k0", "k1"], options={"tasks": 1}, settings=FAST)
    bad = runs.start_run(db, p, "bad", kinds=["k0", "k1"], options={"tasks": 1}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded'")

    def providers(run):
        if run.id == bad.id:
            raise RuntimeError("no such source here")
        return p

    assert reaper.advance(db, FAST, providers) == [good.id]
