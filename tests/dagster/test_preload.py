"""The pre-loaded launcher (`migration_pipeline.preload`, MIGRATE_PRELOAD=1), with real processes on
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
from pathlib import Path

import psycopg
import pytest

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


def _children(parent: int) -> list[int]:
    """Live (not zombie) processes whose parent is `parent`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


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
    first = _run(env, "warm-up", {"page_size": 10, "counts": {k: 2 for k in COUNTS}})
    assert first.returncode == 0, first.stderr[-3000:]
    server = _server(env)
    command = subprocess.Popen([MIGRATE, "run", "--tenant", "acme", "--options", json.dumps(SLOW), "--json"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    child = _wait_for("the command's child", lambda: _children(server), timeout=60)[0]
    with psycopg.connect(env["DATABASE_URL"]) as c:
        _wait_for("a task started", lambda: c.execute(
            "SELECT 1 FROM migration_tasks t JOIN migrations r ON r.id = t.migration_id"
            " WHERE r.tenant_id = 'acme' AND t.started_at IS NOT NULL").fetchone(), timeout=120)
    command.send_signal(signal.SIGKILL)
    command.wait(10)
    _wait_for("the child gone with its command", lambda: child not in _children(server), timeout=10)
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
    first = _run(env, "warm-up", {"page_size": 10, "counts": {k: 2 for k in COUNTS}})
    assert first.returncode == 0, first.stderr[-3000:]
    server = _server(env)
    command = subprocess.Popen([MIGRATE, "run", "--tenant", "acme", "--options", json.dumps(SLOW), "--json"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for("the command's child", lambda: _children(server), timeout=60)
    with psycopg.connect(env["DATABASE_URL"]) as c:
        _wait_for("a task started", lambda: c.execute(
            "SELECT 1 FROM migration_tasks t JOIN migrations r ON r.id = t.migration_id"
            " WHERE r.tenant_id = 'acme' AND t.started_at IS NOT NULL").fetchone(), timeout=120)
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
