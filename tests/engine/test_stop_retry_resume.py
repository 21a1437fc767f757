"""Behaviour 12: stop sets a flag checked before every claim (it lands within one task); retry
re-arms failed tasks and rewinds the barrier to the earliest phase that has them; resume re-arms
cancelled tasks. A phase that closes with failed tasks fails the run at that phase (nothing later
starts); retry resumes it there and later phases then run once."""
from __future__ import annotations

import threading

from engine_core import row_story, runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker, drain_threads
from tests.engine.support import FAST, task_rows

OPTS = {"page_size": 10, "counts": {"companies": 40, "contacts": 40, "deals": 40, "activities": 40, "notes": 40}}


def test_stop_lands_within_one_task_and_resume_finishes_exactly(db) -> None:
    p = provider_for("example")
    run = runs.start_run(db, p, "acme", options={**OPTS, "row_delay": 0.002}, settings=FAST)
    w = Worker(db, settings=FAST, providers=for_run)
    assert w.drain(run.id, max_tasks=3).executed == {"succeeded": 3}
    stopped = runs.stop(db, run.id)
    assert stopped.status == "stopped"
    assert w.drain(run.id).executed == {}, "no claim after stop"
    statuses = {t["status"] for t in task_rows(db, run.id)}
    assert statuses <= {"succeeded", "cancelled"}
    resumed = runs.resume(db, run.id, p, settings=FAST)
    assert resumed.status == "running"
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    per = db.sql("SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items GROUP BY kind")
    assert all(r["n"] == r["d"] == 40 for r in per) and len(per) == 5


def test_stop_while_a_task_runs_keeps_its_progress(db) -> None:
    p = provider_for("example")
    run = runs.start_run(db, p, "acme", kinds=["companies"], options={"page_size": 200, "counts": {"companies": 200}, "row_delay": 0.005}, settings=FAST)
    w = Worker(db, settings=FAST, providers=for_run)
    t = threading.Thread(target=w.drain, args=(run.id,))
    t.start()
    while not db.sql("SELECT 1 FROM migration_tasks WHERE processed_offset >= 25 LIMIT 1"):
        pass
    runs.stop(db, run.id)
    t.join(timeout=30)
    assert not t.is_alive()
    assert runs.get_run(db, run.id).status == "stopped"
    assert not db.sql("SELECT 1 FROM migration_tasks WHERE status IN ('running', 'pending')")


def test_a_failed_phase_fails_the_run_there_and_retry_rewinds_to_it(db) -> None:
    # a phase that closes with a failed task fails the engine run at that
    # phase - nothing later is seeded, so no drainer works on past it - and says so in the run log.
    p = provider_for("example")
    run = runs.start_run(db, p, "acme", options={**OPTS, "fail_pages": {"contacts": [10]}}, settings=FAST)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    failed = runs.get_run(db, run.id)
    assert failed.status == "failed" and failed.current_phase == 1 and failed.finished_at is not None
    assert [t for t in task_rows(db, run.id) if t["phase"] > 1] == [], "no later phase was started"
    entry = next(e for e in db.sql("SELECT log FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["log"]
                 if e["kind"] == "contacts" and "closed with" in e["reason"])
    assert entry["count"] == 1 and entry["level"] == "error" and "phase 2 (contacts)" in entry["reason"]
    earlier = {t["id"]: t["finished_at"] for t in task_rows(db, run.id) if t["status"] == "succeeded"}

    db.sql("UPDATE migrations SET options = options - 'fail_pages'")  # the cause is removed
    retried = runs.retry(db, run.id, p, settings=FAST)
    assert retried.status == "running" and retried.current_phase == 1, "rewound to the failed task's phase"
    assert db.fetch_one("inflight_count", {"run_id": run.id})["enqueued"] == 1
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    done = runs.get_run(db, run.id)
    assert done.status == "succeeded"
    after = {t["id"]: t["finished_at"] for t in task_rows(db, run.id) if t["id"] in earlier}
    assert after == earlier  # what succeeded before the failure was not run again
    per = db.sql("SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items GROUP BY kind")
    assert all(r["n"] == r["d"] == 40 for r in per) and len(per) == 5


def test_resume_of_a_run_stopped_as_its_phase_emptied(db) -> None:
    """The stop held the barrier with nothing cancelled: resume reopens and the phase closes."""
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded'")
    assert runs.stop(db, run.id).status == "stopped"
    resumed = runs.resume(db, run.id, p, settings=FAST)
    assert resumed.status == "running" and resumed.current_phase == 1
    assert len(task_rows(db, run.id, phase=1)) == 2


def test_draining_until_a_phase_closes_claims_nothing_of_the_next(db) -> None:
    from tests.engine.support import make_executions_table

    make_executions_table(db)
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 3}, settings=FAST)
    result = Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=0)
    assert result.reason == "phase_closed" and result.executed == {"succeeded": 3}
    assert {t["status"] for t in task_rows(db, run.id, phase=1)} == {"pending"}


def test_retry_after_a_failed_page_writes_the_page_and_later_phases_once(db) -> None:
    # Since a failed phase fails the run there, no deal is skipped behind a failed
    # contacts page any more: deals wait for the retry and then link to every contact.
    from engine_core import rollup
    from engine_core.providers import example

    p = provider_for("example")
    opts = {**OPTS, "fail_pages": {"contacts": [10]}, "dangling": {"deals": [7]}}
    run = runs.start_run(db, p, "acme", options=opts, settings=FAST)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    before = {k.kind: k for k in rollup.rollup(db, run.id).kinds}
    assert before["deals"].seen == 0 and not before["deals"].tasks, "deals never started behind the failed phase"

    db.sql("UPDATE migrations SET options = options - 'fail_pages'")
    example.WRITE_CALLS.clear()
    runs.retry(db, run.id, p, settings=FAST)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    after = {k.kind: k for k in rollup.rollup(db, run.id).kinds}
    assert (after["deals"].imported, after["deals"].skipped) == (39, 1), "only the truly dangling deal is skipped"
    assert (after["contacts"].imported, after["contacts"].failed) == (40, 0)
    rewritten = {sid for (kind, sid), n in example.WRITE_CALLS.items() if kind == "contacts"}
    assert rewritten == {str(i) for i in range(11, 21)}, "only the failed contacts page was written by the retry"
    assert all(n == 1 for (kind, _), n in example.WRITE_CALLS.items() if kind == "deals")
    per = db.sql("SELECT count(*) AS n, count(DISTINCT source_id) AS d FROM example_items WHERE kind = 'deals'")[0]
    assert per["n"] == per["d"] == 39
    assert row_story.explain(db, "acme", "deals", "7")["action"] == "skipped"


def test_dependents_follow_the_providers_links_transitively() -> None:
    from engine_core.source import dependents
    from engine_core.providers.pipedrive.plan import DEPENDS_ON, PHASES

    class P:
        def depends_on(self, kind):
            return DEPENDS_ON[kind]

    every = [k for g in PHASES for k in g]
    assert dependents(P(), {"notes"}, every) == set()
    assert dependents(P(), {"deals"}, every) == {"activities", "notes", "emails", "deal_products", "participants",
                                                 "followers", "deal_history"}
    # files link to their records softly (a file of a gone record is kept): nothing makes them wait
    assert dependents(P(), {"organizations"}, every) == set(every) - {"fields", "users", "pipelines", "stages", "organizations",
                                                                      "products", "files", "file_contents"}
    assert dependents(P(), {"pipelines"}, every) == {"stages"}  # deals link to stages softly
    assert dependents(object(), {"notes"}, every) == set(every) - {"notes"}  # no links declared: all


def test_retry_of_a_failed_later_phase_re_arms_only_its_failed_task(db) -> None:
    p = provider_for("example")
    opts = {**OPTS, "fail_pages": {"activities": [0]}, "dangling": {"notes": [3]}}
    run = runs.start_run(db, p, "acme", options=opts, settings=FAST)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).current_phase == 3
    assert [t for t in task_rows(db, run.id) if t["kind"] == "notes"] == [], "notes wait behind the failed phase"
    db.sql("UPDATE migrations SET options = options - 'fail_pages'")
    runs.retry(db, run.id, p, settings=FAST)
    pending = {t["kind"] for t in task_rows(db, run.id) if t["status"] == "pending"}
    assert pending == {"activities"}
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    notes = db.sql("SELECT count(*) AS n, count(DISTINCT source_id) AS d FROM example_items WHERE kind = 'notes'")[0]
    assert notes["n"] == notes["d"] == 39  # note 3's deal does not exist: skipped, the rest once
