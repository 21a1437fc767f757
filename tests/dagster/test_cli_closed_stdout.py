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

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, RunsFilter
from psycopg import conninfo

from migration_pipeline import tags
from tests.dagster.support import instance_of, migrate_env, sandbox_account, side_by_side

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")
# instance_of reads its storage URL through this process's environment: one opening at a time
_OPENING = threading.Lock()


@pytest.fixture(scope="module")
def slow_account():
    """A sandbox account slow enough (realistic latency) that a run is still working when stopped;
    one server for the module (the runs only read it; each test has its own database and home)."""
    with sandbox_account(scale="small", latency="realistic") as base_url:
        yield base_url


def _started_run(instance, tenant: str):
    found = instance.get_runs(RunsFilter(tags={tags.PARTITION: tenant}))
    return next((r for r in found if r.tags.get("migration/run_id")), None)


def _a_signal_stops_the_run(env: dict[str, str], tmp_path: Path, signo: int) -> None:
    """`migrate run` on `env`, its stdout closed after two lines, then `signo` to the command alone."""
    tenant = f"piped-{signo}"
    err_path = tmp_path / f"stderr-{signo}"
    with err_path.open("w") as err_file:
        proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=env,
                                stdout=subprocess.PIPE, stderr=err_file, start_new_session=True)
    instance = None
    try:
        first = [proc.stdout.readline() for _ in range(2)]  # `| head -2`
        assert all(first), (first, err_path.read_text()[-2000:])
        proc.stdout.close()
        with _OPENING:  # once the command has made its storage (made here too, they raced)
            instance = instance_of(env)
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
        if instance is not None:
            instance.dispose()


@pytest.fixture
def other_db_url(server_url: str, clones) -> Iterator[str]:
    """A second database of the test's own (as `db_url`): the SIGTERM command's engine and storage."""
    name = clones.take()
    try:
        yield conninfo.make_conninfo(server_url, dbname=name)
    finally:
        clones.give_back(name)


def test_sigint_and_sigterm_still_stop_a_run_whose_stdout_was_closed(db_url, other_db_url, tmp_path, slow_account):
    """SIGINT and SIGTERM side by side (each its own command, database and home, on the module's
    slow account): the twelve seconds each waits with its stdout closed overlap. Each failure is
    named by its signal (this was test_a_signal_still_stops_a_run_whose_stdout_was_closed[SIGINT]
    and [SIGTERM])."""
    envs = {signal.SIGINT: migrate_env(db_url, str(tmp_path / "home-int"), slow_account),
            signal.SIGTERM: migrate_env(other_db_url, str(tmp_path / "home-term"), slow_account)}
    side_by_side({signo.name: functools.partial(_a_signal_stops_the_run, env, tmp_path, signo)
                  for signo, env in envs.items()}, timeout=280)


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
