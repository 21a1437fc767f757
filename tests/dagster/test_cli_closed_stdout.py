"""`migrate run` whose stdout's reader has gone (`migrate run --tenant T | head -2`), for real: a
subprocess against a sandbox account, its stdout a pipe closed early.

* SIGINT and SIGTERM still stop it as on a live terminal: exit 128 + the signal, the stop said on
  stderr, the Dagster run CANCELED, no traceback. rich's Console had answered the first write to
  the closed pipe with SystemExit(1) from the in-process run's watcher thread (which prints the
  progress), ending the thread silently, and with it the handling of the signals: the run went on
  to SUCCESS (a fresh user's find).
* A closed stdout does not stop the run by itself: the run goes on until it is stopped, and one
  that is left alone ends SUCCESS with exit 0 and no traceback (the first write to the closed pipe
  had ended the command with exit 1 there, its run just placed).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, RunsFilter

from migration_pipeline import tags
from tests.dagster.support import instance_of, migrate_env, sandbox_account

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")


@pytest.fixture(scope="module")
def slow_account():
    """A sandbox account slow enough (realistic latency) that a run is still working when stopped;
    one server for the module (the runs only read it; each test has its own database and home)."""
    with sandbox_account(scale="small", latency="realistic") as base_url:
        yield base_url


def _started_run(instance, tenant: str):
    found = instance.get_runs(RunsFilter(tags={tags.PARTITION: tenant}))
    return next((r for r in found if r.tags.get("migration/run_id")), None)


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_still_stops_a_run_whose_stdout_was_closed(db_url, tmp_path, slow_account, signo):
    env = migrate_env(db_url, str(tmp_path / "home"), slow_account)
    tenant = f"piped-{signo}"
    err_path = tmp_path / "stderr"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=env,
                                stdout=subprocess.PIPE, stderr=err_file, start_new_session=True)
    instance = instance_of(env)
    try:
        first = [proc.stdout.readline() for _ in range(2)]  # `| head -2`
        assert all(first), (first, err_path.read_text()[-2000:])
        proc.stdout.close()
        # the progress lines go on being written (on a change, at least every 10 s) to the closed pipe
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            assert proc.poll() is None, (proc.returncode, err_path.read_text()[-3000:])
            time.sleep(0.5)
        run = _started_run(instance, tenant)
        assert run is not None and run.status == DagsterRunStatus.STARTED, run and run.status
        proc.send_signal(signo)  # the command alone, as a terminal's Ctrl-C or a kill
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{signal.Signals(signo).name} did not stop `migrate run` with its stdout closed "
                                 f"(run {instance.get_run_by_id(run.run_id).status}): {err_path.read_text()[-3000:]}")
        err = err_path.read_text()
        name = signal.Signals(signo).name
        assert proc.returncode == 128 + signo, (proc.returncode, err[-3000:])
        assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
        assert err.count(f"{name}: stopping what this command started") == 1, err[-3000:]
        assert f"Dagster run {run.run_id}: CANCELED" in err, err[-3000:]
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()


def test_a_closed_stdout_alone_does_not_stop_the_run(db_url, tmp_path):
    with sandbox_account(scale="tiny") as base_url:
        env = migrate_env(db_url, str(tmp_path / "home"), base_url)
        err_path = tmp_path / "stderr"
        with err_path.open("w") as err_file:
            proc = subprocess.Popen([MIGRATE, "run", "--tenant", "gone", "--kinds", "users", "--timeout", "200"],
                                    env=env, stdout=subprocess.PIPE, stderr=err_file, start_new_session=True)
        proc.stdout.close()  # `| head -0`: every line the command prints meets a closed pipe
        try:
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    err = err_path.read_text()
    assert proc.returncode == 0, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    instance = instance_of(env)
    try:
        run = _started_run(instance, "gone")
        assert run is not None and run.status == DagsterRunStatus.SUCCESS, run and run.status
    finally:
        instance.dispose()
