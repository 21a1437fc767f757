"""`migrate run` submits its Dagster run from its own process (issue 11: `dagster job launch` in a
subprocess - a second Dagster import and a code server - was ~10 s of every run):

* the run is built here, with no child process, and queued with the job's tags, the partition tag,
  the run config, the run id and the remote origin `dagster job launch -m` records (the daemon's
  run launcher finds its code location by it); a daemon started as `migrate run` starts one
  dequeues it and it succeeds;
* a run config the job refuses is a LaunchError with Dagster's lines, and no run is created.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from dagster import DagsterRunStatus

from migration_pipeline import launch, stack, tags
import migration_pipeline.launch.checks
import migration_pipeline.launch.place
import migration_pipeline.launch.results
from migration_pipeline.instance import STORAGE_URL_ENV, open_instance
from tests.dagster.support import SMALL, example_env

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def instance_env(db_url, tmp_path, monkeypatch):
    """An instance on the test database (engine and Dagster's storage), source `example`."""
    for key in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MIGRATE_SOURCE", "example")
    env = example_env(db_url, tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    monkeypatch.setenv(STORAGE_URL_ENV, env[STORAGE_URL_ENV])
    monkeypatch.setenv("DATABASE_URL", env["DATABASE_URL"])  # the run config's {"env": "DATABASE_URL"}, resolved in-process
    instance = open_instance(env)
    yield instance, env
    instance.dispose()


def _no_child_process(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"a child process was started to submit the run: {args[:1]}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)


def test_a_run_submitted_in_process_is_queued_with_its_origin_and_the_daemon_runs_it(instance_env, monkeypatch):
    from dagster._core.workspace.load_target import ModuleTarget

    instance, env = instance_env
    # one kind: the run worker's claim is that it runs, not how much (the phases after the plan do nothing)
    config = launch.checks.new_run_config(kinds=["companies"], options=SMALL)
    assert launch.place.add_tenant(instance, "acme")
    with monkeypatch.context() as m:
        _no_child_process(m)
        run_id = launch.place.submit_tenant_run(instance, "acme", config, run_id="0f0e0d0c-0000-4000-8000-000000000001")
    assert run_id == "0f0e0d0c-0000-4000-8000-000000000001"
    run = instance.get_run_by_id(run_id)
    assert run.status == DagsterRunStatus.QUEUED
    assert run.job_name == launch.place.TENANT_JOB and run.run_config == config
    assert run.tags[tags.PARTITION] == "acme" and run.tags[tags.SOURCE] == "example"
    # the origin `dagster job launch -m migration_pipeline.definitions` records, from this directory
    (as_cli_launches,) = ModuleTarget(stack.DEFS_MODULE, None, os.getcwd(), None).create_origins()
    assert run.remote_job_origin.repository_origin.code_location_origin == as_cli_launches
    assert run.remote_job_origin.location_name == "migration_pipeline.definitions"
    daemon = stack.daemon(env, log_path=Path(env["DAGSTER_HOME"]) / "daemon.log")
    try:
        done = launch.place.wait_for_run(instance, run_id, timeout=180)
    finally:
        stack.stop(daemon)
    assert done.status == DagsterRunStatus.SUCCESS, launch.results.run_failure_message(instance, run_id)
    assert done.tags.get("migration/run_id"), "the phase op attached no engine run"


def test_a_refused_run_config_is_a_launch_error_with_dagsters_lines_and_no_run(instance_env):
    instance, _ = instance_env
    bad = {"resources": {"new_run": {"config": {"options_json": "{}", "no_such_field": 1}}}}
    with pytest.raises(launch.checks.LaunchError) as e:
        launch.place.submit_tenant_run(instance, "acme", bad, run_id="0f0e0d0c-0000-4000-8000-000000000002")
    assert "no_such_field" in str(e.value)
    assert instance.get_run_by_id("0f0e0d0c-0000-4000-8000-000000000002") is None
    with pytest.raises(launch.checks.LaunchError, match="no job 'no_such_job'"):
        launch.place.submit_tenant_run(instance, "acme", {}, job="no_such_job")


def test_migrate_run_new_run_submits_the_new_run_tag(instance_env):
    instance, _ = instance_env
    launch.place.add_tenant(instance, "again")
    run_id = launch.place.submit_tenant_run(instance, "again", launch.checks.new_run_config(), run_tags={tags.NEW_RUN: "true"})
    run = instance.get_run_by_id(run_id)
    assert run.tags[tags.NEW_RUN] == "true" and run.tags[tags.PARTITION] == "again"


def test_a_run_started_here_is_built_without_the_code_location_as_with_it(instance_env, monkeypatch):
    """A run `migrate run` executes in its own process is built from the loaded definitions
    (`place._job_here`: Dagster's in-process code location imports its gRPC server, ~0.07 s of a
    launch): the same run - snapshots, execution plan, tags, origins, planned events - as the code
    location's way builds (taken when the first way fails, and for a queued run)."""
    from tests.dagster.support import planned_rows

    from dagster._core.workspace import context

    instance, _ = instance_env
    config = launch.checks.new_run_config(["companies"])
    built, rows, workspaces = {}, {}, []
    process = context.WorkspaceProcessContext
    monkeypatch.setattr(context, "WorkspaceProcessContext", lambda *a, **k: workspaces.append(1) or process(*a, **k))
    for way in ("here", "code location"):
        if way == "code location":
            monkeypatch.setattr(launch.place, "_job_here", lambda *a: (_ for _ in ()).throw(RuntimeError("off")))
        tenant = f"acme-{len(built)}"  # a tenant each: the lane starts one run of a tenant at a time
        placed = launch.place.place_tenant_run(instance, tenant, config, start_here=True)
        assert placed.here and len(workspaces) == (0 if way == "here" else 1)
        run = instance.get_run_by_id(placed.run_id)
        assert run.tags[tags.PARTITION] == tenant and run.partitions_subset.key_ranges[0].start == tenant
        rows[way] = repr(planned_rows(instance, placed.run_id)).replace(tenant, "TENANT")
        built[way] = run._replace(run_id="", partitions_subset=None,
                                  tags={k: v for k, v in run.tags.items() if k != tags.PARTITION})
    assert built["here"] == built["code location"]
    assert "TENANT" in rows["here"] and rows["here"] == rows["code location"]
