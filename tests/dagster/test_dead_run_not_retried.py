"""Dagster never re-executes on its own a run whose in-process executor (`migrate run`) was killed:
whether `migrate run` / `resume` ends it (`launcher.fail_runs_of_dead_processes`) or a daemon's run
monitoring does (`MigrationRunLauncher.check_run_worker_health`), the failure is not retried, with
`run_retries` enabled. The engine run stays resumable by hand or by the daemon's drainers; a retry
would have re-executed it whenever a daemon next read the failure, after the tenant was resumed,
stopped or finished meanwhile. A run failing on its own is still retried (the control).
"""
from __future__ import annotations

import socket
import subprocess

from dagster import DagsterRunStatus
from dagster._core.storage.tags import WILL_RETRY_TAG
from dagster._core.test_utils import create_run_for_test
from dagster._core.launcher.base import WorkerStatus

from migration_pipeline import tags
from migration_pipeline.launcher import IN_PROCESS_TAG, MigrationRunLauncher, fail_runs_of_dead_processes
from tests.dagster.support import tmpfs_instance

RETRIES = {"run_retries": {"enabled": True, "max_retries": 2}}


def _dead_identity() -> str:
    """IN_PROCESS_TAG of a process that has exited (a pid that no longer runs)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{socket.gethostname()}:{child.pid}:1"


def _will_retry(instance, run_id: str) -> str | None:
    return instance.get_run_by_id(run_id).tags.get(WILL_RETRY_TAG)


def test_a_run_whose_in_process_executor_died_is_failed_without_a_retry():
    with tmpfs_instance(overrides=RETRIES) as instance:
        other = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                                    tags={tags.PARTITION: "left"})
        instance.report_run_failed(other)
        assert _will_retry(instance, other.run_id) == "true"  # the control: retries are on

        dead = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                                   tags={tags.PARTITION: "killed", IN_PROCESS_TAG: _dead_identity()})
        assert fail_runs_of_dead_processes(instance) == [dead.run_id]
        assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
        assert _will_retry(instance, dead.run_id) == "false"


def test_run_monitoring_fails_a_dead_in_process_run_without_a_retry():
    with tmpfs_instance(overrides=RETRIES) as instance:
        launcher = MigrationRunLauncher()
        launcher.register_instance(instance)
        dead = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                                   tags={tags.PARTITION: "killed", IN_PROCESS_TAG: _dead_identity()})
        health = launcher.check_run_worker_health(dead)
        assert health.status == WorkerStatus.FAILED
        instance.report_run_failed(dead, message=health.msg)  # what run monitoring does with FAILED
        assert _will_retry(instance, dead.run_id) == "false"
