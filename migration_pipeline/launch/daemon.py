"""The Dagster daemon that serves an instance: its liveness (a lock file and the run coordinator's
heartbeat), the lock a `migrate` process holds while its daemon lives, and the daemon `migrate run`
starts for its duration when none serves the instance."""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from engine_core.db import redact
from migration_pipeline import stack, tags
from migration_pipeline.jobs import TENANT_JOB
from migration_pipeline.launch.checks import LaunchError
from migration_pipeline.launch.statuses import IN_FLIGHT


RUN_COORDINATOR_DAEMON = "QUEUED_RUN_COORDINATOR"
HEARTBEAT_INTERVAL_SECONDS = 30.0  # dagster._daemon.controller.DEFAULT_HEARTBEAT_INTERVAL_SECONDS
FRESH_HEARTBEAT_SECONDS = 3 * HEARTBEAT_INTERVAL_SECONDS

# How long a started daemon may take to write its first heartbeat before we say it failed.
DAEMON_START_SECONDS = 120.0

# How often DaemonKeeper.close asks whether the runs its daemon serves are still in flight.
CLOSE_POLL_SECONDS = 0.5

# What `dagster-daemon run` logs once its daemon threads have stopped on an interrupt
# (dagster._daemon.controller.DagsterDaemonController.__exit__): from then on it launches nothing.
DAEMON_THREADS_SHUT_DOWN = b"Daemon threads shut down."


def lock_path(home: Path, storage_url: str) -> Path:
    """The instance's daemon lock: one per DAGSTER_HOME and storage (the password not hashed in)."""
    digest = hashlib.sha256(redact(storage_url).encode()).hexdigest()[:12]
    return Path(home) / f"daemon-{digest}.lock"


def _read_info(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text() or "{}")
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def lock_held(path: Path) -> bool:
    """True when another open file holds the lock (this process's own holds count too)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def source_record(env: dict[str, str], salt: str | None = None) -> dict[str, str]:
    """Which source account a daemon started with `env` has its runs read, as the lock file keeps
    it: {"host": the host of PIPEDRIVE_BASE_URL ("127.0.0.1:8765"), "salt": random hex, "token": an
    HMAC-SHA256 of PIPEDRIVE_API_TOKEN keyed with the salt ("" without a token)}. Salted, so the file
    holds nothing a token could be looked up by; never shown: a refusal names the host and says
    "another API token" (`check_same_source`). A run executes in the daemon's processes, with the
    daemon's environment, not the launching shell's: the launch compares the two. `salt`: the
    recorded one, to compare against; None draws a new one."""
    base = env.get("PIPEDRIVE_BASE_URL", "")
    host = urlsplit(base).netloc or base or "default"
    salt = salt or secrets.token_hex(16)
    token = env.get("PIPEDRIVE_API_TOKEN", "")
    mac = hmac.new(bytes.fromhex(salt), token.encode(), hashlib.sha256).hexdigest() if token else ""
    return {"host": host, "salt": salt, "token": mac}


def check_same_source(lock: Path, env: dict[str, str]) -> None:
    """Raise LaunchError (one line) when the daemon holding `lock` was started with another source
    account than `env`'s: its runs would read that other account, and a run could "succeed" with
    another tenant's data. The line names the hosts and says whether the API token differs, never a
    value derived from a token. A daemon that recorded no source (or not as `source_record`) is not
    judged."""
    info = _read_info(lock)
    theirs = info.get("source")
    if not isinstance(theirs, dict) or not all(isinstance(theirs.get(k), str) for k in ("host", "salt", "token")):
        return
    try:
        ours = source_record(env, theirs["salt"])
    except ValueError:  # a salt that is not hex: not a record this module wrote
        return
    other_host, other_token = ours["host"] != theirs["host"], not hmac.compare_digest(ours["token"], theirs["token"])
    if not (other_host or other_token):
        return
    differs = [*([f"PIPEDRIVE_BASE_URL reaches {ours['host']}, not {theirs['host']}"] if other_host else []),
               *(["PIPEDRIVE_API_TOKEN is a different API token" if ours["token"] and theirs["token"] else
                  "PIPEDRIVE_API_TOKEN is set in only one of them"] if other_token else [])]
    raise LaunchError(
        f"the daemon serving this instance ({info.get('by', 'migrate')}, pid {info.get('pid', '?')}) reads the "
        f"source at {theirs['host']}, but in this shell {' and '.join(differs)}: its runs would read the other "
        f"account; stop it or launch with its settings")


@dataclass
class Liveness:
    """Whether a daemon dequeues this instance's runs, and the one-line reason."""
    alive: bool
    why: str
    address: str | None = None  # the UI's URL when the holder is `migrate ui`
    pid: int | None = None


def daemon_liveness(instance: DagsterInstance, lock: Path, now: float | None = None,
                    holding: bool = False) -> Liveness:
    """The lock first (held: alive), then a heartbeat newer than FRESH_HEARTBEAT_SECONDS from a
    daemon that is not the lock file's exited one. `holding`: the caller holds the lock itself, so
    only the heartbeat is asked about."""
    info = _read_info(lock)
    if not holding and lock_held(lock):
        who = info.get("by", "a migrate command")
        return Liveness(True, f"a daemon started by {who} (pid {info.get('pid', '?')})", info.get("address"), info.get("pid"))
    now = time.time() if now is None else now
    beat = instance.get_daemon_heartbeats().get(RUN_COORDINATOR_DAEMON)
    if beat is None:
        return Liveness(False, "no daemon: none heartbeats on this instance (none ran, or the last one stopped cleanly)")
    age = max(0.0, now - beat.timestamp)
    if age > FRESH_HEARTBEAT_SECONDS:
        return Liveness(False, f"no daemon: the last heartbeat is {age:.0f} s old")
    if beat.daemon_id and beat.daemon_id == info.get("daemon_id"):
        return Liveness(False, f"no daemon: the one {info.get('by', 'migrate')} started (pid {info.get('pid', '?')}) has exited")
    return Liveness(True, f"a daemon not started by migrate (heartbeat {age:.0f} s ago)")


def daemon_alive(instance: DagsterInstance, lock: Path) -> bool:
    """Whether a daemon dequeues this instance's runs now (see daemon_liveness)."""
    return daemon_liveness(instance, lock).alive


class DaemonLock:
    """The instance's daemon lock, taken by the process that starts a daemon and handed to it.

    `acquire()` is non-blocking: False when another process holds it. `fd` is passed to the child
    (`pass_fds`), so the lock outlives us while the child runs. `record(...)` writes who holds it,
    where the UI is, and the daemon id whose heartbeats mean "ours": once the lock is free, that id
    is known to have exited."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fd: int | None = None
        self.info: dict[str, Any] = {}

    def acquire(self) -> bool:
        """Take the lock without blocking: True when taken, False when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        self.info = _read_info(self.path)
        return True

    def record(self, **info: Any) -> None:
        """Merge `info` into the lock file's JSON (who holds it, the UI's address, the daemon's id,
        the source it reads). Needs the lock."""
        assert self.fd is not None, "record() needs the lock"
        self.info.update(info)
        data = json.dumps(self.info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Close our descriptor; a child that inherited it keeps the lock until it exits."""
        if self.fd is not None:
            os.close(self.fd)  # the child's inherited copy keeps the lock until it exits
            self.fd = None

    def remove(self, instance: DagsterInstance) -> bool:
        """On a clean exit, once every process that inherited the lock has exited: remove the lock
        file and release it. True when removed; False when kept (then only released).

        After its daemon exits, what the file still tells is that daemon's id (`record`), so that
        its heartbeat, under FRESH_HEARTBEAT_SECONDS old, is not taken for a live daemon by the next
        command (`daemon_liveness`). That heartbeat is wiped instead (`instance.wipe_daemon_heartbeats`,
        what `dagster-daemon wipe` does) when the run coordinator's latest is ours; when it is
        another daemon's, the file adds nothing to it. Kept when the heartbeats cannot be read or
        wiped. Unlinked while held: a command that opens the path meanwhile finds the lock taken, or
        no file."""
        if self.fd is None:
            return False
        try:
            beat = instance.get_daemon_heartbeats().get(RUN_COORDINATOR_DAEMON)
            if beat is not None and beat.daemon_id and beat.daemon_id == self.info.get("daemon_id"):
                instance.wipe_daemon_heartbeats()
        except Exception:  # noqa: BLE001 - the file stays; the heartbeat rule reads it as before
            self.release()
            return False
        self.path.unlink(missing_ok=True)
        self.release()
        return True


def ui_on_port(home: Path, port: int) -> dict[str, Any] | None:
    """The recorded holder ({"by", "pid", "address", ...}) of a held daemon lock under `home`
    (DAGSTER_HOME) whose UI address is on `port`: the `migrate ui` that already serves there, for a
    second `migrate ui` to name instead of only saying the port is busy. None when no such lock."""
    for path in sorted(Path(home).glob("daemon-*.lock")):
        info = _read_info(path)
        address = str(info.get("address") or "")
        if address.rstrip("/").endswith(f":{port}") and lock_held(path):
            return info
    return None


def newest_heartbeat_id(instance: DagsterInstance, since: float) -> str | None:
    """The run coordinator daemon's id when its latest heartbeat is newer than `since`."""
    beat = instance.get_daemon_heartbeats().get(RUN_COORDINATOR_DAEMON)
    return beat.daemon_id if beat is not None and beat.timestamp >= since else None


class DaemonKeeper:
    """A daemon for the duration of a `migrate run`: `ensure()` (called before the launch and on
    every poll) starts one when none is alive; `close()` stops ours once no run it may be executing
    is left in flight (a stopped daemon's process group takes its run workers with it)."""

    def __init__(self, instance: DagsterInstance, env: dict[str, str], home: Path, log_path: Path,
                 echo: Callable[[str], None] = print) -> None:
        self.instance = instance
        self.env = env
        self.lock = DaemonLock(lock_path(home, env.get("MIGRATE_DAGSTER_STORAGE_URL", "")))
        self.log_path = log_path
        self.echo = echo
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.recorded = False
        self.interrupted = False  # stop_soon() has told our daemon to shut down
        self.log_offset: int | None = None  # the log's size when our daemon was told to stop
        self.last = Liveness(False, "not checked yet")

    def ensure(self) -> Liveness:
        """Alive, or a daemon of ours just started (then `why` says so). Raises LaunchError when
        ours exited or did not heartbeat within DAEMON_START_SECONDS."""
        if self.proc is not None:
            if self.proc.poll() is not None:
                raise LaunchError(f"the Dagster daemon we started exited with {self.proc.returncode}; see {self.log_path}")
            if not self.recorded:
                daemon_id = newest_heartbeat_id(self.instance, self.started_at)
                if daemon_id:
                    self.lock.record(daemon_id=daemon_id)
                    self.recorded = True
                elif time.time() - self.started_at > DAEMON_START_SECONDS:
                    raise LaunchError(f"the Dagster daemon we started did not heartbeat in {DAEMON_START_SECONDS:.0f} s; "
                                      f"see {self.log_path}")
            self.last = Liveness(True, f"a daemon started by this command (pid {self.proc.pid})", pid=self.proc.pid)
            return self.last
        live = daemon_liveness(self.instance, self.lock.path)
        if live.alive:
            check_same_source(self.lock.path, self.env)
            self.last = live
            return live
        if not self.lock.acquire():  # someone took it since: their daemon is starting
            check_same_source(self.lock.path, self.env)
            self.last = daemon_liveness(self.instance, self.lock.path)
            return self.last
        live = daemon_liveness(self.instance, self.lock.path, holding=True)  # re-check under the lock
        if live.alive:
            self.lock.release()
            self.last = live
            return live
        self.echo(f"{live.why}; starting one for the duration of this command (log: {self.log_path})")
        self.started_at = time.time()
        self.lock.record(by="migrate run", pid=os.getpid(), address=None, daemon_id=None,
                         source=source_record(self.env))
        self.proc = stack.daemon(self.env, log_path=self.log_path, pass_fds=(self.lock.fd,))
        self.lock.record(pid=self.proc.pid)
        self.last = Liveness(True, f"a daemon started by this command (pid {self.proc.pid})", pid=self.proc.pid)
        return self.last

    def ours_in_flight(self) -> int:
        """Runs our daemon must see through: tenant-job runs (any `migrate run`'s, they may rely on
        it) queued or changed since it started, and the drainer runs of their tenants. Drainers of
        other tenants are not waited for: stopped, they give their slot back at a task boundary."""
        records = [r for r in self.instance.get_run_records(RunsFilter(statuses=IN_FLIGHT))
                   if r.dagster_run.status == DagsterRunStatus.QUEUED
                   or r.update_timestamp.timestamp() >= self.started_at - 1]
        tenants = {r.dagster_run.tags.get(tags.PARTITION) for r in records if r.dagster_run.job_name == TENANT_JOB}
        return sum(1 for r in records if r.dagster_run.job_name == TENANT_JOB
                   or r.dagster_run.tags.get(tags.PARTITION) in tenants)

    def stop_soon(self, limit: float) -> None:
        """Once nothing of ours is in flight (waiting at most `limit` seconds), tell our daemon to
        shut down and return at once: its shutdown (about a second) overlaps the caller's own
        work (reading the results); `close()` then waits for it. Nothing when we started none."""
        if self.proc is None or self.interrupted:
            return
        self._wait_ours(limit)
        self._mark_log()
        self.interrupted = stack.interrupt(self.proc)

    def close(self, limit: float) -> None:
        """Stop our daemon once nothing of ours is in flight (waiting at most `limit` seconds)."""
        if self.proc is None:
            return
        try:
            if not self.interrupted:
                self._wait_ours(limit)
                self._mark_log()
        finally:
            stack.stop(self.proc, interrupted=self.interrupted, settled=self._threads_shut_down)
            self.proc = None
            self.interrupted = False
            self._record_exited()
            self.lock.release()

    def _mark_log(self) -> None:
        """Where our daemon's log ends before it is told to stop (`_threads_shut_down` reads on)."""
        try:
            self.log_offset = self.log_path.stat().st_size
        except OSError:
            self.log_offset = None

    def _threads_shut_down(self) -> bool:
        """Whether our daemon, told to stop, has logged that its threads stopped (Dagster's
        DAEMON_THREADS_SHUT_DOWN line): it dequeues and launches nothing more, and what is left of
        its exit is the interpreter's teardown (`stack.stop`'s `settled`). False when unknown."""
        if self.log_offset is None:
            return False
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                return DAEMON_THREADS_SHUT_DOWN in f.read()
        except OSError:
            return False

    def _wait_ours(self, limit: float) -> None:
        """Until no run our daemon serves is in flight (`ours_in_flight`), our daemon exited, or
        `limit` seconds passed; asked every CLOSE_POLL_SECONDS."""
        if self.proc is None:
            return
        deadline = time.monotonic() + limit
        said = False
        while self.proc.poll() is None and time.monotonic() < deadline:
            n = self.ours_in_flight()
            if not n:
                break
            if not said:
                self.echo(f"keeping the daemon until {n} other run(s) it serves finish (at most {limit:.0f} s)")
                said = True
            try:  # ends early when the daemon exits; else the runs are asked again
                self.proc.wait(min(CLOSE_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass

    def _record_exited(self) -> None:
        """Name our stopped daemon in the lock file before letting it go, when `ensure()` never got
        to (a command signalled during its launch): the latest heartbeat is then ours, or that of a
        daemon already judged gone when ours was started, so the next command's `daemon_liveness`
        says "has exited" instead of trusting a heartbeat under FRESH_HEARTBEAT_SECONDS old (the
        next `migrate run` would wait ~90 s, queued, on no daemon)."""
        if self.recorded:
            return
        try:
            beat = self.instance.get_daemon_heartbeats().get(RUN_COORDINATOR_DAEMON)
        except Exception:  # noqa: BLE001 - shutting down: the heartbeat rule still applies
            return
        if beat is not None and beat.daemon_id:
            self.lock.record(daemon_id=beat.daemon_id)
            self.recorded = True


@contextmanager
def daemon_for_duration(instance: DagsterInstance, env: dict[str, str], home: Path, log_path: Path,
                        echo: Callable[[str], None] = print, linger: float = 1800.0) -> Iterator[DaemonKeeper]:
    """A DaemonKeeper whose daemon (if it started one) is stopped on exit; see DaemonKeeper.close."""
    keeper = DaemonKeeper(instance, env, home, log_path, echo)
    try:
        yield keeper
    finally:
        keeper.close(linger)
