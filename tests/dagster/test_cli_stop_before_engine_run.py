"""A `migrate run` stopped (Ctrl-C, SIGTERM) after its launch but before its Dagster run reached an
engine run says what is true and leaves no Dagster run in progress:

* no engine run of the tenant: "no engine run was started ... `migrate run --tenant T` starts one"
  (it had said "resumes it", while `migrate status T` said the tenant had no run);
* an unfinished engine run the relaunch would attach: it names that run, which is what resumes;
* the Dagster run, still STARTED (or queued) once the stop's wait is over, ends CANCELED with the
  reason, so the tenant's partition does not show a run in progress for ever.
"""
from __future__ import annotations

import functools
import signal

import pytest
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test

from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline import launch
import migration_pipeline.launch.place
import migration_pipeline.launch.signals
import migration_pipeline.launch.stop
from migration_pipeline.cli.launching import stop_what_we_started

pytestmark = pytest.mark.timeout(120)


class NoDaemonOfOurs:
    proc = None

    def close(self, limit: float) -> None:
        pass


def _stop(instance, monkeypatch, capsys, tenant: str) -> tuple[list[str], DagsterRunStatus]:
    """A STARTED Dagster run of the tenant job whose worker started (RUN_START) but never attached an
    engine run, and does not answer the terminate (stuck before the phase op, or gone), stopped as an
    interrupted `migrate run` stops it; its stderr lines and status."""
    from dagster._core.events import DagsterEvent, DagsterEventType

    run = create_run_for_test(instance, job_name=launch.place.TENANT_JOB, status=DagsterRunStatus.STARTED,
                              tags={"dagster/partition": tenant})
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_START.value, job_name=launch.place.TENANT_JOB),
                                  run_id=run.run_id)
    assert launch.stop.worker_started(instance, run.run_id)
    # the stop's own wait (60 s for a run worker to end the run) shortened: no worker will
    monkeypatch.setattr(launch.stop, "stop_launched_run", functools.partial(launch.stop.stop_launched_run, wait=0.5))
    stop_what_we_started(instance, NoDaemonOfOurs(), run.run_id, tenant, launch.signals.Interrupted(signal.SIGINT), "example")
    return capsys.readouterr().err.splitlines(), instance.get_run_by_id(run.run_id).status


def test_stopped_before_any_engine_run_says_nothing_was_started_and_ends_the_dagster_run(
        instance, engine_url, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", engine_url)
    lines, status = _stop(instance, monkeypatch, capsys, "fresh")
    assert status == DagsterRunStatus.CANCELED, lines
    assert lines[0] == "SIGINT: stopping what this command started", lines
    last = lines[-1]
    assert last.startswith("Dagster run ") and ": CANCELED; no engine run was started" in last, lines
    assert last.endswith("`migrate run --tenant fresh` starts one"), lines
    assert "resumes" not in last, lines


def test_stopped_before_attaching_names_the_engine_run_a_relaunch_resumes(instance, engine_url, db, monkeypatch, capsys):
    monkeypatch.setenv("DATABASE_URL", engine_url)
    earlier = runs.start_run(db, provider_for("example"), "halfway", options={"page_size": 20})
    lines, status = _stop(instance, monkeypatch, capsys, "halfway")
    assert status == DagsterRunStatus.CANCELED, lines
    assert lines[-1].endswith(f"it had not reached an engine run yet ({earlier.name} is running); "
                              f"`migrate run --tenant halfway` resumes {earlier.name}"), lines
