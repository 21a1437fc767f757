"""The instance's run launcher (migration_pipeline/launcher.py): the UI's Terminate of a run that
`migrate run` executes in its own process is answered as delivered, not "Unable to terminate"."""
from __future__ import annotations

from dagster import DagsterRunStatus
from dagster._core.storage.tags import GRPC_INFO_TAG

from migration_pipeline.launcher import DELIVERED, MigrationRunLauncher
from tests.dagster.support import example_instance


def _run(instance, status: DagsterRunStatus, tags: dict[str, str] | None = None):
    from dagster._core.test_utils import create_run_for_test

    return create_run_for_test(instance, job_name="migrate_tenant", status=status, tags=tags or {})


def test_terminate_of_a_run_executed_in_its_own_process_is_delivered_through_canceling(db_url, tmp_path, monkeypatch):
    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        assert isinstance(instance.run_launcher, MigrationRunLauncher)  # dagster.yaml names it
        run = _run(instance, DagsterRunStatus.STARTED)  # no dagster/grpc_info: no code server knows it
        assert instance.run_launcher.terminate(run.run_id) is True
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELING
        messages = [e.message for e in instance.all_logs(run.run_id)]
        assert any(m.endswith(DELIVERED) for m in messages)
        assert not any("Unable to get grpc client" in m for m in messages)

        done = _run(instance, DagsterRunStatus.SUCCESS)
        assert instance.run_launcher.terminate(done.run_id) is False  # finished: nothing to stop
        assert instance.run_launcher.terminate("no-such-run") is False
    finally:
        instance.dispose()


def test_a_run_launched_through_a_code_server_is_not_answered_for(db_url, tmp_path, monkeypatch):
    """A run whose code server is gone keeps Dagster's answer (False): nobody polls for it here."""
    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        grpc = '{"host": "127.0.0.1", "port": 1, "socket": null, "use_ssl": false}'
        run = _run(instance, DagsterRunStatus.STARTED, {GRPC_INFO_TAG: grpc})
        try:
            answered = instance.run_launcher.terminate(run.run_id)
        except Exception:  # noqa: BLE001 - Dagster's own error for an unreachable code server
            answered = False
        assert answered is False
        assert not any(e.message.endswith(DELIVERED) for e in instance.all_logs(run.run_id))
    finally:
        instance.dispose()


# -- a run whose in-process executor died ------------------------------------------------------------


def _dead_identity() -> str:
    """The identity of a process that existed and is gone (a child that exited)."""
    import subprocess

    from migration_pipeline.launcher import process_identity

    child = subprocess.Popen(["sleep", "30"])
    identity = process_identity(child.pid)
    child.kill()
    child.wait()
    return identity


def test_executor_gone_tells_a_dead_or_reused_pid_from_a_live_one_and_leaves_other_hosts_alone():
    import os
    import socket

    from migration_pipeline.launcher import executor_gone, process_identity

    assert executor_gone(process_identity()) is None  # this very process
    dead = _dead_identity()
    pid = dead.split(":")[-2]
    assert f"pid {pid}" in (executor_gone(dead) or "")
    host, mine, start = process_identity().rsplit(":", 2)
    assert executor_gone(f"{host}:{mine}:{int(start) + 1}")  # the pid now names another process
    assert executor_gone(f"{socket.gethostname()}-elsewhere:{os.getpid() + 99999}:1") is None  # cannot tell
    assert executor_gone("not an identity") is None


def test_runs_of_dead_executors_end_and_nothing_else_does(db_url, tmp_path, monkeypatch):
    from dagster._core.launcher.base import WorkerStatus

    from migration_pipeline.launcher import IN_PROCESS_TAG, fail_runs_of_dead_processes, process_identity

    instance, _ = example_instance(db_url, tmp_path, monkeypatch)
    try:
        dead = _dead_identity()
        orphan = _run(instance, DagsterRunStatus.STARTED, {IN_PROCESS_TAG: dead})
        stopping = _run(instance, DagsterRunStatus.CANCELING, {IN_PROCESS_TAG: dead})
        alive = _run(instance, DagsterRunStatus.STARTED, {IN_PROCESS_TAG: process_identity()})
        worker = _run(instance, DagsterRunStatus.STARTED)  # a code server's run worker executes it
        health = instance.run_launcher.check_run_worker_health
        assert instance.run_launcher.supports_check_run_worker_health
        assert health(orphan).status == WorkerStatus.FAILED and "is gone" in health(orphan).msg
        assert health(alive).status == WorkerStatus.RUNNING and health(worker).status == WorkerStatus.RUNNING

        assert sorted(fail_runs_of_dead_processes(instance)) == sorted([orphan.run_id, stopping.run_id])
        status = {r.run_id: instance.get_run_by_id(r.run_id).status for r in (orphan, stopping, alive, worker)}
        assert status == {orphan.run_id: DagsterRunStatus.FAILURE, stopping.run_id: DagsterRunStatus.CANCELED,
                          alive.run_id: DagsterRunStatus.STARTED, worker.run_id: DagsterRunStatus.STARTED}
        assert any("is gone" in (e.message or "") for e in instance.all_logs(orphan.run_id))
    finally:
        instance.dispose()
