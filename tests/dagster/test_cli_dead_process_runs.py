"""After a `kill -9` of `migrate run` (its Dagster run executed in its own process), the commands a
user reaches for next end that Dagster run, as `migrate run` does before it counts the lane
(`launcher.fail_runs_of_dead_processes`): `migrate stop T --force`, `migrate resume T --drain`,
`migrate retry T --drain` (and without --drain, through the daemon check). The UI then shows the run
FAILURE with the reason (CANCELED when it was CANCELING); it had stayed STARTED until the next
`migrate run`.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test

from engine_core import runs
from engine_core.config import Settings
from engine_core.providers.registry import provider_for
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, open_instance, to_url
from migration_pipeline.jobs import TENANT_JOB
from migration_pipeline.launcher import IN_PROCESS_TAG

pytestmark = pytest.mark.timeout(180)
MIGRATE = str(Path(sys.executable).parent / "migrate")
SMALL = {"page_size": 20, "counts": {"companies": 10, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}


def _dead_identity() -> str:
    """IN_PROCESS_TAG of a process that has exited (a pid that no longer runs)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{socket.gethostname()}:{child.pid}:1"


@pytest.fixture
def project(engine_url, tmp_path):
    """The env `migrate` runs with (engine and Dagster storage on the test database, a private
    MIGRATE_HOME) and its Dagster instance."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=engine_url, MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(engine_url, scheme="postgresql+psycopg2")})
    saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", STORAGE_URL_ENV)}
    full = dagster_env(env=env)
    instance = open_instance(full)
    try:
        yield env, instance
    finally:
        instance.dispose()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _killed_run(instance, tenant: str, status: DagsterRunStatus = DagsterRunStatus.STARTED) -> str:
    run = create_run_for_test(instance, job_name=TENANT_JOB, status=status,
                              tags={"dagster/partition": tenant, IN_PROCESS_TAG: _dead_identity()})
    return run.run_id


@pytest.mark.parametrize("command", [["stop", "--force"], ["resume", "--drain"], ["retry", "--drain"]])
def test_stop_force_resume_and_retry_end_the_dagster_run_of_a_killed_migrate_run(project, db, command):
    env, instance = project
    tenant = f"killed-{command[0]}"
    engine_run = runs.start_run(db, provider_for("example"), tenant, options=SMALL)
    if command[0] != "stop":
        runs.stop(db, engine_run.id, Settings.from_env())
    dagster_run = _killed_run(instance, tenant)
    out = subprocess.run([MIGRATE, command[0], tenant, *command[1:]], env=env, capture_output=True, text=True,
                         timeout=120)
    run = instance.get_run_by_id(dagster_run)
    assert run.status == DagsterRunStatus.FAILURE, (run.status, out.stdout[-2000:], out.stderr[-2000:])
    assert f"ended 1 Dagster run(s) whose `migrate run` process is gone" in out.stdout, out.stdout[-2000:]
    assert dagster_run in out.stdout
    from dagster import DagsterEventType

    (failure,) = instance.get_records_for_run(dagster_run, of_type=DagsterEventType.RUN_FAILURE).records
    assert "is gone" in failure.event_log_entry.dagster_event.message, failure.event_log_entry.dagster_event.message


def test_resume_without_drain_ends_it_too_and_a_canceling_run_ends_canceled(project, db):
    env, instance = project
    engine_run = runs.start_run(db, provider_for("example"), "killed-nodrain", options=SMALL)
    runs.stop(db, engine_run.id, Settings.from_env())
    dagster_run = _killed_run(instance, "killed-nodrain", DagsterRunStatus.CANCELING)
    out = subprocess.run([MIGRATE, "resume", "killed-nodrain"], env=env, capture_output=True, text=True, timeout=120)
    # no daemon serves the instance: resume refuses (exit 2), the dead run is ended all the same
    assert out.returncode == 2, out.stderr[-2000:]
    assert instance.get_run_by_id(dagster_run).status == DagsterRunStatus.CANCELED, out.stdout + out.stderr
