"""`migrate run` does not wait for interpreter teardowns, its daemon's or its own (issue 11, the tail of every run).

Once the daemon it started has logged that its threads stopped (Dagster's "Daemon threads shut
down."), it launches nothing more: what remains is a process that imported Dagster tearing down,
1-2.5 s on a loaded machine, which every `migrate run` waited for after its run had ended. The
command gives it `stack.SETTLED_GRACE_SECONDS` and kills it. A daemon that has not said so is
waited for as before (its own timeout, then SIGKILL of its group).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from migration_pipeline import launch, stack
import migration_pipeline.launch.daemon

# A stand-in for `dagster-daemon run`: on SIGINT it says what Dagster's controller says once its
# threads have stopped, then takes long to exit (the teardown).
SLOW_TEARDOWN = """
import signal, sys, time
def stop(signo, frame):
    print("dagster.daemon - INFO - Daemon threads shut down.", flush=True)
    time.sleep(20)
    sys.exit(0)
signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
time.sleep(60)
"""
# One that never says it: it exits 1 s after SIGINT by itself.
QUIET = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda s, f: (time.sleep(1), sys.exit(0)))
print("ready", flush=True)
time.sleep(60)
"""


def _keeper(instance, tmp_path: Path, script: str) -> launch.daemon.DaemonKeeper:
    log = tmp_path / "daemon.log"
    log.write_text("an earlier daemon's line: Daemon threads shut down.\n")  # not ours: before the stop
    keeper = launch.daemon.DaemonKeeper(instance, dict(os.environ), tmp_path, log, echo=lambda line: None)
    keeper.proc = stack.start([sys.executable, "-c", script], dict(os.environ), log_path=log)
    keeper.started_at = time.time()
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline and keeper.proc.poll() is None, log.read_text()
        time.sleep(0.05)
    return keeper


def test_a_daemon_whose_threads_have_shut_down_is_not_waited_for(instance, tmp_path):
    keeper = _keeper(instance, tmp_path, SLOW_TEARDOWN)
    proc = keeper.proc
    started = time.monotonic()
    keeper.stop_soon(5)
    keeper.close(5)
    took = time.monotonic() - started
    assert took < 5, f"waited {took:.1f} s for a daemon that had stopped its threads"
    assert proc.returncode == -signal.SIGKILL and keeper.proc is None


def test_a_daemon_that_has_not_said_so_is_waited_for(instance, tmp_path):
    keeper = _keeper(instance, tmp_path, QUIET)
    proc = keeper.proc
    started = time.monotonic()
    keeper.close(5)
    assert proc.returncode == 0, "it exited by itself, not killed"
    assert time.monotonic() - started >= 0.9


def test_the_migrate_program_ends_without_the_interpreters_teardown(tmp_path):
    # `migrate run` / `migrate sync` end with `exit_launched`: output flushed, the exit code kept, no
    # teardown (an atexit handler stands for it); called in-process (not as `migrate`) it is sys.exit
    import subprocess

    script = ("import atexit, sys; sys.argv[0] = {argv0!r}; atexit.register(lambda: print('teardown'));"
              "from migration_pipeline.cli.launching import exit_launched; print('results'); exit_launched(3)")
    out = subprocess.run([sys.executable, "-c", script.format(argv0="/venv/bin/migrate")], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert (out.returncode, out.stdout.split()) == (3, ["results"]), out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", script.format(argv0="pytest")], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert (out.returncode, out.stdout.split()) == (3, ["results", "teardown"]), out.stderr[-2000:]
