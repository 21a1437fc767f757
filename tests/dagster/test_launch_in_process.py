"""`migrate run` executes its Dagster run in its own process when no daemon serves the instance
(issue 11, "Dagster costs little": a daemon, its code server and a run worker each imported Dagster
anew, ~8 s of every small run), and keeps every promise of the daemon path:

* the run executes in the command's process (the run's "Started process for run (pid: N)" is the
  command's pid), and no `dagster-daemon`, `dagster api` (code server, run worker) or `dagster
  code-server` process is started meanwhile; no daemon heartbeat is ever written;
* the UI's Terminate (`run_coordinator.cancel_run` -> `run_launcher.terminate`, from another
  process, as the webserver calls it: with no gRPC client for the run it only marks it CANCELING)
  ends the run CANCELED and stops the engine run (resumable);
* SIGINT / SIGTERM on the command end the run CANCELED (not FAILURE: the signal reaches the
  execution only after the run is CANCELING), the engine run stopping or stopped, exit 128 + the
  signal, the stop said once;
* the lane: a run starts here only when the run queue's limits leave room, counted under a lock
  every `migrate run` shares (two commands never both take the last slot); otherwise it is queued;
* with a daemon alive the run is queued and the daemon's run worker executes it, as before;
* MIGRATE_RUN_IN_PROCESS other than 1/0 is one line naming the variable, nothing launched.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterEventType, DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter

from migration_pipeline import launch, stack, tags
from migration_pipeline.cli import output
import migration_pipeline.launch.checks
import migration_pipeline.launch.daemon
import migration_pipeline.launch.in_process
import migration_pipeline.launch.place
import migration_pipeline.launch.statuses
from migration_pipeline.instance import STORAGE_URL_ENV, open_instance
from tests.dagster.support import SMALL, example_env, instance_of, migrate_env, sandbox_account

pytestmark = pytest.mark.timeout(420)
MIGRATE = str(Path(sys.executable).parent / "migrate")
# What the daemon path starts: the daemon, its code server and run workers (`dagster api grpc`,
# `dagster api execute_run`), or a code server by another name.
DAEMON_PATH_PROCESSES = ("dagster-daemon", "dagster api", "dagster code-server", "dagster-webserver")


@pytest.fixture
def tiny_env(db_url, tmp_path):
    with sandbox_account(scale="tiny") as base_url:
        yield migrate_env(db_url, str(tmp_path / "home"), base_url)


@pytest.fixture(scope="module")
def slow_account():
    """A sandbox account slow enough (realistic latency) that a run is still working when stopped:
    one server for the module (the runs only read it; each test has its own database and home)."""
    with sandbox_account(scale="small", latency="realistic") as base_url:
        yield base_url


@pytest.fixture
def slow_env(db_url, tmp_path, slow_account):
    return migrate_env(db_url, str(tmp_path / "home"), slow_account)


_instance = instance_of


def _descendants(pid: int) -> dict[int, str]:
    """Every live descendant of `pid`: {pid: command line}."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                except OSError:
                    found[child] = "?"
                frontier.append(child)
    return found


def _executed_by(instance: DagsterInstance, run_id: str) -> int | None:
    """The pid in the run's "Started process for run (pid: N)" engine event: the process that
    executed it (a run worker's, or `migrate run`'s own)."""
    for record in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
        found = re.search(r"Started process for run \(pid: (\d+)\)", record.event_log_entry.dagster_event.message or "")
        if found:
            return int(found.group(1))
    return None


def _until(what: str, check, limit: float = 180.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command exited ({proc.returncode}) before {what}: {proc.communicate()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _engine_status(db_url: str, engine_run: str) -> str:
    with psycopg.connect(db_url) as c:
        return c.execute("SELECT status FROM migrations WHERE id = %s", (int(engine_run),)).fetchone()[0]


def test_the_run_executes_in_the_commands_process_and_no_daemon_code_server_or_worker_starts(tiny_env):
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "here", "--kinds", "users", "--json", "--timeout", "240"],
                            env=tiny_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen: dict[int, str] = {}
    try:
        # every process the command starts, while it runs: each of the daemon path's imports Dagster
        # (seconds of life), so a look every 0.2 s sees it (a look costs ~20 ms of CPU: every 0.05 s
        # it took a quarter of a core from the command)
        while proc.poll() is None:
            seen.update(_descendants(proc.pid))
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    result = json.loads(out)
    assert result["dagster_status"] == "SUCCESS" and result["engine"]["status"] == "succeeded", out[-2000:]
    started = [cmd[:120] for cmd in seen.values() if any(name in cmd for name in DAEMON_PATH_PROCESSES)]
    assert not started, f"the command started Dagster processes: {started}"
    instance = _instance(tiny_env)
    try:
        assert _executed_by(instance, result["dagster_run_id"]) == proc.pid, "the run was not executed by the command"
        assert not instance.get_daemon_heartbeats(), "a daemon ran on the instance"
        run = instance.get_run_by_id(result["dagster_run_id"])
        assert run.tags[tags.PARTITION] == "here" and run.tags.get("migration/run_id")
        assert run.remote_job_origin.location_name == stack.DEFS_MODULE, "the UI finds its code location"
        materialized = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION).records
        assert materialized, "the phases materialised in the run's events"
    finally:
        instance.dispose()


def _started_and_attached(instance: DagsterInstance, tenant: str):
    def check():
        found = instance.get_runs(RunsFilter(tags={tags.PARTITION: tenant}, statuses=[DagsterRunStatus.STARTED]))
        return next((r for r in found if r.tags.get("migration/run_id")), None)
    return check


def test_the_uis_terminate_ends_an_in_process_run_canceled_and_stops_the_engine_run(slow_env, db_url):
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "ui-stop", "--timeout", "400"], env=slow_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    instance = _instance(slow_env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, "ui-stop"), proc=proc)
        assert _executed_by(instance, run.run_id) == proc.pid
        # what the webserver's Terminate calls (dagster_graphql: run_coordinator.cancel_run -> the run
        # launcher): no gRPC client for this run, so it is only marked CANCELING (the project's
        # launcher says so, migration_pipeline.launcher; Dagster's own would answer False)
        assert instance.run_coordinator.cancel_run(run.run_id)
        out, err = proc.communicate(timeout=120)
        # stopped from elsewhere: not 1 (failed), and one line as a Ctrl-C's, not the tables, the
        # "what now" and the phase step's "launch the partition again" on stdout and stderr both
        assert proc.returncode == output.STOPPED_ELSEWHERE, (proc.returncode, out[-2000:], err[-3000:])
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED
        engine = run.tags["migration/run_id"]
        said = [ln for ln in (out + err).splitlines() if "resumes it" in ln]
        assert len(said) == 1 and re.search(rf"^run #{engine} \(.*\) stopped by a Terminate from elsewhere \(the "
                                            rf"Dagster UI's\)(; | \(still stopping).*`migrate run --tenant ui-stop` "
                                            rf"resumes it where it stopped \(Dagster run {run.run_id}: CANCELED\)$",
                                            said[0]), said
        assert "what now" not in out and "launch the partition" not in out + err and " failed: " not in out + err, out + err
        assert _engine_status(db_url, run.tags["migration/run_id"]) in ("stopping", "stopped")
        assert not instance.get_runs(RunsFilter(statuses=launch.statuses.IN_FLIGHT)), "a run is still in flight"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_an_in_process_run_canceled_and_stops_the_engine_run(slow_env, db_url, signo):
    from dagster._core.storage.tags import MAX_RETRIES_TAG

    tenant = f"sig-{signo}"
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=slow_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    instance = _instance(slow_env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, tenant), proc=proc)
        proc.send_signal(signo)  # the command alone, as a terminal's Ctrl-C or a kill
        out, err = proc.communicate(timeout=120)
        name = signal.Signals(signo).name
        assert proc.returncode == 128 + signo, (proc.returncode, out[-2000:], err[-3000:])
        assert "Traceback" not in err, err[-3000:]
        assert err.count(f"{name}: stopping what this command started") == 1, err[-3000:]
        # the one line a stop from elsewhere ends with too: who stopped it, how it resumes
        by = "this command's Ctrl-C (SIGINT)" if signo == signal.SIGINT else "SIGTERM to this command"
        said = [ln for ln in (out + err).splitlines() if "resumes it" in ln]
        assert len(said) == 1 and f" stopped by {by}" in said[0] and \
            f"`migrate run --tenant {tenant}` resumes it where it stopped (Dagster run {run.run_id}: CANCELED" in said[0], said
        assert "what now" not in out + err, out[-2000:]
        final = instance.get_run_by_id(run.run_id)
        assert final.status == DagsterRunStatus.CANCELED, final.status
        assert final.tags.get(MAX_RETRIES_TAG) == "0", "a stop the user asked for is not retried"
        assert _engine_status(db_url, run.tags["migration/run_id"]) in ("stopping", "stopped")
        assert not instance.get_daemon_heartbeats(), "a daemon ran on the instance"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()


# -- the lane, and the daemon path ------------------------------------------------------------------


@pytest.fixture
def example_instance_env(db_url, tmp_path, monkeypatch):
    """An instance on the test database (engine and Dagster's storage, Postgres), source `example`,
    lane width 2."""
    for key in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MIGRATE_SOURCE", "example")
    monkeypatch.setenv("MIGRATE_LANE_WIDTH", "2")
    env = example_env(db_url, tmp_path)
    monkeypatch.setenv("DAGSTER_HOME", env["DAGSTER_HOME"])
    monkeypatch.setenv(STORAGE_URL_ENV, env[STORAGE_URL_ENV])
    monkeypatch.setenv("DATABASE_URL", env["DATABASE_URL"])
    instance = open_instance(env)
    yield instance, env
    instance.dispose()


def _record(instance: DagsterInstance, tenant: str, status: DagsterRunStatus) -> DagsterRun:
    return instance.add_run(DagsterRun(job_name=launch.place.TENANT_JOB, run_id=str(uuid.uuid4()), status=status,
                                       tags={tags.PARTITION: tenant}))


def test_a_run_starts_here_only_when_the_lane_has_room_else_it_is_queued(example_instance_env):
    instance, _ = example_instance_env
    busy = [_record(instance, f"busy-{i}", DagsterRunStatus.STARTED) for i in range(2)]  # width 2: full
    launch.place.add_tenant(instance, "acme")
    placed = launch.place.place_tenant_run(instance, "acme", launch.checks.new_run_config(options=SMALL), start_here=True)
    assert not placed.here and "the lane is full" in placed.why, placed
    assert instance.get_run_by_id(placed.run_id).status == DagsterRunStatus.QUEUED
    instance.report_run_canceled(busy[0])  # a slot frees
    instance.run_coordinator.cancel_run(placed.run_id)
    placed = launch.place.place_tenant_run(instance, "acme", launch.checks.new_run_config(options=SMALL), start_here=True)
    assert placed.here, placed
    assert instance.get_run_by_id(placed.run_id).status == DagsterRunStatus.STARTING


def test_two_commands_never_both_take_the_lanes_last_slot(example_instance_env, monkeypatch):
    instance, _ = example_instance_env
    _record(instance, "busy", DagsterRunStatus.STARTED)  # width 2: one slot left
    mine = [_record(instance, f"racer-{i}", DagsterRunStatus.NOT_STARTED) for i in range(2)]
    marking = launch.in_process.mark_starting

    def slow_mark(inst, run):  # both count before either marks, unless the count is under the lock
        time.sleep(1.0)
        marking(inst, run)

    monkeypatch.setattr(launch.in_process, "mark_starting", slow_mark)
    answers: dict[str, str] = {}
    threads = [threading.Thread(target=lambda r=r: answers.__setitem__(r.run_id, launch.in_process.start_if_room(instance, r)))
               for r in mine]
    for t in threads:
        t.start()
        time.sleep(0.1)
    for t in threads:
        t.join(30)
    started = [run_id for run_id, why in answers.items() if not why]
    assert len(answers) == 2 and len(started) == 1, answers
    assert {instance.get_run_by_id(r.run_id).status for r in mine} == {DagsterRunStatus.STARTING,
                                                                         DagsterRunStatus.NOT_STARTED}


@pytest.fixture
def hand_daemon(example_instance_env, tmp_path):
    """A daemon no `migrate` started (`dagster-daemon run` by hand), alive on the instance."""
    instance, env = example_instance_env
    started = time.time()
    daemon = stack.daemon(env, log_path=tmp_path / "hand-daemon.log")
    try:
        _until("the hand daemon's first heartbeat", lambda: launch.daemon.newest_heartbeat_id(instance, started), limit=120)
        yield instance, env
    finally:
        stack.stop(daemon)


def test_with_a_daemon_alive_the_run_is_queued_and_its_run_worker_executes_it(hand_daemon):
    instance, env = hand_daemon
    # one kind: the claim is that the daemon's run worker runs it to success, not how much it migrates
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "served", "--kinds", "companies", "--options", json.dumps(SMALL),
                             "--timeout", "240"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, (stdout[-2000:], stderr[-3000:])
    assert "executing it in this process" not in stdout, stdout[-2000:]
    (run,) = instance.get_runs(RunsFilter(tags={tags.PARTITION: "served"}))
    assert run.status == DagsterRunStatus.SUCCESS
    enqueued = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.RUN_ENQUEUED).records
    assert enqueued, "the run was not queued"
    worker = _executed_by(instance, run.run_id)
    assert worker is not None and worker != proc.pid, "the daemon's run worker executed it, not the command"
    assert not list(Path(env["DAGSTER_HOME"]).glob("daemon-*.lock")) or not any(
        launch.daemon.lock_held(p) for p in Path(env["DAGSTER_HOME"]).glob("daemon-*.lock")), "the command started a daemon"


def test_a_bad_in_process_switch_is_one_line_naming_it_and_nothing_is_launched(db_url, tmp_path):
    from tests.dagster.test_cli_errors import _migrate_in_process, _nothing_launched, _one_line_error
    from migration_pipeline.instance import to_url

    env = {"DATABASE_URL": to_url(db_url), "MIGRATE_HOME": str(tmp_path / "home"), "MIGRATE_SOURCE": "example",
           STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2"), launch.in_process.IN_PROCESS_ENV: "maybe"}
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--source", "example"], env),
                           launch.in_process.IN_PROCESS_ENV, "'maybe'")
    assert "1, true, yes or on" in line and "0, false, no or off" in line, line  # every spelling it takes
    _nothing_launched(db_url)
    assert launch.in_process.run_in_process({}) and launch.in_process.run_in_process({launch.in_process.IN_PROCESS_ENV: "1"})
    assert not launch.in_process.run_in_process({launch.in_process.IN_PROCESS_ENV: "0"})


def test_a_killed_commands_run_is_failed_frees_its_lane_slot_and_its_tenant_relaunches_to_success(slow_env, db_url):
    """SIGKILL of `migrate run` mid-phase: its in-process run would stay STARTED and hold the lane
    (width 1 here) for ever - no run launcher watches it - and every relaunch of its tenant sat in a
    later phase "waiting for a lane slot" (the slots the dead run had tagged) until its --timeout (a
    fresh user's find). The next `migrate run` - the tenant's relaunch - fails it with the reason
    (its executor is gone: launcher.fail_runs_of_dead_processes), starts in its place in its own
    process (no daemon: the lane had room) and finishes, resuming the same engine run.

    (It was two tests, each paying for a command killed mid-run: the next command was another
    tenant's, then the same tenant's relaunch; the relaunch is the next command for both claims.)"""
    # the dead command's task locks go stale soon; the lane holds one run
    env = {**slow_env, "MIGRATE_LANE_WIDTH": "1", "MIGRATE_STALE_LOCK_SECONDS": "5"}
    first = subprocess.Popen([MIGRATE, "run", "--tenant", "again", "--kinds", "persons", "--timeout", "400"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    instance = _instance(env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, "again"), proc=first)
        time.sleep(2)  # into the phase's tasks
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.STARTED  # nobody noticed yet
        second = subprocess.Popen([MIGRATE, "run", "--tenant", "again", "--kinds", "persons", "--json", "--timeout", "120"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = second.communicate(timeout=360)
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
        assert second.returncode == 0, (out[-2000:], err[-3000:])
        result = json.loads(out)
        assert result["engine"]["status"] == "succeeded", out[-2000:]
        assert result["engine"]["run_id"] == int(run.tags["migration/run_id"]), "the relaunch resumes the same engine run"
        assert _executed_by(instance, result["dagster_run_id"]) == second.pid, "the relaunch did not execute its run itself"
        assert not instance.get_daemon_heartbeats(), "the lane looked full: the command waited for a daemon"
        dead = instance.get_run_by_id(run.run_id)
        assert dead.status == DagsterRunStatus.FAILURE, dead.status
        assert any(f"pid {first.pid}" in (e.message or "") and "is gone" in (e.message or "")
                   for e in instance.all_logs(run.run_id)), "the run's log does not say why it failed"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        instance.dispose()


def test_a_timeout_while_queued_cancels_the_run_instead_of_leaving_it_to_run_unattended(example_instance_env):
    """A fresh user's find: `migrate run --timeout 15` exited 2 while its run was QUEUED on a daemon,
    and the daemon dequeued and ran it later, alone."""
    instance, _ = example_instance_env
    launch.place.add_tenant(instance, "waits")
    placed = launch.place.place_tenant_run(instance, "waits", launch.checks.new_run_config(options=SMALL))  # no daemon: queued
    assert instance.get_run_by_id(placed.run_id).status == DagsterRunStatus.QUEUED
    with pytest.raises(TimeoutError, match=r"still QUEUED after 0 s \(--timeout\): it was stopped \(CANCELED\)"):
        launch.place.wait_for_run(instance, placed.run_id, timeout=0.3, poll=0.1)
    assert instance.get_run_by_id(placed.run_id).status == DagsterRunStatus.CANCELED
