"""A `migrate run` stopped by a signal stops what it started (issue 10, a fresh user's find: a
SIGTERM'd `migrate run` left the daemon it had started running and its queued Dagster run QUEUED
for ever).

Real processes and signals on a real Postgres: `migrate run` against a sandbox account, then
SIGTERM (or SIGHUP) to the command alone. Afterwards the daemon it started is gone, the Dagster
run it launched is CANCELED (not QUEUED, not STARTED), the engine run it drove is stopping or
stopped (resumable, never left running for drainers), and the command exits 128 + the signal.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterRun, DagsterRunStatus, RunsFilter

from migration_pipeline import launch
import migration_pipeline.launch.statuses
from migration_pipeline.partitions import TENANTS
from tests.dagster.support import instance_of, migrate_env, sandbox_account

MIGRATE = str(Path(sys.executable).parent / "migrate")
pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def slow_source_env(db_url, tmp_path):
    """A sandbox account slow enough (realistic latency) that a run is still working when signalled."""
    # The daemon path (MIGRATE_RUN_IN_PROCESS=0): with no daemon alive `migrate run` now executes in
    # its own process; these tests prove what a command that started a daemon does on a signal (the
    # in-process path's signals: test_launch_in_process.py).
    with sandbox_account(scale="small", latency="realistic") as base_url:
        yield migrate_env(db_url, str(tmp_path / "home"), base_url, MIGRATE_RUN_IN_PROCESS="0")


_instance = instance_of


def _start(env: dict[str, str], tenant: str) -> subprocess.Popen:
    return subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _until(what: str, check, limit: float = 180.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _daemon_pid(env: dict[str, str]) -> int | None:
    """The pid of the daemon `migrate run` started, from the instance's lock file."""
    home = Path(env["MIGRATE_HOME"]) / "dagster"
    for path in home.glob("daemon-*.lock"):
        info = json.loads(path.read_text() or "{}")
        if info.get("by") == "migrate run" and info.get("pid") and info["pid"] != 0:
            return int(info["pid"])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def _signal_and_finish(proc: subprocess.Popen, signo: int) -> tuple[str, str]:
    proc.send_signal(signo)  # the command alone: its daemon runs in a session of its own
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 128 + signo, (proc.returncode, out[-2000:], err[-3000:])
    assert "Traceback" not in err, err[-3000:]
    return out, err


def test_sigterm_while_running_stops_the_dagster_run_the_engine_run_and_the_daemon(slow_source_env, db_url):
    env = slow_source_env
    proc = _start(env, "sig-run")
    instance = _instance(env)
    try:
        def started_and_attached():
            runs_ = instance.get_runs(RunsFilter(tags={"dagster/partition": "sig-run"}, statuses=[DagsterRunStatus.STARTED]))
            return next((r for r in runs_ if r.tags.get("migration/run_id")), None)

        dagster_run: DagsterRun = _until("a started Dagster run attached to an engine run", started_and_attached)
        daemon = _daemon_pid(env)
        assert daemon and _alive(daemon), "the command did not start a daemon of its own"
        with psycopg.connect(db_url) as c:
            assert c.execute("SELECT status FROM migrations WHERE id = %s",
                             (int(dagster_run.tags["migration/run_id"]),)).fetchone()[0] == "running"
        out, err = _signal_and_finish(proc, signal.SIGTERM)
        assert "SIGTERM: stopping what this command started" in err, err[-2000:]
        assert not _alive(daemon), "the daemon the command started outlived it"
        assert instance.get_run_by_id(dagster_run.run_id).status == DagsterRunStatus.CANCELED
        with psycopg.connect(db_url) as c:
            engine = c.execute("SELECT status FROM migrations WHERE id = %s",
                               (int(dagster_run.tags["migration/run_id"]),)).fetchone()[0]
        assert engine in ("stopping", "stopped"), f"the engine run is {engine} after the command was stopped"
        assert not instance.get_runs(RunsFilter(statuses=launch.statuses.IN_FLIGHT)), "a run of the command is still in flight"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()


def test_sighup_while_queued_cancels_the_queued_run_and_stops_the_daemon(slow_source_env, db_url):
    env = dict(slow_source_env, MIGRATE_LANE_WIDTH="1")
    instance = _instance(env)
    # the lane is full: a run of another tenant in progress (a record, no process), so ours queues
    instance.add_dynamic_partitions(TENANTS, ["other"])
    instance.add_run(DagsterRun(job_name="migrate_tenant", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED,
                                tags={"dagster/partition": "other"}))
    proc = _start(env, "sig-queued")
    try:
        queued = _until("the command's run queued behind the full lane", lambda: next(iter(instance.get_runs(
            RunsFilter(tags={"dagster/partition": "sig-queued"}, statuses=[DagsterRunStatus.QUEUED]))), None))
        daemon = _until("the command's daemon", lambda: _daemon_pid(env))
        time.sleep(3)  # a few of the daemon's dequeue passes: still queued (the lane is full)
        assert instance.get_run_by_id(queued.run_id).status == DagsterRunStatus.QUEUED
        out, err = _signal_and_finish(proc, signal.SIGHUP)
        assert instance.get_run_by_id(queued.run_id).status == DagsterRunStatus.CANCELED, err[-3000:]
        assert not _alive(daemon), "the daemon the command started outlived it"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()

