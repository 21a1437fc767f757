"""Completeness is checked, not assumed: when a phase closes, each kind's rollup compares
rows seen with rows accounted for (imported + matched + already here + skipped + failed), the rows
the run claimed in the ledger with those it counted as imported or matched, and rows seen with the
source's own count where a discovery task recorded one (`source_total`). A run whose kinds do not
add up says so in its rollup (`complete`, `incomplete`, `verdict`), never silently."""
from __future__ import annotations

from engine_core import rollup, runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import drain_threads
from tests.engine.support import FAST

OPTS = {"page_size": 10, "counts": {"companies": 30, "contacts": 25, "deals": 20, "activities": 10, "notes": 10},
        "malformed": {"contacts": [4]}, "dangling": {"deals": [3]}}


def _finished(db, tenant: str, **extra):
    run = runs.start_run(db, provider_for("example"), tenant, options={**OPTS, **extra}, settings=FAST)
    drain_threads(db, run.id, width=3, settings=FAST, providers=for_run)
    return run


def test_a_clean_run_adds_up_in_every_phase(db) -> None:
    run = _finished(db, "clean")
    r = rollup.rollup(db, run.id)
    assert r.status == "succeeded" and r.complete and r.verdict == "succeeded", r.incomplete
    assert [c["phase"] for c in r.completeness] == [0, 1, 2, 3, 4]
    contacts = r.phase_completeness(1)
    assert contacts["complete"] and contacts["kinds"]["contacts"]["seen"] == 25
    assert contacts["stats_written"] == contacts["ledger_written"] == 24
    assert r.as_dict()["counts_add_up"] is True


def test_a_lost_ledger_row_makes_the_run_incomplete(db) -> None:
    run = _finished(db, "lostrow")
    db.sql("DELETE FROM migration_records WHERE tenant_id = 'lostrow' AND kind = 'deals' AND action = 'created'"
           " AND source_id = '7'")
    r = rollup.rollup(db, run.id)
    assert not r.complete
    assert r.phase_completeness(2)["problems"] == [
        "phase 3 (deals): 19 imported or matched in the task stats but 18 claimed in the ledger by this run"]
    assert r.verdict.startswith("succeeded, incomplete: phase 3 (deals)")
    assert r.phase_completeness(1)["complete"]  # the other phases still add up


def test_rows_seen_but_not_accounted_for_make_the_run_incomplete(db) -> None:
    run = _finished(db, "tampered")
    # a task that saw more rows than it gave outcomes to (a counter lost in a resumed window)
    db.sql("UPDATE migration_tasks SET stats = jsonb_set(stats, '{seen}', to_jsonb((stats->>'seen')::int + 2))"
           " WHERE id = (SELECT min(id) FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'notes'"
           " AND (stats->>'seen')::int > 0)", {"r": run.id})
    r = rollup.rollup(db, run.id)
    assert [p.split(" (")[0] for p in r.incomplete] == ["notes: 12 seen but 10 accounted for"]
    assert "incomplete" in r.as_dict()["verdict"]


def test_rows_seen_are_compared_with_the_sources_own_count(db) -> None:
    run = _finished(db, "counted")
    task = db.sql("SELECT min(id) AS id FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'companies'",
                  {"r": run.id})[0]["id"]
    db.sql("UPDATE migration_tasks SET stats = stats || '{\"source_total\": 30}'::jsonb WHERE id = %(t)s", {"t": task})
    assert rollup.rollup(db, run.id).complete
    db.sql("UPDATE migration_tasks SET stats = stats || '{\"source_total\": 31}'::jsonb WHERE id = %(t)s", {"t": task})
    r = rollup.rollup(db, run.id)
    assert r.incomplete == ["companies: 30 seen of the source's own count 31"]
    assert {k.kind: k.source_total for k in r.kinds}["companies"] == 31


def test_a_run_that_failed_at_a_phase_is_checked_on_that_phase_too(db) -> None:
    run = _finished(db, "failedphase", fail_pages={"contacts": [10]})
    r = rollup.rollup(db, run.id)
    assert r.status == "failed"
    assert 1 in [c["phase"] for c in r.completeness]
    assert r.complete, r.incomplete  # a failed page is accounted for by its failed task, not lost silently


def test_a_stopped_runs_counts_not_met_yet_say_why_and_how_it_resumes(db) -> None:
    run = _finished(db, "stopshort")
    db.sql("UPDATE migration_tasks SET stats = stats || '{\"source_total\": 31}'::jsonb WHERE id = (SELECT min(id)"
           " FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'companies')", {"r": run.id})
    # a stop in the companies' phase: its walk's last task cancelled (`runs.stop`), so the phase closed short
    db.sql("UPDATE migrations SET status = 'stopped', current_phase = 0 WHERE id = %(r)s", {"r": run.id})
    db.sql("UPDATE migration_tasks SET status = 'cancelled' WHERE id = (SELECT max(id) FROM migration_tasks"
           " WHERE migration_id = %(r)s AND kind = 'companies')", {"r": run.id})
    r = rollup.rollup(db, run.id)
    assert r.incomplete == [] and r.verdict == "stopped"
    assert r.unfinished == ["companies: 30 seen of the source's own count 31 so far: the run stopped before phase 1 "
                            "finished (1 task cancelled); `migrate run --tenant stopshort` resumes it"]
    # a stop after the phase, before the catch-up of a run with a snapshot: the catch-up may still meet it
    db.sql("UPDATE migrations SET current_phase = 2, snapshot_at = now() WHERE id = %(r)s", {"r": run.id})
    r = rollup.rollup(db, run.id)
    assert r.incomplete == [] and r.unfinished == [
        "companies: 30 seen of the source's own count 31 so far: the run stopped before its catch-up; "
        "`migrate run --tenant stopshort` resumes it"]
    db.sql("UPDATE migrations SET status = 'failed' WHERE id = %(r)s", {"r": run.id})  # a failed run: a verdict
    assert rollup.rollup(db, run.id).incomplete == ["companies: 30 seen of the source's own count 31"]


def test_a_dry_runs_reasons_say_why_rows_would_be_skipped(db) -> None:
    wet = rollup.rollup(db, _finished(db, "wetreasons").id)
    run = runs.start_run(db, provider_for("example"), "dryreasons", options=OPTS, settings=FAST, dry_run=True)
    drain_threads(db, run.id, width=3, settings=FAST, providers=for_run)
    dry = rollup.rollup(db, run.id)
    assert dry.dry_run and sum(k.skipped for k in dry.kinds) > 0
    # the ledger's placeholders roll back with each dry row's savepoint; their reasons are kept all the same
    shown = {(g["kind"], g["action"], g["reason"], g["count"]) for g in dry.reasons}
    assert {(g["kind"], g["action"], g["reason"], g["count"]) for g in wet.reasons if g["action"] == "skipped"} <= shown
    assert sum(g["count"] for g in dry.reasons if g["action"] == "skipped") == sum(k.skipped for k in dry.kinds)
