"""`migrate ui` (dagster dev on the instance `migrate` configures) as a fresh user meets it, started
from the repository root (whose dagster.yaml is the instance template, not an instance):

* no "Found a dagster instance configuration value (dagster.yaml) in the current folder" warning:
  the instance is DAGSTER_HOME's, rendered from that file on purpose;
* Ctrl-C (SIGINT) ends it within a few seconds, and every process it started (dagster dev, its
  webserver, daemon and code servers) is gone when it returns;
* no `daemon-*.lock` file is left under DAGSTER_HOME after that clean exit, and the next command
  does not take the stopped daemon's recent heartbeat for a live daemon.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from migration_pipeline import launch, stack
import migration_pipeline.launch.daemon
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, open_instance, to_url

pytestmark = pytest.mark.timeout(240)
REPO_ROOT = Path(__file__).resolve().parents[2]
EXIT_SECONDS = 15.0


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, grandchildren, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _pgid(pid: int) -> int | None:
    """The process group of a live (not zombie) process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[2])


def _groups_alive(pgids: set[int]) -> set[int]:
    """The members of process groups `pgids` still alive (zombies not counted)."""
    alive: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:
            alive.add(int(entry.name))
    return alive


def test_ctrl_c_ends_migrate_ui_quickly_with_every_child_gone_no_warning_and_no_lock_left(engine_url, tmp_path):
    port = stack.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE")}
    env.update(DATABASE_URL=engine_url, MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(engine_url, scheme="postgresql+psycopg2")})
    log_path = tmp_path / "ui.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "migrate"), "ui", "--port", str(port)],
                                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    assert (REPO_ROOT / "dagster.yaml").exists(), "the case: a dagster.yaml in the working directory"
    try:
        stack.wait_for_webserver(port, proc, timeout=180)
        time.sleep(2)  # the daemon heartbeats (the lock file records its id)
        below = _descendants(proc.pid)
        pgids = {_pgid(p) for p in below} - {None} | {proc.pid}
        assert len(below) >= 4, below  # dagster dev, webserver, daemon, code server(s)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`migrate ui` still running {EXIT_SECONDS:.0f} s after SIGINT; "
                        f"log:\n{log_path.read_text(errors='replace')[-3000:]}")
        took = time.monotonic() - started
        out = log_path.read_text(errors="replace")
        assert proc.returncode == 0, out[-3000:]
        left = _groups_alive(pgids) | {p for p in below if _pgid(p) is not None}
        assert not left, f"processes left after `migrate ui` returned ({took:.1f} s): {left}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "in the current folder" not in out, out[-3000:]
    home = Path(env["MIGRATE_HOME"]) / "dagster"
    assert not list(home.glob("daemon-*.lock")), list(home.glob("daemon-*.lock"))
    # the daemon that just stopped is not taken for a live one (its heartbeat is seconds old)
    menv = dagster_env(env=env)
    instance = open_instance(menv)
    try:
        live = launch.daemon.daemon_liveness(instance, launch.daemon.lock_path(home, menv[STORAGE_URL_ENV]))
    finally:
        instance.dispose()
    assert not live.alive, live.why


# A child that exits on SIGINT, leaving a child of its own that ignores SIGINT (what a dagster dev
# leaves when a code server it restarted, or a run worker, does not exit with it).
_PARENT = """
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(120)"])
time.sleep(120)
"""


def test_stop_of_a_whole_group_waits_for_and_then_kills_what_the_child_left(tmp_path):
    log = tmp_path / "parent.log"
    proc = stack.start([sys.executable, "-c", _PARENT], dict(os.environ), log_path=log)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    (grandchild,) = _descendants(proc.pid)
    started = time.monotonic()
    stack.stop(proc, timeout=2.0, whole_group=True)
    took = time.monotonic() - started
    assert proc.poll() is not None
    assert _pgid(grandchild) is None, "the grandchild outlived stop(whole_group=True)"
    assert not stack.group_alive(proc.pid)
    assert 1.5 < took < 6, took  # waited for it, then killed it at the deadline
