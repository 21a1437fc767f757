"""Behaviour 14: one call returns a run's state (phase, tasks by status, per-kind counts, grouped
reasons); another returns task duration grouped by a payload stat (the seed's diagnostic query);
explain tells one source row's story from the ledger.

The grouped reasons come from the ledger's skipped and failed rows (every skip,
counted, not a log sample), failed tasks' reasons go once a retry made them succeed, and the
duration buckets follow the payload's distribution (powers of two), not "0" and "3+"."""
from __future__ import annotations

from engine_core import rollup, row_story, runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import drain_threads
from tests.engine.support import FAST


def test_rollup_duration_by_payload_and_explain(db) -> None:
    opts = {"page_size": 10, "counts": {"companies": 30, "contacts": 25, "deals": 20, "activities": 10, "notes": 10},
            "malformed": {"contacts": [4]}, "dangling": {"deals": [3]}}
    run = runs.start_run(db, provider_for("example"), "acme", options=opts, settings=FAST)
    drain_threads(db, run.id, width=3, settings=FAST, providers=for_run)
    r = rollup.rollup(db, run.id)
    assert r.status == "succeeded" and r.current_phase == 5
    by = {k.kind: k for k in r.kinds}
    assert (by["companies"].imported, by["contacts"].imported, by["contacts"].failed) == (30, 24, 1)
    assert by["deals"].skipped >= 1 and by["deals"].imported + by["deals"].skipped == 20
    assert r.tasks["succeeded"] == sum(sum(k.tasks.values()) for k in r.kinds)
    reasons = {(g["kind"], g["action"]): g for g in r.reasons}
    assert reasons[("contacts", "failed")]["samples"] == ["4"] and reasons[("contacts", "failed")]["count"] == 1
    assert reasons[("deals", "skipped")]["reason"] == "not linked to any record"
    assert reasons[("deals", "skipped")]["count"] == by["deals"].skipped  # every skip, not a sample
    assert r.as_dict()["kinds"][0]["kind"] == "companies"

    rows = rollup.duration_by_payload(db, run.id, kind="companies", stat="imported")
    assert sum(x["tasks"] for x in rows) == by["companies"].tasks["succeeded"]
    assert {x["payload"] for x in rows} == {"8-15", "0"}  # full pages of 10 and the empty tail pages

    assert row_story.explain(db, "acme", "contacts", "4")["action"] == "failed"
    deal = row_story.explain(db, "acme", "deals", "3")
    assert deal["action"] == "skipped" and deal["reason"] == "not linked to any record"
    assert row_story.explain(db, "acme", "companies", "1")["record_type"] == "example_items"
    assert row_story.explain(db, "acme", "companies", "999") is None


def test_duration_buckets_follow_the_payloads_distribution(db) -> None:
    """Tasks carrying 0..1000 rows spread over power-of-two buckets (the query used to fold
    everything from 3 up into "3+")."""
    run = runs.start_run(db, provider_for("example"), "buckets", options={"counts": {"companies": 1}}, settings=FAST)
    db.sql("DELETE FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})
    for i, n in enumerate([0, 1, 2, 3, 5, 7, 40, 600, 1000]):
        db.sql("INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, stats, started_at,"
               " finished_at) VALUES (%(r)s, 0, 'companies', %(k)s, '{}', 'succeeded', %(s)s::jsonb,"
               " now() - interval '2 seconds', now())",
               {"r": run.id, "k": f"t{i}", "s": '{"imported": %d}' % n})
    rows = rollup.duration_by_payload(db, run.id, kind="companies", stat="imported")
    assert [(x["payload"], x["tasks"]) for x in rows] == [
        ("0", 1), ("1", 1), ("2-3", 2), ("4-7", 2), ("32-63", 1), ("512-1023", 2)]


def test_a_failure_reason_goes_once_its_task_succeeded_after_a_retry(db) -> None:
    """A page fails, the cause goes, the run is retried: the failed task's reason leaves the
    rollup (it used to stay in the run log's grouped reasons for good)."""
    opts = {"page_size": 10, "counts": {"companies": 30, "contacts": 20, "deals": 5, "activities": 5, "notes": 5},
            "fail_pages": {"contacts": [10]}}
    provider = provider_for("example")
    run = runs.start_run(db, provider, "stale", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    before = rollup.rollup(db, run.id)
    assert any("injected failure" in g["reason"] and g["action"] == "task failed" for g in before.reasons), before.reasons
    db.sql("UPDATE migrations SET options = options - 'fail_pages' WHERE id = %(id)s", {"id": run.id})
    runs.retry(db, run.id, provider, FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    after = rollup.rollup(db, run.id)
    assert after.status == "succeeded"
    assert not [g for g in after.reasons if "injected failure" in g["reason"] or "failed task" in g["reason"]], after.reasons
