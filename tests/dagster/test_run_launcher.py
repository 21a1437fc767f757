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
