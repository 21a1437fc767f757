"""One story (issue 10, item 3): the Dagster run's status is the engine run's.

* A stop from anywhere ends the Dagster run CANCELED: `migrate stop` (the engine's `runs.stop`)
  while a phase drains used to make it FAILURE, while the UI's Terminate made it CANCELED.
* A failed phase fails the engine run at that phase and the Dagster run with it; a drainer
  launched afterwards does no work on it.
* A run the drainers finish after a CLI retry materialises the phases it closed (the partition's
  last phase used to stay red).
* The run policy is the engine's (`runs.attach` / `runs.prepare`): a rerun of a stopped run resumes
  it, of a failed one retries it, and a drainer never starts a run.
"""
from __future__ import annotations

import threading
import time

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterRunStatus

from engine_core import runs
from engine_core.errors import RunNotFound
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import DRAINER_JOB
from tests.dagster.support import SMALL, materialize_tenant, resources, source_failing
from tests.engine.support import FAST

DEFS = build_definitions("example")


def _drain_with_a_drainer(instance, engine_url, tenant: str, engine_run_id: int, options=None):
    """A drainer run as the sensors launch it (partition + engine run tags), in process."""
    if tenant not in instance.get_dynamic_partitions("tenants"):
        instance.add_dynamic_partitions("tenants", [tenant])
    job = DEFS.resolve_job_def(DRAINER_JOB)
    return job.execute_in_process(
        instance=instance, partition_key=tenant, resources=resources(engine_url, options=options or SMALL),
        tags={tags.ENGINE_RUN: str(engine_run_id), tags.ROLE: tags.DRAINER}, raise_on_error=False,
    )


def _stop_when_draining(db, tenant: str, kind: str, done: threading.Event) -> None:
    """`migrate stop` from another process, as soon as the tenant's run has written some `kind`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        rows = db.sql("SELECT m.id FROM migrations m WHERE m.tenant_id = %(t)s AND EXISTS (SELECT 1 FROM"
                      " migration_records r WHERE r.migration_id = m.id AND r.kind = %(k)s)", {"t": tenant, "k": kind})
        if rows:
            runs.stop(db, rows[0]["id"])
            return
        time.sleep(0.05)


def test_a_stop_from_the_cli_ends_the_dagster_run_canceled_and_a_relaunch_resumes(instance, engine_url, db):
    slow = {**SMALL, "row_delay": 0.01}
    done = threading.Event()
    stopper = threading.Thread(target=_stop_when_draining, args=(db, "stopped", "contacts", done))
    stopper.start()
    try:
        result = materialize_tenant(instance, "stopped", resources(engine_url, options=slow))
    finally:
        done.set()
        stopper.join()
    assert not result.success
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    run = runs.latest_run(db, "stopped", "example")
    assert run.status in ("stopping", "stopped")

    again = materialize_tenant(instance, "stopped", resources(engine_url, options=SMALL), raise_on_error=True)
    assert instance.get_run_by_id(again.run_id).status == DagsterRunStatus.SUCCESS
    assert runs.get_run(db, run.id).status == "succeeded"  # the same engine run, resumed


def test_a_failed_phase_fails_the_engine_run_and_no_drainer_works_on_it(instance, engine_url, db):
    failing = {**SMALL, "fail_pages": {"contacts": [20]}}
    result = materialize_tenant(instance, "broken", resources(engine_url, options=failing))
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.FAILURE
    run = runs.latest_run(db, "broken", "example")
    assert (run.status, run.current_phase) == ("failed", 1)

    drained = _drain_with_a_drainer(instance, engine_url, "broken", run.id, failing)
    assert drained.success
    (out,) = [e for e in drained.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert out.event_specific_data.metadata["executed"].value == 0
    later = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND phase > 1", {"r": run.id})
    assert later[0]["n"] == 0 and runs.get_run(db, run.id).status == "failed"


def test_a_run_the_drainers_finish_after_a_cli_retry_materialises_the_phases_it_closed(instance, engine_url, db):
    failing = {**SMALL, "fail_pages": {"contacts": [20]}}
    first = materialize_tenant(instance, "finished", resources(engine_url, options=failing))
    assert not first.success
    run = runs.latest_run(db, "finished", "example")
    db.sql("UPDATE migrations SET options = options - 'fail_pages' WHERE id = %(id)s", {"id": run.id})
    runs.retry(db, run.id, provider_for("example", run), FAST)  # `migrate retry`

    drained = _drain_with_a_drainer(instance, engine_url, "finished", run.id)
    assert drained.success
    assert runs.get_run(db, run.id).status == "succeeded"
    by_drainer = {e.asset_key.path[-1] for e in drained.get_asset_materialization_events()}
    assert by_drainer == {"phase_2_contacts", "phase_3_deals", "phase_4_activities", "phase_5_notes"}
    for name in by_drainer:
        (record,) = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(["example", name]), asset_partitions=["finished"]), limit=1).records
        md = record.event_log_entry.asset_materialization.metadata
        assert md["engine_run_id"].value == run.id and md["failed_tasks"].value == 0

    # a later drainer turn does not materialise them again
    quiet = _drain_with_a_drainer(instance, engine_url, "finished", run.id)
    assert not quiet.get_asset_materialization_events()


def test_the_run_policy_is_the_engines(db):
    provider = provider_for("example")
    with pytest.raises(RunNotFound):
        runs.attach(db, provider, "policy", may_start=False)  # a drainer never starts a run
    started = runs.attach(db, provider, "policy", start_kwargs={"options": {"counts": {"companies": 1}}})
    assert started.action == "started"
    assert runs.attach(db, provider, "policy").action == "joined"
    assert runs.attach(db, provider, "policy", tagged_run_id=started.run.id).action == "attached"
    runs.stop(db, started.run.id)
    steps = runs.rerun(db, provider, "policy", settings=FAST)
    assert [s.action for s in steps] == ["rerun", "resumed"] or [s.action for s in steps] == ["rerun", "restarted"]


def test_a_source_failing_every_request_pauses_the_run_with_that_reason(instance, engine_url, db, monkeypatch):
    """Every source request fails (HTTP 500, retried) for longer than MIGRATE_SOURCE_DOWN_SECONDS:
    the run is paused - stopped with the reason in its log and the Dagster run CANCELED saying why -
    instead of retrying in silence; a relaunch resumes it once the source answers."""
    from engine_core import progress, rollup
    from migration_pipeline.assets import phases

    monkeypatch.setenv("MIGRATE_SOURCE_DOWN_SECONDS", "1")
    monkeypatch.setenv("MIGRATE_LAUNCH_THREADS", "1")  # one lane thread: the phase lasts long enough
    monkeypatch.setattr(phases, "PROGRESS_SECONDS", 0.2)
    metrics = progress.SourceMetrics()
    monkeypatch.setattr(progress, "source_metrics", metrics)
    with source_failing(metrics):
        result = materialize_tenant(instance, "down", resources(engine_url, options={**SMALL, "row_delay": 0.02}))
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    messages = [r.user_message for r in instance.all_logs(result.run_id)]
    assert any("pausing the run: the source failed every request for" in m and "(last: HTTP 500)" in m for m in messages)
    run = runs.latest_run(db, "down", "example")
    assert run.status in ("stopping", "stopped")
    reasons = rollup.rollup(db, run.id).reasons
    assert any(g["reason"].startswith("paused: the source failed every request") for g in reasons), reasons

    monkeypatch.setattr(progress, "source_metrics", progress.SourceMetrics())  # the source answers again
    again = materialize_tenant(instance, "down", resources(engine_url, options=SMALL), raise_on_error=True)
    assert again.success and runs.get_run(db, run.id).status == "succeeded"
