"""Ctrl-C while the run `migrate run` launched is STARTING on a daemon it did not start (the UI's,
or one started by hand) ends the run CANCELED, not FAILURE (issue 10's leftover).

The launcher cannot reach a run worker that has not started: the terminate request leaves the run
CANCELING, the worker that starts next finds it so and executes nothing, and Dagster then marked it
FAILURE ("marked as failed from outside the execution context"). The command marks it CANCELED as
soon as its terminate request is sent to a run no worker has started, whichever daemon serves it.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterRunStatus, RunsFilter

from migration_pipeline import launch, stack, tags
import migration_pipeline.launch.daemon
from tests.dagster.support import example_instance

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")


@pytest.fixture
def hand_daemon(db_url, tmp_path, monkeypatch):
    """An instance on the test database, source `example`, served by a daemon no `migrate` started."""
    instance, env = example_instance(db_url, tmp_path, monkeypatch)
    started = time.time()
    daemon = stack.daemon(env, log_path=tmp_path / "hand-daemon.log")
    try:
        deadline = time.monotonic() + 120
        while launch.daemon.newest_heartbeat_id(instance, started) is None:
            assert daemon.poll() is None and time.monotonic() < deadline, (tmp_path / "hand-daemon.log").read_text()[-3000:]
            time.sleep(0.2)
        yield instance, env
    finally:
        stack.stop(daemon)
        instance.dispose()


def _worker_exited(instance, run_id: str) -> bool:
    return any("Process for run exited" in (r.event_log_entry.dagster_event.message or "")
               for r in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records)


def test_ctrl_c_while_the_run_is_starting_on_a_daemon_not_ours_ends_it_canceled(hand_daemon):
    instance, env = hand_daemon
    options = '{"page_size": 20, "counts": {"companies": 45, "contacts": 70, "deals": 50, "activities": 40, "notes": 30}}'
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "acme", "--options", options, "--timeout", "200"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        run = None
        while run is None or run.status != DagsterRunStatus.STARTING:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            found = instance.get_runs(filters=RunsFilter(tags={tags.PARTITION: "acme"}))
            run = found[0] if found else None
            assert run is None or run.status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED,
                                                 DagsterRunStatus.STARTING), \
                f"the run went {run.status} before the test could catch it STARTING"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # the user's Ctrl-C, ~1 s after the launch line
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    deadline = time.monotonic() + 30  # the worker that starts next finds the run canceled and exits
    while time.monotonic() < deadline and not _worker_exited(instance, run.run_id):
        time.sleep(0.5)
    final = instance.get_run_by_id(run.run_id)
    assert final.status == DagsterRunStatus.CANCELED, (final.status, err[-3000:])
    assert not instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_START).records, \
        "nothing was executed"
    assert f"Dagster run {run.run_id}: CANCELED" in err
