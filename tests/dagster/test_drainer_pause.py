"""A drainer turn during which the source fails every request pauses the run (as the phase op
does) and ends its Dagster run CANCELED with the pause's reason, not a bare "was stopped": the
UI's run page then says why the run stopped and that a launch resumes it."""
from __future__ import annotations

from dagster import DagsterRunStatus

from engine_core import progress, runs
from engine_core.providers.registry import provider_for
from migration_pipeline import jobs
from tests.dagster.support import SMALL, source_failing
from tests.dagster.test_one_story import _drain_with_a_drainer


def test_a_drainer_that_pauses_the_run_says_why_it_was_canceled(instance, engine_url, db, monkeypatch):
    monkeypatch.setenv("MIGRATE_SOURCE_DOWN_SECONDS", "1")
    metrics = progress.SourceMetrics()
    monkeypatch.setattr(progress, "source_metrics", metrics)
    monkeypatch.setattr(jobs, "source_metrics", metrics)  # the drainer's watcher reads its own import
    slow = {**SMALL, "row_delay": 0.02}
    run = runs.attach(db, provider_for("example"), "paused", start_kwargs={"options": slow}).run
    with source_failing(metrics):
        result = _drain_with_a_drainer(instance, engine_url, "paused", run.id, options=slow)
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    assert runs.get_run(db, run.id).status in ("stopping", "stopped")
    said = [r.user_message for r in instance.all_logs(result.run_id) if "during this drainer's turn" in r.user_message]
    assert said and all("was paused during this drainer's turn: the source failed every request for" in m
                        and "(last: HTTP 500)" in m and "resumes it once the source answers" in m for m in said), said
