"""A second run never hangs: the daemon's liveness is real, not Dagster's 30-minute tolerance.

* a heartbeat older than three of Dagster's heartbeat intervals, or from the daemon the lock file
  says has exited, is no daemon; a held daemon lock, or a fresh heartbeat of a daemon started by
  hand, is one;
* a queued run says why it waits ("queued behind N runs in the lane");
* Dagster's storage is per engine database: two engine databases on one server get two storage
  databases (`<engine database>_dagster`), so they never share a run queue or a heartbeat;
  MIGRATE_DAGSTER_STORAGE_URL overrides the derivation;
* against a sandbox account: `migrate run` on one instance finishes, then three at once for three
  tenants, launched the moment it ends (back to back with it), all finish - each executing its run
  in its own process (no daemon alive: the default), and again on the daemon path
  (MIGRATE_RUN_IN_PROCESS=0: the first one's daemon stopped, its heartbeat still fresh, while the
  three start one of their own and share it), leaving no daemon.
"""
from __future__ import annotations

import json
import os
import uuid
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus, instance_for_test
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import create_run_for_test
from dagster._daemon.types import DaemonHeartbeat
import psycopg

from migration_pipeline import launch, stack, tags
import migration_pipeline.launch.daemon
import migration_pipeline.launch.in_process
import migration_pipeline.launch.place
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_storage_url, storage_database_name, to_url, url_params
from tests.conftest import _with_dbname
from tests.dagster.support import migrate_env, sandbox_account

MIGRATE = str(Path(sys.executable).parent / "migrate")


def _beat(instance, age: float, daemon_id: str = "d1") -> None:
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - age, launch.daemon.RUN_COORDINATOR_DAEMON, daemon_id, None))


def test_a_stale_heartbeat_is_no_daemon_although_dagster_calls_it_healthy(tmp_path):
    lock = tmp_path / "daemon.lock"
    with instance_for_test() as instance:
        assert not launch.daemon.daemon_liveness(instance, lock).alive  # never ran
        _beat(instance, age=600)
        assert instance.get_daemon_statuses([launch.daemon.RUN_COORDINATOR_DAEMON])[launch.daemon.RUN_COORDINATOR_DAEMON].healthy
        live = launch.daemon.daemon_liveness(instance, lock)
        assert not live.alive and "600 s old" in live.why
        _beat(instance, age=5)  # a daemon started by hand
        assert launch.daemon.daemon_liveness(instance, lock).alive


def test_the_lock_says_which_daemon_is_alive_and_which_has_exited(tmp_path):
    lock_file = tmp_path / "daemon.lock"
    with instance_for_test() as instance:
        holder = launch.daemon.DaemonLock(lock_file)
        assert holder.acquire()
        assert not launch.daemon.DaemonLock(lock_file).acquire()  # one holder per instance
        holder.record(by="migrate run", pid=os.getpid(), daemon_id="ours")
        assert launch.daemon.daemon_liveness(instance, lock_file).alive  # held, even before any heartbeat
        _beat(instance, age=1, daemon_id="ours")
        holder.release()
        live = launch.daemon.daemon_liveness(instance, lock_file)  # its heartbeat is fresh, but it is gone
        assert not live.alive and "has exited" in live.why


def test_a_queued_run_says_what_it_waits_behind():
    origin = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("loc"), "repo").get_job_origin("migrate_tenant")
    with instance_for_test() as instance:
        for i in range(2):
            create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                                tags={tags.PARTITION: f"busy-{i}"})
        create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.QUEUED,
                            tags={tags.PARTITION: "ahead"}, remote_job_origin=origin)
        mine = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.QUEUED,
                                   tags={tags.PARTITION: "mine"}, remote_job_origin=origin)
        why = launch.place.queue_state(instance, mine.run_id, lane_width=2)
        assert why.startswith("queued behind 3 runs in the lane"), why


def test_two_engine_databases_on_one_server_get_two_storages(server_url):
    names = [f"h7_engine_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    created: list[str] = []
    try:
        with psycopg.connect(server_url, autocommit=True) as c:
            for n in names:
                c.execute(f'CREATE DATABASE "{n}"')
                created.append(n)
        storages = [dagster_storage_url({"DATABASE_URL": to_url(_with_dbname(server_url, n))}) for n in names]
        created += [f"{n}_dagster" for n in names]
        assert [url_params(s.replace("+psycopg2", ""))["dbname"] for s in storages] == [f"{n}_dagster" for n in names]
        assert all(s.startswith("postgresql+psycopg2://") for s in storages)
        with psycopg.connect(server_url) as c:
            found = {r[0] for r in c.execute("SELECT datname FROM pg_database WHERE datname LIKE 'h7_engine_%%'")}
        assert {f"{n}_dagster" for n in names} <= found
    finally:
        with psycopg.connect(server_url, autocommit=True) as c:
            for n in created:
                c.execute(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)')


def test_the_override_wins_and_long_names_fit_postgres():
    given = "postgresql://u@db.example:5432/elsewhere"
    assert dagster_storage_url({STORAGE_URL_ENV: given, "DATABASE_URL": "postgresql://x@nohost/y"}) == \
        "postgresql+psycopg2://u@db.example:5432/elsewhere"
    long = "e" * 63
    name = storage_database_name(long)
    assert len(name) <= 63 and name.endswith("_dagster") and name != storage_database_name("e" * 62)


@pytest.fixture(scope="module")
def tiny_account():
    """One tiny sandbox account for both paths (the runs only read it; each has its own database and home)."""
    with sandbox_account(scale="tiny") as base_url:
        yield base_url


@pytest.fixture
def sandbox_env(db_url, tmp_path, tiny_account):
    # No drainer runs: each run drains its own tiny phase, the proof needs no more processes. A run
    # queued on no daemon gives up after 60 s. Trusting the stopped daemon's heartbeat (the fix
    # reverted), the three wait until it is FRESH_HEARTBEAT_SECONDS (90 s) old - the first daemon,
    # living through one short run, wrote its only one as it started - and then for a daemon's
    # start: over 60 s. With the fix one starts at once: dequeued within 26 s of the first daemon's
    # stop at load 8, 55 s at load 14 (the three's imports included). At 120 s the reverted wait
    # fitted and the test passed (seen at load 14).
    return migrate_env(db_url, str(tmp_path / "home"), tiny_account, MIGRATE_QUEUE_TIMEOUT_SECONDS="60")


def _run(env: dict[str, str], tenant: str) -> subprocess.Popen:
    return subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--kinds", "users", "--json", "--timeout", "240"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finished(proc: subprocess.Popen, tenant: str) -> None:
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        raise
    assert proc.returncode == 0, f"{tenant}: exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    assert json.loads(out)["dagster_status"] == "SUCCESS", out[-2000:]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("in_process", ["1", "0"], ids=["in-process", "daemon"])
def test_runs_back_to_back_and_three_at_once_all_finish(sandbox_env, in_process):
    sandbox_env = dict(sandbox_env, **{launch.in_process.IN_PROCESS_ENV: in_process})
    _finished(_run(sandbox_env, "first"), "first")
    # Back to back and three at once in one step (they had been a second run alone, then these
    # three): the three start within seconds of the first's end, its daemon stopping with a fresh
    # heartbeat, so a command trusting that heartbeat would wait queued on no daemon.
    together = {t: _run(sandbox_env, t) for t in ("t-a", "t-b", "t-c")}
    for tenant, proc in together.items():
        _finished(proc, tenant)
    log = Path(sandbox_env["MIGRATE_HOME"]) / "dagster" / "daemon.log"
    assert log.exists() == (in_process == "0"), "a daemon was started only on the daemon path"
    assert "Another QUEUED_RUN_COORDINATOR daemon is still sending heartbeats" not in (log.read_text() if log.exists() else "")
    leftover = subprocess.run(["pgrep", "-f", f"dagster-daemon run.*{stack.DEFS_MODULE}"], capture_output=True, text=True)
    mine = [p for p in leftover.stdout.split()
            if sandbox_env["MIGRATE_HOME"] in Path(f"/proc/{p}/environ").read_bytes().decode(errors="ignore")]
    assert not mine, "a daemon outlived the commands that started it"


def test_a_daemon_stopped_before_its_id_was_recorded_is_known_to_have_exited(tmp_path):
    # A `migrate run` signalled during its launch stops the daemon it started before `ensure()` saw
    # that daemon's first heartbeat; the next command trusted the fresh heartbeat and waited ~90 s,
    # queued, on no daemon (a fresh user's find). A real process stands in for the daemon's: in its
    # own session, answering SIGINT (as stack.daemon's children do) once it says it is up, so the
    # close's SIGINT ends it at once. (A bare `time.sleep(60)` inherited an ignored SIGINT where the
    # runner ignores it - `make test` in the background - or lost one sent while it started, and the
    # close waited stack.stop's 30 s before its SIGKILL.) The heartbeat is the one its daemon would
    # have written.
    with instance_for_test() as instance:
        keeper = launch.daemon.DaemonKeeper(instance, {}, tmp_path, tmp_path / "daemon.log", echo=lambda _m: None)
        assert keeper.lock.acquire()
        keeper.started_at = time.time()
        keeper.lock.record(by="migrate run", pid=os.getpid(), address=None, daemon_id=None)
        code = "import signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); print('up', flush=True); time.sleep(60)"
        keeper.proc = stand_in = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                                  start_new_session=True)
        assert stand_in.stdout.readline().strip() == "up"
        _beat(instance, age=0, daemon_id="ours-unrecorded")
        keeper.close(0)
        stand_in.stdout.close()
        live = launch.daemon.daemon_liveness(instance, keeper.lock.path)
        assert not live.alive and "has exited" in live.why, live.why
