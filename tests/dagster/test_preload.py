"""The pre-loaded launcher (`migration_pipeline.preload`: on at a terminal, MIGRATE_PRELOAD=1), with real processes on
real Postgres: the first `migrate run` runs as always and starts a server; the next one is run by a
child forked from it (Dagster already imported there: the command's stderr under -X importtime shows
the project's modules loading, not Dagster's), with the same result. A `kill -9` of the command kills
its child at once, mid-run, and a rerun completes the engine run with every row written once; a
SIGTERM is forwarded to the child, which stops what it started, and its exit code comes back."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psycopg
import pytest

from engine_core.config import check_environment
from engine_core.errors import ConfigError
from migration_pipeline import preload
from tests.dagster.support import example_env
from tests.engine.test_worker_death import _wait_for

pytestmark = pytest.mark.timeout(300)

MIGRATE = str(Path(sys.executable).parent / "migrate")
COUNTS = {"companies": 30, "contacts": 30, "deals": 10, "activities": 10, "notes": 10}
SLOW = {"page_size": 10, "counts": COUNTS, "row_delay": 0.05}


@pytest.fixture
def env(db_url, tmp_path):
    """A `migrate` environment with the launcher on, its sockets under this test's own TMPDIR; the
    server stopped after the test."""
    tmp = Path(tempfile.mkdtemp(prefix="mp-", dir="/tmp"))  # short: a socket's path has 108 bytes
    out = {**example_env(db_url, tmp_path), preload.ENABLE_ENV: "1", preload.IDLE_ENV: "120", "TMPDIR": str(tmp)}
    yield out
    for pid_file in tmp.glob("migrate-preload-*/*.pid"):
        try:
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        except (ValueError, ProcessLookupError):
            pass
    shutil.rmtree(tmp, ignore_errors=True)


def _server(env: dict[str, str]) -> int:
    """The launcher server's pid, once it listens."""
    pid_files = lambda: list(Path(env["TMPDIR"]).glob("migrate-preload-*/*.pid"))  # noqa: E731
    found = _wait_for("the launcher server listening", pid_files, timeout=120)
    return int(found[0].read_text())


def _slow_run_under_way(env: dict[str, str], **popen: object) -> tuple[int, subprocess.Popen, int]:
    """A warm-up run (which starts the server), then a slow `migrate run` of tenant acme forked from
    it with a task started: (the server's pid, the command, its forked child's pid)."""
    first = _run(env, "warm-up", {"page_size": 10, "counts": {k: 2 for k in COUNTS}})
    assert first.returncode == 0, first.stderr[-3000:]
    server = _server(env)
    # the warm-up's forked child may still be on its way out: the command's child is the new one
    before = set(preload.children_of(server))
    command = subprocess.Popen([MIGRATE, "run", "--tenant", "acme", "--options", json.dumps(SLOW), "--json"],
                               env=env, **popen)
    child = _wait_for("the command's child", lambda: [c for c in preload.children_of(server) if c not in before],
                      timeout=60)[0]
    with psycopg.connect(env["DATABASE_URL"]) as c:
        _wait_for("a task started", lambda: c.execute(
            "SELECT 1 FROM migration_tasks t JOIN migrations r ON r.id = t.migration_id"
            " WHERE r.tenant_id = 'acme' AND t.started_at IS NOT NULL").fetchone(), timeout=120)
    return server, command, child


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def _run(env: dict[str, str], tenant: str, options: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([MIGRATE, "run", "--tenant", tenant, "--options", json.dumps(options), "--json"],
                          env={**env, **extra}, capture_output=True, text=True, timeout=240)


def test_the_second_run_is_forked_from_the_preloaded_server_with_the_same_result(env):
    cold = _run(env, "first", {"page_size": 10, "counts": COUNTS}, PYTHONPROFILEIMPORTTIME="1")
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "dagster" in _imported(cold.stderr)  # no server yet: the command imported Dagster itself
    _server(env)
    warm = _run(env, "second", {"page_size": 10, "counts": COUNTS}, PYTHONPROFILEIMPORTTIME="1")
    assert warm.returncode == 0, warm.stderr[-3000:]
    out = json.loads(warm.stdout)
    assert out["dagster_status"] == "SUCCESS" and out["engine"]["status"] == "succeeded"
    imported = _imported(warm.stderr)
    assert "migration_pipeline.cli.main" in imported and "dagster" not in imported  # forked: Dagster was loaded


def test_a_killed_command_kills_its_forked_child_and_a_rerun_completes_every_row_once(env):
    server, command, child = _slow_run_under_way(env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    command.send_signal(signal.SIGKILL)
    command.wait(10)
    _wait_for("the child gone with its command", lambda: child not in preload.children_of(server), timeout=10)
    with psycopg.connect(env["DATABASE_URL"]) as c:
        assert c.execute("SELECT status FROM migrations WHERE tenant_id = 'acme'").fetchone()[0] != "succeeded"  # killed mid-run
    again = _run(env, "acme", SLOW, **{preload.ENABLE_ENV: "0"})
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["engine"]["status"] == "succeeded"
    with psycopg.connect(env["DATABASE_URL"]) as c:
        items = dict(c.execute("SELECT kind, count(*) FROM example_items WHERE tenant_id = 'acme' GROUP BY kind").fetchall())
        distinct = dict(c.execute("SELECT kind, count(DISTINCT source_id) FROM example_items WHERE tenant_id = 'acme'"
                                  " GROUP BY kind").fetchall())
        ledger = dict(c.execute("SELECT kind, count(*) FROM migration_records m JOIN migrations r ON r.id = m.migration_id "
                                "WHERE r.tenant_id = 'acme' AND action = 'created' GROUP BY kind").fetchall())
    assert items == distinct == COUNTS  # every row once: none lost, none written twice
    assert ledger == COUNTS


def test_a_stop_signal_reaches_the_forked_command_which_stops_what_it_started(env):
    server, command, child = _slow_run_under_way(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    command.send_signal(signal.SIGTERM)
    _, err = command.communicate(timeout=120)
    assert command.returncode == 128 + signal.SIGTERM, err[-3000:]  # the child's own exit code, relayed
    assert "SIGTERM: stopping what this command started" in err
    with psycopg.connect(env["DATABASE_URL"]) as c:
        assert c.execute("SELECT status FROM migrations WHERE tenant_id = 'acme'").fetchone()[0] == "stopped"
    again = _run(env, "acme", SLOW)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["engine"]["status"] == "succeeded"


def test_the_server_key_follows_the_environment_the_imports_read_not_the_commands_own():
    base = {"PATH": "/usr/bin", "DATABASE_URL": "postgresql:///a", "MIGRATE_HOME": "/x"}
    key = preload.server_key(base)
    assert preload.server_key({**base, "DATABASE_URL": "postgresql:///b", "MIGRATE_HOME": "/y"}) == key
    assert preload.server_key({**base, "DAGSTER_RUN_QUEUE_PAGE_SIZE": "5"}) != key


def test_on_by_default_only_for_a_launching_command_typed_at_a_terminal():
    run = ["migrate", "run", "--tenant", "t"]
    assert preload.enabled(run, {}, interactive=True)
    assert not preload.enabled(run, {}, interactive=False)  # scripts, services, CI: their own process
    assert not preload.enabled(run, {preload.ENABLE_ENV: "0"}, interactive=True)
    assert not preload.enabled(run, {preload.ENABLE_ENV: "off"}, interactive=True)
    assert preload.enabled(run, {preload.ENABLE_ENV: "1"}, interactive=False)
    assert not preload.enabled(run, {preload.ENABLE_ENV: "maybe"}, interactive=True)  # refused by check_environment
    assert not preload.enabled(["migrate", "status", "t"], {}, interactive=True)
    with pytest.raises(ConfigError, match=r"^MIGRATE_PRELOAD must be 1, .* got 'maybe'$"):
        check_environment({preload.ENABLE_ENV: "maybe"})


def _at_terminal(**popen: object) -> str:
    code = "from migration_pipeline import preload; print(preload.at_terminal())"
    return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=60,
                          **popen).stdout.strip()


def test_a_terminal_is_stdin_and_stderr_on_a_tty():
    master, slave = os.openpty()
    try:
        assert _at_terminal(stdin=slave, stderr=slave) == "True"
        assert _at_terminal(stdin=slave, stderr=subprocess.PIPE) == "False"  # `migrate run 2>log`
        assert _at_terminal(stdin=subprocess.DEVNULL, stderr=slave) == "False"  # nohup, cron, systemd
    finally:
        os.close(slave)
        os.close(master)


def _key(**popen: object) -> str:
    code = "from migration_pipeline import preload; print(preload.server_key({'PATH': '/usr/bin'}))"
    return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, timeout=60, check=True,
                          **popen).stdout.strip()


def test_the_server_key_holds_what_a_forked_child_inherits_from_the_server():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    plain = _key()
    assert _key() == plain  # stable: the same shell finds its server again
    assert _key(preexec_fn=lambda: os.nice(5)) != plain  # `nice migrate run` is not forked at the server's priority
    assert _key(preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))) != plain


def _run_at_terminal(env: dict[str, str], tenant: str) -> tuple[int, str, str]:
    """`migrate run` with stdin and stderr on a pseudo-terminal (typed at a prompt) and stdout piped:
    exit code, stdout, what reached the terminal."""
    master, slave = os.openpty()
    seen: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the last holder of the terminal closed it
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        done = subprocess.run([MIGRATE, "run", "--tenant", tenant, "--options", json.dumps({"page_size": 10, "counts": COUNTS}),
                               "--json"], env=env, stdin=slave, stderr=slave, stdout=subprocess.PIPE, text=True,
                              timeout=240)
    finally:
        os.close(slave)
    reader.join(10)
    os.close(master)
    return done.returncode, done.stdout, b"".join(seen).decode(errors="replace")


def test_at_a_terminal_the_first_run_starts_the_launcher_saying_so_and_the_next_is_forked_from_it(env):
    env = {k: v for k, v in env.items() if k != preload.ENABLE_ENV}  # the default
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # the server started by the first run prints its children's imports
    code, out, terminal = _run_at_terminal(env, "first")
    assert code == 0, terminal[-3000:]
    assert json.loads(out)["engine"]["status"] == "succeeded"
    assert "started a pre-loaded launcher" in terminal and "MIGRATE_PRELOAD=0" in terminal
    server = _server(env)
    code, out, terminal = _run_at_terminal(env, "second")
    assert code == 0, terminal[-3000:]
    assert json.loads(out)["engine"]["status"] == "succeeded"
    imported = _imported(terminal.replace("\r\n", "\n"))
    assert "migration_pipeline.cli.main" in imported and "dagster" not in imported  # forked: Dagster was loaded
    assert "started a pre-loaded launcher" not in terminal
    status = subprocess.run([MIGRATE, "preload", "status"], env=env, capture_output=True, text=True, timeout=60)
    assert f"pid {server}: started" in status.stdout and "serves this shell" in status.stdout, status.stdout
    stop = subprocess.run([MIGRATE, "preload", "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert "stopped 1 launcher" in stop.stdout, stop.stdout + stop.stderr
    _wait_for("the launcher gone", lambda: not preload_pids(env), timeout=30)


def preload_pids(env: dict[str, str]) -> list[Path]:
    """The launcher pid files under the test's TMPDIR (a stopped server removes its own)."""
    return list(Path(env["TMPDIR"]).glob("migrate-preload-*/*.pid"))


def _state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_stops_the_forked_command_and_fg_continues_it_to_the_end(env):
    # the command in a process group of its own, as a shell starts a job: were the suite's group
    # orphaned (started in the background by a shell that has exited), the kernel would discard the
    # SIGTSTP the command sends itself to stop, and it would continue its child at once
    server, command, child = _slow_run_under_way(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                 process_group=0)
    command.send_signal(signal.SIGTSTP)
    _wait_for("the child stopped", lambda: _state(child) == "T", timeout=20)
    _wait_for("the command stopped", lambda: _state(command.pid) == "T", timeout=20)
    command.send_signal(signal.SIGCONT)
    _wait_for("the child continued", lambda: _state(child) != "T", timeout=20)
    out, err = command.communicate(timeout=180)
    assert command.returncode == 0, err[-3000:]
    assert json.loads(out)["engine"]["status"] == "succeeded"


def test_a_command_whose_launcher_is_stopped_meanwhile_goes_on_to_its_own_exit_code(env):
    server, command, child = _slow_run_under_way(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop = subprocess.run([MIGRATE, "preload", "stop"], env=env, capture_output=True, text=True, timeout=60)
    assert "stopped 1 launcher" in stop.stdout, stop.stdout + stop.stderr
    out, err = command.communicate(timeout=180)
    assert command.returncode == 0, (out[-2000:], err[-3000:])  # its own exit code, not "the launcher ended" and 1
    assert json.loads(out)["engine"]["status"] == "succeeded"
