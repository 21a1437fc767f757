"""With the source down, `migrate run`'s plain-text progress says what is retried and why (issue
10's leftover): the counts stand still while the phase op's requests are retried, up to
MIGRATE_SOURCE_DOWN_SECONDS (3 min) before the run pauses, and nothing was printed meanwhile. The
retries are counted in the op's own process; it reports them in its progress observations every
few seconds, which the command reads."""
from __future__ import annotations

from dagster import AssetKey, AssetObservation, DagsterEventType, DagsterRun, DagsterRunStatus
from dagster._core.events import AssetObservationData, DagsterEvent

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for


def _observe(instance, run_id: str, metadata: dict) -> None:
    event = DagsterEvent(event_type_value=DagsterEventType.ASSET_OBSERVATION.value, job_name="migrate_tenant",
                         event_specific_data=AssetObservationData(AssetObservation(
                             asset_key=AssetKey(["example", "phase_1_companies"]), metadata=metadata)))
    instance.report_dagster_event(event, run_id)


def test_progress_lines_say_the_retries_in_progress_and_their_cause(db_url, instance):
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.progress import Progress

    with dbmod.Database(db_url, max_size=4) as db:
        run = runs.start_run(db, provider_for("example"), "down", options={"counts": {"companies": 30}})
        dagster_run = DagsterRun(job_name="migrate_tenant", run_id="r-down", status=DagsterRunStatus.STARTED,
                                 tags={"migration/run_id": str(run.id)})
        instance.add_run(dagster_run)
        progress = Progress(as_json=False, instance=instance)
        progress.db = db
        progress.RETRIES_EVERY = 0.0
        with console.capture() as captured:
            progress(dagster_run)  # phase 1 running: 0 imported
            _observe(instance, dagster_run.run_id, {"seen": 0, "retries_in_progress": 3,
                                                    "retrying": "3 x ConnectError: connection refused"})
            progress(dagster_run)  # the counts have not moved: only the retries are news
            progress(dagster_run)  # said once, not on every poll
            _observe(instance, dagster_run.run_id, {"seen": 0, "retries_in_progress": 0})
            progress(dagster_run)  # the source answers again: nothing more about retries
        progress.db = None
        progress.close()
    lines = [ln.strip() for ln in captured.get().splitlines() if ln.strip()]
    retry_lines = [ln for ln in lines if "retrying" in ln]
    assert retry_lines == [f"phase 1/{len(run.plan)} ({', '.join(run.plan[0])}) retrying: 3 x ConnectError: "
                           f"connection refused: {run.name}"], lines
    assert len(lines) == 2, lines


def test_the_json_output_shows_its_progress_on_stderr_not_stdout(instance):
    """Under --json stdout is the JSON document alone: the progress lines go to stderr."""
    from migration_pipeline.cli.output import err_console
    from migration_pipeline.cli.progress import Progress

    assert Progress(as_json=True, instance=instance).out is err_console
    assert Progress(as_json=False, instance=instance).out is not err_console
