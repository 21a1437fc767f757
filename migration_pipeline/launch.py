"""Launching a tenant through Dagster from the command line, on the instance the UI uses.

`migrate run` checks its inputs (settings, `--kinds` against the provider's plan, the source's
variables) before anything is launched, adds the tenant's partition and creates the tenant job's
run in this process (`place_tenant_run`: the same tags, partition, config and code location origin
as a launch from the UI, so the UI shows it, its events and materialisations like any other). Then
one of two paths:

* No daemon alive for the instance (`daemon_liveness`; the command would otherwise start one for
  its duration) and MIGRATE_RUN_IN_PROCESS not 0: when the lane has room (`start_if_room`: the run
  queue's limits in dagster.yaml, counted under a lock shared by every `migrate run`; the race it
  leaves is in its docstring), the run goes STARTING and executes in the command's own process
  (`InProcessRun`, as Dagster's run worker executes it): no daemon, code server or run worker
  process, each of which imported Dagster anew (issue 11: ~8 s of every small `migrate run`).
  Stopping it from anywhere ends it CANCELED with the engine run stopped and resumable: a signal
  to the command, `migrate stop` (the phase op), the UI's Terminate (a watcher thread sees it
  CANCELING and interrupts the execution as a run worker is interrupted).
* A daemon alive (the UI's), the lane full, or MIGRATE_RUN_IN_PROCESS=0: the run is submitted to
  the instance's run coordinator (queued, it counts in the lane like any other), a daemon dequeues
  it (the UI's, or one started for the duration), and the command waits for the run, saying why
  while it is queued and giving up after MIGRATE_QUEUE_TIMEOUT_SECONDS. A daemon is never started
  while one serves the instance (a second daemon beside a `dagster dev` UI stole and then
  interrupted the UI's runs).

Liveness of the daemon. Dagster's own `DaemonStatus.healthy` tolerates a heartbeat up to 30 min
old (DEFAULT_DAEMON_HEARTBEAT_TOLERANCE_SECONDS), so a daemon that stopped a minute ago still
counts, and a run queued then waits for nobody. Here a daemon is alive when
* the instance's daemon lock is held: `DAGSTER_HOME/daemon-<storage>.lock`, an flock taken by the
  `migrate` process that starts a daemon (`migrate ui`'s `dagster dev`, `migrate run`'s
  `dagster-daemon`) and inherited by that child, so it is released exactly when both are gone; or
* the lock is free and the run coordinator's heartbeat is newer than FRESH_HEARTBEAT_SECONDS (three
  of Dagster's 30 s heartbeat intervals), from a daemon other than the one the lock file says has
  exited: that is a daemon started by hand (`dagster dev` after `migrate dagster env`).
"""
from __future__ import annotations

import fcntl
import gc
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from engine_core.config import shown_url
from migration_pipeline import stack, tags
from migration_pipeline.jobs import TENANT_JOB
from migration_pipeline.partitions import TENANTS

FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]

RUN_COORDINATOR_DAEMON = "QUEUED_RUN_COORDINATOR"
HEARTBEAT_INTERVAL_SECONDS = 30.0  # dagster._daemon.controller.DEFAULT_HEARTBEAT_INTERVAL_SECONDS
FRESH_HEARTBEAT_SECONDS = 3 * HEARTBEAT_INTERVAL_SECONDS
# How long a started daemon may take to write its first heartbeat before we say it failed.
DAEMON_START_SECONDS = 120.0
# How often `migrate run` reads its Dagster run while waiting (one run-storage query a poll, on the
# storage's kept connection: migration_pipeline/storage.py): a finished run is seen within this (it
# was 2 s, then 0.5 s: on average half of it in every run's tail, issue 11).
POLL_SECONDS = 0.25
# How often DaemonKeeper.close asks whether the runs its daemon serves are still in flight.
CLOSE_POLL_SECONDS = 0.5
# What `dagster-daemon run` logs once its daemon threads have stopped on an interrupt
# (dagster._daemon.controller.DagsterDaemonController.__exit__): from then on it launches nothing.
DAEMON_THREADS_SHUT_DOWN = b"Daemon threads shut down."


class LaunchError(RuntimeError):
    """Dagster refused or failed to launch the run, or the run could not be waited for."""


def new_run_config(kinds: list[str] | None = None, dry_run: bool = False, options: dict[str, Any] | None = None) -> dict:
    config: dict[str, Any] = {"options_json": json.dumps(options or {})}
    if kinds:
        config["kinds"] = list(kinds)
    if dry_run:
        config["dry_run"] = True
    return {"resources": {"new_run": {"config": config}}}


# -- checks before anything is launched -----------------------------------------------------------

# The variables the Dagster resources read through EnvVar at launch (resources.source_resource).
SOURCE_ENV: dict[str, tuple[str, ...]] = {"pipedrive": ("PIPEDRIVE_BASE_URL", "PIPEDRIVE_API_TOKEN")}


# A tenant name: it is a Dagster partition key (shown in the UI, typed into its partition selector
# and backfill ranges, where "," and "..." separate keys and control characters are refused), the
# engine's tenant_id, and a word in run names and logs. Letters, digits, ".", "_", "-", starting
# with a letter or digit, at most 63 characters (a Postgres identifier's length, room for a prefix).
TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
TENANT_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit, at most 63 characters"


def check_tenant(tenant: str, given_as: str = "--tenant") -> str:
    """The tenant name, or ConfigError (one line, naming the value and `given_as`, how the command
    took it: "--tenant", or "TENANT" for a positional argument) when it is not TENANT_PATTERN:
    empty, spaces, slashes, commas, control characters, longer than 63 characters."""
    from engine_core.errors import ConfigError

    if not TENANT_PATTERN.fullmatch(tenant or "") or ".." in tenant:
        shown = tenant if len(tenant) <= 80 else tenant[:77] + "..."
        raise ConfigError(f"{given_as} {shown!r} is not a valid tenant name ({len(tenant)} characters): "
                          f"use {TENANT_RULE}")
    return tenant


# The variable naming each source's address, checked by a TCP connect before a launch (no request
# is sent, no budget spent): an unreachable source used to show only as a run paused minutes later.
SOURCE_URL_ENV: dict[str, str] = {"pipedrive": "PIPEDRIVE_BASE_URL"}
CONNECT_TIMEOUT_SECONDS = 5.0


def check_source_reachable(source: str, env: dict[str, str] | None = None,
                           timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """A TCP connect to the host and port of the source's base URL (SOURCE_URL_ENV), within
    `timeout` seconds. Raises ConfigError (one line, naming the variable, its URL without any
    user:password part, and the connect error). Sources without a URL variable are not checked."""
    import socket
    from engine_core.errors import ConfigError

    name = SOURCE_URL_ENV.get(source)
    url = (dict(os.environ if env is None else env).get(name or "", "") or "").strip()
    if not name or not url:
        return
    parts = urlsplit(url)
    shown = shown_url(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"{name}={shown!r} has no valid port") from None
    if not parts.hostname:
        raise ConfigError(f"{name}={shown!r} names no host")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except OSError as e:
        why = f"no answer in {timeout:.0f} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ConfigError(f"{name}={shown}: cannot connect to {parts.hostname}:{port} ({why}); "
                          f"start the source or fix the URL") from None


def pickable_kinds(provider: Any) -> list[list[str]]:
    """The provider's phases without its catch-up phase (`catchup_kind`): the kinds a user may
    name in `--kinds`. The catch-up is a phase every run ends with (`runs.run_plan` keeps it), not
    a kind to pick."""
    from engine_core.source import catchup_kind

    ck = catchup_kind(provider)
    return [[k for k in group if k != ck] for group in provider.phases() if any(k != ck for k in group)]


def check_kinds(provider: Any, kinds: list[str]) -> None:
    """`--kinds` against the provider's pickable kinds (`pickable_kinds`). Raises ConfigError (one
    line naming the option, the unknown kinds and the kinds there are)."""
    from engine_core.errors import ConfigError
    from engine_core.plan import plan_for
    from engine_core.source import catchup_kind

    ck = catchup_kind(provider)
    phases = pickable_kinds(provider)
    if ck is not None and ck in kinds:
        known = sorted(k for group in phases for k in group)
        raise ConfigError(f"--kinds: {ck!r} is the catch-up phase every run ends with, not a kind to pick; "
                          f"kinds: {', '.join(known)}")
    try:
        plan_for(phases, kinds)
    except ConfigError as e:
        raise ConfigError(f"--kinds: {e}") from None


def check_launch(source: str, kinds: list[str] | None, options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
    """What would fail a launch, checked first: `kinds` against the provider's plan, the source's
    variables (set, and accepted by the provider's own configuration), then whether the source's
    base URL accepts a connection (`check_source_reachable`) and its token is accepted
    (`check_source_token`: one request); the run `options` by the provider's `check_options`.
    Raises ConfigError with a one-line message naming the option or the variable."""
    from engine_core.errors import ConfigError
    from engine_core.plan import plan_for
    from engine_core.providers.registry import provider_for

    env = dict(os.environ if env is None else env)
    provider = provider_for(source)
    if kinds:
        check_kinds(provider, kinds)
    for name in SOURCE_ENV.get(source, ()):
        if not env.get(name, "").strip():
            raise ConfigError(f"{name} is not set (needed to launch a {source} run); see the README's Configuration")
    config = getattr(provider, "config", None)
    if callable(config):
        config()  # the provider's own checks (URL scheme, token shape, numbers), nothing sent
    check_options = getattr(provider, "check_options", None)
    if callable(check_options):  # the run options: names and values (runs.start_run checks them too)
        check_options(options or {})
    check_source_reachable(source, env)
    check_source_token(source, provider)


def check_tenant_source(db: Any, tenant: str, source: str) -> None:
    """Before a launch (`migrate run`, `migrate sync`): settings that reach another source than
    the tenant's data came from (another Pipedrive company) are refused in one line
    (TenantSourceMismatch, `runs.check_tenant_identity`) - the engine refuses them too, but only
    inside the Dagster run, whose step then failed and left a FAILURE run in the partition's
    history (a fresh user's find). One request (the source's company) when the tenant has a run;
    none for a new tenant."""
    from engine_core import runs
    from engine_core.source import identity_of
    from engine_core.providers.registry import provider_for

    if runs.tenant_identity(db, tenant, source) is None:
        return
    runs.check_tenant_identity(db, tenant, source, identity_of(provider_for(source)))


# The variable naming each source's credential, asked about by one authenticated request before a
# launch (`check_source_token`): a wrong token used to pass every check, start the run and fail it
# later with AuthError, leaving a failed partition behind.
SOURCE_TOKEN_ENV: dict[str, str] = {"pipedrive": "PIPEDRIVE_API_TOKEN"}


def check_source_token(source: str, provider: Any, timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
    """One request with the source's credential: for Pipedrive `GET /v1/users/me` through the
    provider's own client (engine_core.providers.pipedrive.client), with no retry (2 of the
    account's daily tokens, nothing else). Raises ConfigError (one line naming SOURCE_TOKEN_ENV's
    variable and the base URL, never the token) when the source refuses it (401/403), and naming
    the base URL's variable when the server there is no Pipedrive API (404, or a 200 whose body is
    not a Pipedrive user). Any other failure (a 5xx, a 429, a timeout) is left to the run's own retry policy. Sources without a
    token variable are not checked."""
    from engine_core.errors import ConfigError

    name = SOURCE_TOKEN_ENV.get(source)
    if name is None:
        return
    from engine_core.providers.pipedrive.client import PipedriveClient
    from engine_core.providers.pipedrive.errors import AuthError, BadResponse, NotFound, PipedriveError
    from engine_core.providers.pipedrive.provider import ENV_BASE_URL as base_env

    cfg = provider.config()
    shown = shown_url(cfg.base_url)
    try:
        with PipedriveClient(cfg.base_url, cfg.token, timeout=timeout, max_retries=0) as client:
            client.me()
    except AuthError as e:
        raise ConfigError(f"{name} was refused by {shown} (HTTP {e.status or '401'} on GET /v1/users/me): "
                          f"set it to the account's API token") from None
    except (NotFound, BadResponse, ValueError) as e:
        # A server that answers but is no Pipedrive API (a fresh user's find: a host that answers 404
        # to everything let the launch through; its tasks then failed on 404s): every Pipedrive
        # account has GET /v1/users/me, and it answers JSON.
        what = "HTTP 404" if isinstance(e, NotFound) else "no Pipedrive user (a body that is not its JSON)"
        raise ConfigError(f"{base_env} {shown} is not a Pipedrive API: GET /v1/users/me answered {what} "
                          f"(the base URL is the company's, e.g. https://<company>.pipedrive.com)") from None
    except PipedriveError:
        return  # not a verdict on the token: the run's retry policy meets it


# -- daemon liveness ------------------------------------------------------------------------------


def lock_path(home: Path, storage_url: str) -> Path:
    """The instance's daemon lock: one per DAGSTER_HOME and storage (the password not hashed in)."""
    from engine_core.db import redact

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


def source_identity(env: dict[str, str]) -> str:
    """Which source account a daemon started with `env` has its runs read: the host of
    PIPEDRIVE_BASE_URL and a 12-hex one-way fingerprint of PIPEDRIVE_API_TOKEN, e.g.
    "127.0.0.1:8765#3f2a9c01d4e7" - the provider's account key, safe to write to the lock file (the
    token cannot be recovered from it). A run executes in the daemon's processes, with the daemon's
    environment, not the launching shell's: the launch compares the two (`check_same_source`)."""
    base = env.get("PIPEDRIVE_BASE_URL", "")
    host = urlsplit(base).netloc or base or "default"
    token = env.get("PIPEDRIVE_API_TOKEN", "")
    return f"{host}#{hashlib.sha256(token.encode()).hexdigest()[:12] if token else 'no-token'}"


def check_same_source(lock: Path, env: dict[str, str]) -> None:
    """Raise LaunchError (one line) when the daemon holding `lock` was started with another source
    account than `env`'s: its runs would read that other account (a fresh user's run "succeeded"
    with another tenant's data this way). A daemon that recorded no source is not judged."""
    info = _read_info(lock)
    theirs, ours = info.get("source"), source_identity(env)
    if theirs and theirs != ours:
        raise LaunchError(
            f"the daemon serving this instance ({info.get('by', 'migrate')}, pid {info.get('pid', '?')}) reads "
            f"source {theirs}, but this shell's PIPEDRIVE_BASE_URL/PIPEDRIVE_API_TOKEN reach {ours}: its runs "
            f"would read the other account; stop it or launch with its settings")


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
        assert self.fd is not None, "record() needs the lock"
        self.info.update(info)
        data = json.dumps(self.info).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
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
                         source=source_identity(self.env))
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
        says "has exited" instead of trusting a heartbeat under FRESH_HEARTBEAT_SECONDS old (a
        fresh user's next `migrate run` waited ~90 s, queued, on no daemon)."""
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


# -- signals: a command that is stopped stops what it started -----------------------------------

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long an interrupted `migrate run` waits for its Dagster run to end CANCELED (the phase op
# stops at its next task boundary) before it stops its daemon, whose process group ends the run.
INTERRUPT_WAIT_SECONDS = 60.0


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached a command while it waited on work it launched. A
    KeyboardInterrupt, so every `finally` and BaseException handler on the way runs as for Ctrl-C."""

    def __init__(self, signo: int, announced: bool = False) -> None:
        self.signo = int(signo)
        self.announced = announced  # "SIGTERM: stopping what this command started" was said already
        super().__init__(signal.Signals(signo).name)

    @property
    def exit_code(self) -> int:
        """The shell's convention for a command ended by a signal: 128 + the signal's number."""
        return 128 + self.signo


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While inside: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread (SIGTERM and
    SIGHUP would otherwise end the process at once, skipping every cleanup, and a script started
    with `&` has SIGINT ignored). The previous handlers are restored on exit."""
    def _raise(signo: int, frame: Any) -> None:
        raise Interrupted(signo)

    previous = {sig: signal.signal(sig, _raise) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """While inside: the stop signals are ignored (the cleanup of an interrupted command runs to
    its end, bounded by its own waits, instead of being cut short by a second Ctrl-C)."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_launched_run(instance: DagsterInstance, run_id: str, echo: Callable[[str], None] = print,
                      wait: float = INTERRUPT_WAIT_SECONDS) -> DagsterRunStatus | None:
    """Stop the Dagster run a command launched, and the engine run it drives: a queued run is
    cancelled from the queue; a started one has its engine run's stop flag set
    (`deploy.stop_engine_run`: every worker of the run, drainers included, stops at its next task
    boundary, keeping its checkpoints) and is terminated through the run launcher, so it ends
    CANCELED as a terminate from the UI does (the one-story rule), and tagged `dagster/max_retries=0`
    so Dagster's run retries never re-execute it. Waits up to `wait` seconds for
    it to finish; returns its status then (None: no such run). Resumable: launching the partition
    again resumes the engine run from its checkpoints."""
    from migration_pipeline.lane.terminate import stop_engine_run

    from dagster._core.storage.tags import MAX_RETRIES_TAG

    run = instance.get_run_by_id(run_id)
    if run is None:
        return None
    if run.status not in FINISHED:
        # A stop the user asked for is not retried: a run that then fails (its worker dies with
        # our daemon, or it was still starting) would be re-executed by Dagster's run retries
        # (dagster.yaml), migrating again after the user asked to stop (a fresh user's find).
        instance.add_run_tags(run_id, {MAX_RETRIES_TAG: "0"})
    deadline = time.monotonic() + wait
    asked = False
    while run is not None and run.status not in FINISHED:
        if run.status != DagsterRunStatus.QUEUED:
            stop_engine_run(instance, run_id)  # idempotent; the tag may appear once the op attaches
        if not asked or run.status == DagsterRunStatus.QUEUED:
            try:
                instance.run_coordinator.cancel_run(run_id)
                asked = True
            except Exception as e:  # noqa: BLE001 - the engine's stop flag is set either way
                echo(f"could not terminate Dagster run {run_id} through its launcher: {e}")
                asked = True
            run = instance.get_run_by_id(run_id)
            if run is not None and run.status in (DagsterRunStatus.STARTING, DagsterRunStatus.CANCELING) \
                    and not worker_started(instance, run_id):
                # asked to stop before its run worker started (whichever daemon launched it: ours or
                # the UI's): the launcher could not reach a worker, the worker that starts next finds
                # the run CANCELING and executes nothing, and Dagster then marked it FAILURE ("marked
                # as failed from outside the execution context"; issue 10's leftover). It is CANCELED
                mark_canceled(instance, run_id, "stopped by the command that launched it before its run worker started; "
                                                "nothing was executed")
                run = instance.get_run_by_id(run_id)
                continue
        if time.monotonic() >= deadline:
            break
        time.sleep(1)
        run = instance.get_run_by_id(run_id)
    stop_engine_run(instance, run_id)
    return run.status if run is not None else None


def worker_started(instance: DagsterInstance, run_id: str) -> bool:
    """Whether a run worker has begun executing the run (its RUN_START event)."""
    from dagster import DagsterEventType

    return bool(instance.get_records_for_run(run_id, of_type=DagsterEventType.RUN_START, limit=1).records)


def mark_canceled(instance: DagsterInstance, run_id: str, why: str) -> None:
    """A run left in progress after its daemon (and so its run worker) was stopped: CANCELED, with
    `why`, so Dagster does not show a run as started for ever (the local launcher cannot see a dead
    worker; DAGSTER_NOTES.md trap 7)."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status not in FINISHED:
        instance.report_run_canceling(run, message=why)
        instance.report_run_canceled(run, message=why)


# -- the queue ------------------------------------------------------------------------------------


def queue_state(instance: DagsterInstance, run_id: str, lane_width: int) -> str:
    """Why a queued run waits, in one line: the runs ahead of it in the lane (those in progress
    carrying `dagster/partition`, and those queued before it), or the dequeuer's next pass."""
    me = instance.get_run_record_by_id(run_id)
    in_progress = sum(1 for r in instance.get_run_records(RunsFilter(statuses=IN_PROGRESS))
                      if tags.PARTITION in r.dagster_run.tags)
    ahead = 0
    if me is not None:
        ahead = sum(1 for r in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))
                    if tags.PARTITION in r.dagster_run.tags and r.dagster_run.run_id != run_id
                    and r.create_timestamp <= me.create_timestamp)
    if in_progress >= lane_width or ahead:
        return f"queued behind {in_progress + ahead} run{'' if in_progress + ahead == 1 else 's'} in the lane ({in_progress} of {lane_width} slots busy, {ahead} queued ahead)"
    return f"queued; the lane has {lane_width - in_progress} of {lane_width} slots free, waiting for the daemon to dequeue it"


def code_location_origin():  # -> ManagedGrpcPythonEnvCodeLocationOrigin
    """The code location every run of this project names: the definitions module
    (stack.DEFS_MODULE) loaded from the working directory, as `dagster job launch -m` and
    `dagster-daemon run -m` (stack.daemon) / `dagster dev -m` name it. The daemon's run launcher
    finds the run's code location in its own workspace by this origin's location name."""
    from dagster._core.workspace.load import location_origin_from_module_name

    return location_origin_from_module_name(stack.DEFS_MODULE, None, os.getcwd())


def _current_definitions() -> None:
    """The definitions module as this process's MIGRATE_SOURCE builds it: `migrate run --source X`
    sets MIGRATE_SOURCE after the module may have been imported with another source (its
    `resolve_source` ran at import), so it is rebuilt once when the two differ."""
    import importlib
    import sys

    module = sys.modules.get(stack.DEFS_MODULE)
    if module is not None and module.SOURCE != module.resolve_source():
        importlib.reload(module)


def _dagster_lines(error: BaseException) -> list[str]:
    """The lines of a Dagster error worth a user's reading: its message (a config error's list of
    problems), without tracebacks; at most 6, duplicates dropped."""
    text = str(error).strip() or type(error).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("File ", "raise "))]
    return list(dict.fromkeys(lines))[:6] or [type(error).__name__]


def submit_tenant_run(instance: DagsterInstance, tenant: str, run_config: dict, job: str = TENANT_JOB,
                      run_id: str | None = None, run_tags: dict[str, str] | None = None) -> str:
    """Submit `job` for the tenant's partition to the instance's run coordinator (queued); the run
    id. `place_tenant_run` without `start_here`: see there."""
    return place_tenant_run(instance, tenant, run_config, job=job, run_id=run_id, run_tags=run_tags).run_id


@dataclass
class Placement:
    """Where `place_tenant_run` put a run: `here` (STARTING, to be executed in this process by
    `InProcessRun`) or queued for a daemon; `why` says why it was not started here (one line)."""

    run_id: str
    here: bool
    why: str = ""


def place_tenant_run(instance: DagsterInstance, tenant: str, run_config: dict, job: str = TENANT_JOB,
                     run_id: str | None = None, run_tags: dict[str, str] | None = None,
                     start_here: bool = False) -> Placement:
    """Create `job`'s run for the tenant's partition, then start it here or queue it.

    In this process, what `dagster job launch` did in a subprocess of its own (a second Dagster
    import and a code server: ~10 s of every `migrate run`, issue 11): the definitions are loaded
    in-process (InProcessWorkspaceLoadTarget), the run is created with the job's tags merged with
    `dagster/partition=tenant` (and `run_tags`, e.g. tags.NEW_RUN), the run config, its execution
    plan, and the remote origin `dagster job launch -m` records (`code_location_origin()`, a
    managed gRPC origin: the daemon's run launcher finds that location in its own workspace).

    `start_here` (no daemon serves the instance, `migrate run` decided to execute the run itself):
    under the instance's lane lock (`lane_lock`), when the run queue's limits leave it room
    (`lane_room`: the same count the daemon's dequeuer makes), the run goes STARTING as
    `DagsterInstance.launch_run` marks a run it hands to a launcher (RUN_STARTING event), and
    Placement.here is True. Otherwise - or without `start_here` - it is submitted: the
    QueuedRunCoordinator queues it and a daemon dequeues it as any other run.

    Raises LaunchError with Dagster's error lines (an unknown job, a run config the job refuses, a
    code location that does not load); nothing is created then."""
    from dagster import __version__
    from dagster._core.definitions.selector import JobSubsetSelector
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._utils.merger import merge_dicts
    from dagster._utils.tags import normalize_tags

    run_id = run_id or str(uuid.uuid4())
    origin = code_location_origin()
    name = origin.location_name
    target = InProcessWorkspaceLoadTarget(InProcessCodeLocationOrigin(origin.loadable_target_origin, location_name=name))
    try:
        _current_definitions()
        with WorkspaceProcessContext(instance, target, version=__version__) as process:
            workspace = process.create_request_context()
            if workspace.has_code_location_error(name):
                raise LaunchError(f"the code location {name} does not load:\n"
                                  + "\n".join(_dagster_lines(workspace.get_code_location_error(name))))
            location = workspace.get_code_location(name)
            repo = next(iter(location.get_repositories().values()))
            if not repo.has_job(job):
                raise LaunchError(f"no job {job!r} in {name} (jobs: {', '.join(sorted(j.name for j in repo.get_all_jobs()))})")
            remote_job = location.get_job(JobSubsetSelector(location_name=name, repository_name=repo.name,
                                                            job_name=job, op_selection=None))
            plan = location.get_execution_plan(remote_job, run_config, step_keys_to_execute=None, known_state=None,
                                               instance=instance).execution_plan_snapshot
            run = instance.create_run(
                job_name=job, run_id=run_id, run_config=run_config,
                resolved_op_selection=remote_job.resolved_op_selection,
                step_keys_to_execute=plan.step_keys_to_execute, op_selection=None, status=None,
                root_run_id=None, parent_run_id=None,
                tags=normalize_tags(merge_dicts(remote_job.tags, {**(run_tags or {}), tags.PARTITION: tenant})),
                job_snapshot=remote_job.job_snapshot, execution_plan_snapshot=plan,
                parent_job_snapshot=remote_job.parent_job_snapshot,
                remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(origin, repo.name), job),
                job_code_origin=remote_job.get_python_origin(),
                asset_selection=None, asset_check_selection=None, asset_graph=repo.asset_graph)
            why = start_if_room(instance, run) if start_here else ""
            if start_here and not why:
                return Placement(run_id, True)
            instance.submit_run(run.run_id, workspace)
            return Placement(run_id, False, why)
    except LaunchError:
        raise
    except Exception as e:  # noqa: BLE001 - Dagster's refusal, as one message
        raise LaunchError("Dagster could not launch the run:\n" + "\n".join(_dagster_lines(e))) from None


def add_tenant(instance: DagsterInstance, tenant: str) -> bool:
    """Add the tenant's partition; True when it was new (so a failed launch can take it back)."""
    if instance.has_dynamic_partition(TENANTS, tenant):
        return False
    instance.add_dynamic_partitions(TENANTS, [tenant])
    return True


def undo_failed_launch(instance: DagsterInstance, tenant: str, run_id: str, added: bool) -> None:
    """Nothing left behind by a launch that failed: its run record, if one was created and never
    started, and the partition this command added, when no other run of the tenant exists."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.FAILURE,
                                          DagsterRunStatus.CANCELED):
        instance.delete_run(run_id)
    if added and not instance.get_runs_count(RunsFilter(tags={tags.PARTITION: tenant})):
        instance.delete_dynamic_partition(TENANTS, tenant)


def wait_for_run(instance: DagsterInstance, run_id: str, *, poll: float = POLL_SECONDS,
                 on_tick: Callable[[Any], None] | None = None, timeout: float | None = None,
                 keeper: DaemonKeeper | None = None, lane_width: int = 4, queue_timeout: float | None = None,
                 on_queued: Callable[[str], None] | None = None):
    """Until the Dagster run finishes; returns it.

    While it is queued: `keeper.ensure()` on every poll (a daemon is started when none is alive),
    `on_queued(why)` whenever the reason changes (and every 30 s), and after `queue_timeout`
    seconds in the queue the run is cancelled and LaunchError says why it waited. `timeout`
    bounds the whole wait: then the run is stopped (`stop_launched_run`: cancelled from the queue,
    or its engine run stopped and the run terminated, resumable) and TimeoutError says so."""
    deadline = None if timeout is None else time.monotonic() + timeout
    queued_since: float | None = None
    said, said_at = "", 0.0
    while True:
        run = instance.get_run_by_id(run_id)
        if keeper is not None:
            keeper.ensure()
        if on_tick is not None and run is not None:
            on_tick(run)
        if run is not None and run.status in FINISHED:
            return run
        if run is not None and run.status == DagsterRunStatus.QUEUED:
            queued_since = queued_since or time.monotonic()
            why = queue_state(instance, run_id, lane_width)
            if keeper is not None and not keeper.last.alive:
                why = keeper.last.why
            now = time.monotonic()
            if on_queued is not None and (why != said or now - said_at >= 30):
                on_queued(why)
                said, said_at = why, now
            if queue_timeout is not None and now - queued_since > queue_timeout:
                instance.run_coordinator.cancel_run(run_id)
                raise LaunchError(f"gave up: Dagster run {run_id} was still queued after {queue_timeout:.0f} s "
                                  f"({why}); it was cancelled (MIGRATE_QUEUE_TIMEOUT_SECONDS sets the limit)")
        else:
            queued_since = None
        if deadline is not None and time.monotonic() > deadline:
            # As the in-process path does: what the command launched does not go on unattended (a
            # fresh user's find: a run left QUEUED after --timeout was dequeued later and ran alone).
            was = run.status.value if run else "missing"
            final = stop_launched_run(instance, run_id, echo=lambda m: None)
            raise TimeoutError(f"Dagster run {run_id} still {was} after {timeout:.0f} s (--timeout): it was stopped "
                               f"({final.value if final else 'gone'}); launching the tenant again resumes it")
        time.sleep(poll)


# -- executing the run in this process (no daemon alive) ------------------------------------------

IN_PROCESS_ENV = "MIGRATE_RUN_IN_PROCESS"  # engine_core.config.FACE_SWITCHES
# How often the watcher of an in-process run reads it (progress, the UI's terminate). A signal wakes
# it at once (`_wake`) and the run's end is the main thread's, so only those two wait on the poll:
# 0.5 s, not POLL_SECONDS' 0.25 s - each read is a run-storage query plus the progress's engine
# reads, ~0.5 s of CPU per small run at 0.25 s (py-spy, issue 11).
WATCH_SECONDS = 0.5
# A terminate asked of an in-process run is delivered to the main thread again after this long while
# the run has not ended: a delivery that lands inside a nested `capture_interrupts` (the phase op's
# own stop, lane.hold_interrupts) is dropped by Dagster when that block exits.
REDELIVER_SECONDS = 2.0
# Where Dagster's own output of in-process runs goes (its console logger writes every event to
# stderr; in a run worker that went to the daemon's log), under DAGSTER_HOME.
IN_PROCESS_LOG = "in-process-runs.log"


def run_in_process(env: dict[str, str] | None = None) -> bool:
    """MIGRATE_RUN_IN_PROCESS: whether `migrate run` may execute its Dagster run in its own process
    when no daemon serves the instance (default 1; 0 keeps the old path: a daemon started for the
    duration of the command, a code server and a run worker). Raises ConfigError naming the
    variable (one line) for any other value than 1/0, true/false, yes/no, on/off
    (`engine_core.config.switch`, also checked by `check_environment`)."""
    from engine_core.config import switch

    return switch(IN_PROCESS_ENV, env)


def _storage_engine(instance: DagsterInstance) -> Any:
    """The SQLAlchemy engine of the instance's Postgres run storage (migration_pipeline.storage),
    or None (another storage: the tests' SQLite instances)."""
    storage = instance.run_storage
    for candidate in (storage, getattr(storage, "_storage", None)):
        engine = getattr(candidate, "_engine", None)
        if engine is not None and getattr(engine.dialect, "name", "") == "postgresql":
            return engine
    return None


# The lane lock's key: a Postgres advisory lock in Dagster's storage database (one per instance,
# since each engine database has its own storage database: migration_pipeline.instance).
LANE_LOCK_KEY = int.from_bytes(hashlib.sha256(b"migrate run: in-process lane").digest()[:8], "big", signed=True)


@contextmanager
def lane_lock(instance: DagsterInstance) -> Iterator[None]:
    """While inside, no other `migrate run` on this instance counts the lane and starts a run here
    (`place_tenant_run(start_here=True)`): a session advisory lock on a connection of the run
    storage, released on exit (or by Postgres, if this process dies). Nothing on a storage that is
    not Postgres."""
    engine = _storage_engine(instance)
    if engine is None:
        yield
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_lock(%s)", (LANE_LOCK_KEY,))
        try:
            yield
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%s)", (LANE_LOCK_KEY,))


def lane_room(instance: DagsterInstance, run: Any) -> str:
    """"" when the instance's run queue would dequeue `run` now, else why not (one line): the count
    Dagster's QueuedRunCoordinatorDaemon makes - the runs in progress (STARTING, STARTED,
    CANCELING) against `max_concurrent_runs` and the `tag_concurrency_limits` (dagster.yaml: at
    most the lane width of runs carrying `dagster/partition`), through Dagster's own
    TagConcurrencyLimitsCounter."""
    from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    config = instance.get_concurrency_config().run_queue_config
    if config is None:
        return ""
    active = [r.dagster_run for r in instance.get_run_records(RunsFilter(statuses=list(ACTIVE_RUN_STATUSES)))
              if r.dagster_run.run_id != run.run_id]
    if config.max_concurrent_runs != -1 and len(active) >= config.max_concurrent_runs:
        return f"{len(active)} runs in progress (the instance's max_concurrent_runs is {config.max_concurrent_runs})"
    if TagConcurrencyLimitsCounter(list(config.tag_concurrency_limits or []), active).is_blocked(run):
        lane = sum(1 for r in active if tags.PARTITION in r.tags)
        return f"the lane is full ({lane} runs in progress carry {tags.PARTITION})"
    return ""


def start_if_room(instance: DagsterInstance, run: Any) -> str:
    """Under the lane lock: runs whose in-process executor died are failed first
    (`launcher.fail_runs_of_dead_processes`); then, when the lane has room for `run` (`lane_room`), mark it STARTING
    (`mark_starting`) and return ""; else return why not, the run left as it was.

    The race that remains. Between two `migrate run`s of this project the lock makes the count and
    the start one step: they start at most as many runs as the lane has room for. A daemon's
    dequeuer takes no such lock: a daemon that came alive after the command judged that none is
    (`migrate ui` started in the same second) may launch a queued run while the command starts
    its own, putting the lane one run over its Dagster limit, per such coincidence, for the length
    of those runs. It is bounded: only runs already queued (launched while no daemon was alive)
    can be dequeued in that window, the next dequeue counts the command's STARTING run, and the
    engine's own lane - the slots a phase op takes under its Postgres advisory lock
    (`migration/lane_slots`, MIGRATE_LANE_WIDTH threads in all) - is never over: an extra run
    waits for a slot rather than adding threads."""
    from migration_pipeline.launcher import fail_runs_of_dead_processes

    with lane_lock(instance):
        fail_runs_of_dead_processes(instance)  # a killed `migrate run`'s run holds no slot
        why = lane_room(instance, run)
        if not why:
            mark_starting(instance, run)
        return why


def mark_starting(instance: DagsterInstance, run: Any) -> None:
    """The run goes STARTING as `DagsterInstance.launch_run` marks a run before its launcher starts
    it (a RUN_STARTING event): from then on it counts in the lane (`lane_room`, the daemon's
    dequeuer) like a run a daemon launched. It carries this process's identity
    (launcher.IN_PROCESS_TAG), so that a run left by a killed command is failed, not counted for
    ever (`launcher.fail_runs_of_dead_processes`, the daemon's run monitoring)."""
    from dagster._core.events import DagsterEvent, DagsterEventType

    from migration_pipeline.launcher import IN_PROCESS_TAG, process_identity

    instance.add_run_tags(run.run_id, {IN_PROCESS_TAG: process_identity()})
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value,
                                               job_name=run.job_name), run_id=run.run_id)


@contextmanager
def output_aside(log_path: Path) -> Iterator[tuple[Any, Any]]:
    """While inside, file descriptors 1 and 2 write to `log_path` (appended); yields text files on
    the command's own stdout and stderr for what the user is to see.

    An in-process run brings Dagster's run-worker output into the command: its console logger
    writes every event to stderr, and its compute-log capture (LocalComputeLogManager) points
    descriptors 1 and 2 at the run's log files for the whole run and mirrors them back with `tail
    -F` to wherever 1 and 2 pointed before - here `log_path`, as a run worker's went to the
    daemon's log. The command's progress and messages go to the yielded files instead."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = os.fdopen(saved[0], "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                    errors="replace", closefd=False)
    err = os.fdopen(saved[1], "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                    errors="replace", closefd=False)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield out, err
    finally:
        for stream in (sys.stdout, sys.stderr, out, err):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (out, err):
            try:
                f.close()
            except OSError:  # its reader has gone (`| head`): what it had not read is dropped
                pass
        for d in (*saved, fd):
            os.close(d)


class InProcessRun:
    """Execute a STARTING Dagster run (`place_tenant_run(start_here=True)`) in this process, as
    Dagster's run worker (`dagster api execute_run`) does: `core_execute_run(recon_job, run,
    instance)` on the main thread, between its "Started process for run" and "Process for run
    exited" engine events. Steps run on the main thread: Dagster's interrupts are delivered there
    (DAGSTER_NOTES.md trap 6) and the phase op's stop handling relies on them.

    A watcher thread, every WATCH_SECONDS while the run executes:
    * calls `on_tick(run)` (the command's progress: the rich bar or the plain lines);
    * delivers an interrupt to the main thread when the run is CANCELING or CANCELED (the UI's
      Terminate: with no gRPC client for the run, DefaultRunLauncher.terminate only marks it
      CANCELING) - what a run worker's interrupt is, SIGINT to the process - again every
      REDELIVER_SECONDS until the run ends;
    * acts on a stop signal (SIGINT, SIGTERM, SIGHUP) the command received: announces it on `err`
      ("SIGTERM: stopping what this command started"), tags the run `dagster/max_retries=0`, sets
      the engine run's stop flag, marks the run CANCELING, then delivers the interrupt. The signal
      is recorded in `signalled`.
    * after `timeout` seconds, stops the run the same way (`timed_out`).

    The signals. Dagster's execution swaps the SIGINT/SIGTERM handlers (capture_interrupts,
    raise_interrupts_as); a signal reaching Dagster's handler first would interrupt the step before
    the run is CANCELING, and the run would end FAILURE ("interrupted unexpectedly"). While the run
    executes here, every handler Dagster installs is wrapped (dagster._utils.interrupts's
    `_replace_interrupt_signal`, 1.13.27): a stop signal is only recorded, the watcher (within
    WATCH_SECONDS) marks the run CANCELING first and then delivers the interrupt
    (`_thread.interrupt_main`), which the wrapper passes to Dagster's handler. So the run ends CANCELED and the engine run stopped, resumable, as from a
    run worker."""

    def __init__(self, instance: DagsterInstance, run_id: str, *, on_tick: Callable[[Any], None] | None = None,
                 err: Any = None, timeout: float | None = None, poll: float = WATCH_SECONDS) -> None:
        self.instance = instance
        self.run_id = run_id
        self.on_tick = on_tick
        self.err = err
        self.timeout = timeout
        self.poll = poll
        self.signalled: int | None = None
        self.timed_out = False
        self.executing = False
        self._stopping = False
        self._deliveries = 0
        self._wake = None  # threading.Event, made in execute()
        self._done = None
        self._delivered_at: float | None = None
        self._said: set[str] = set()  # what `_said_once` has said

    # -- the main thread --------------------------------------------------------------------------

    def execute(self) -> Any:
        """Execute the run; returns it once finished (DagsterRun). A run left unfinished by the
        execution (stopped before its first step, or a framework error) is ended here: CANCELED
        when it was asked to stop, else FAILURE."""
        import threading

        import sys

        from dagster._core.events import EngineEventData
        from dagster._grpc.impl import core_execute_run
        from dagster._utils.error import serializable_error_info_from_exc_info
        from dagster._utils.hosted_user_process import recon_job_from_origin

        instance, run_id = self.instance, self.run_id
        run = instance.get_run_by_id(run_id)
        if run is None:
            raise LaunchError(f"Dagster run {run_id} vanished before it could be executed")
        self._wake, self._done = threading.Event(), threading.Event()
        pid = os.getpid()
        instance.report_engine_event(f"Started process for run (pid: {pid}): `migrate run` executes it in its own "
                                     f"process (no daemon served the instance)", run, EngineEventData.in_process(pid))
        with self._signals_to_watcher():
            watcher = threading.Thread(target=self._watch, name=f"watch-run-{run_id[:8]}", daemon=True)
            watcher.start()
            try:
                if self.signalled is None:
                    try:
                        recon_job = recon_job_from_origin(run.job_code_origin)
                    except Exception:  # noqa: BLE001 - said in the run's events; `_settle` fails the run
                        recon_job = None
                        instance.report_engine_event("Could not load the job to execute it in this process.", run,
                                                     EngineEventData.engine_error(serializable_error_info_from_exc_info(
                                                         sys.exc_info())))
                    # the definitions and the run's workspace, built by the launch, live as long as
                    # the command: not scanned by every full collection while the run executes
                    gc.freeze()
                    self.executing = recon_job is not None
                    try:
                        if recon_job is not None:
                            for _event in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                                pass
                    except BaseException:  # noqa: BLE001 - core_execute_run wrote it to the event log first
                        pass
                    finally:
                        self.executing = False
            finally:
                self._done.set()
                self._wake.set()
                watcher.join()
        instance.report_engine_event(f"Process for run exited (pid: {pid}).", run)
        return self._settle()

    def _settle(self) -> Any:
        run = self.instance.get_run_by_id(self.run_id)
        if run is not None and run.status not in FINISHED:
            if run.status == DagsterRunStatus.CANCELING or self.signalled is not None or self.timed_out:
                mark_canceled(self.instance, self.run_id, "stopped by the command that executed it in its own process "
                                                          "before its steps ran")
            else:
                self.instance.report_run_failed(run, message="`migrate run` executed the run in its own process and it "
                                                             "ended without finishing; see the run's events")
            run = self.instance.get_run_by_id(self.run_id)
        return run

    @contextmanager
    def _signals_to_watcher(self) -> Iterator[None]:
        """The stop signals' handlers, and every SIGINT/SIGTERM handler Dagster installs meanwhile,
        wrapped by `_guard` (see the class docstring); everything restored on exit."""
        from dagster._utils import interrupts

        replace = interrupts._replace_interrupt_signal
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def guarded_replace(handler: Any) -> None:
            replace(self._guard(handler))

        interrupts._replace_interrupt_signal = guarded_replace
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._guard(None))
            yield
        finally:
            interrupts._replace_interrupt_signal = replace
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _guard(self, handler: Any) -> Any:
        """A signal handler in front of `handler` (Dagster's, or none): an interrupt the watcher
        delivers goes through to `handler`; a stop signal from outside is recorded for the watcher,
        nothing else happens on the main thread."""
        if getattr(handler, "_migrate_guard", False):
            return handler

        def guard(signo: int, frame: Any) -> None:
            if self._deliveries > 0:
                self._deliveries -= 1
                if callable(handler):
                    handler(signo, frame)
                return
            if self.signalled is None:  # the watcher sees it within WATCH_SECONDS (no lock taken here:
                self.signalled = int(signo)  # the main thread may hold any lock the signal interrupted)

        guard._migrate_guard = True  # type: ignore[attr-defined]
        return guard

    # -- the watcher thread -----------------------------------------------------------------------

    def _watch(self) -> None:
        started = time.monotonic()
        while not self._done.is_set():
            self._wake.wait(self.poll)
            self._wake.clear()
            if self._done.is_set():
                return
            try:
                if self.timeout is not None and not self.timed_out and time.monotonic() - started > self.timeout:
                    self.timed_out = True
                if (self.signalled is not None or self.timed_out) and not self._stopping:
                    self._stopping = True
                    self._stop_run()
                run = self.instance.get_run_by_id(self.run_id)
                if run is None:
                    continue
                if self.on_tick is not None:
                    try:
                        self.on_tick(run)
                    except KeyboardInterrupt:
                        raise
                    except BaseException as e:  # noqa: BLE001 - progress is best effort; SystemExit too
                        self._said_once("progress", e)
                if run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED) or self._stopping:
                    self._deliver()
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - the storage hiccuped: asked again next poll
                if not isinstance(e, Exception):
                    self._said_once("watch", e)
                continue

    def _said_once(self, what: str, error: BaseException) -> None:
        """One line on `err` the first time `what` ("progress": `on_tick`; "watch": the watcher's own
        work) raised something that is no Exception (SystemExit, GeneratorExit): such an exception
        had ended the watcher thread silently, and with it the stop signals' handling (the watcher
        acts on them) and the terminate delivery. The watcher keeps watching."""
        if what in self._said:
            return
        self._said.add(what)
        if self.err is not None:
            try:
                print(f"the run's {what} display raised {type(error).__name__}{f': {error}' if str(error) else ''}; "
                      f"the run goes on, and a stop signal still stops it" if what == "progress" else
                      f"the run's watcher met {type(error).__name__}; it keeps watching", file=self.err, flush=True)
            except (OSError, ValueError):
                pass

    def _stop_run(self) -> None:
        """A stop this command was asked for (a signal, --timeout): as `stop_launched_run` does for
        a run on a daemon - no Dagster retry, the engine run's stop flag, the run CANCELING."""
        from dagster._core.storage.tags import MAX_RETRIES_TAG

        from migration_pipeline.lane.terminate import stop_engine_run

        if self.signalled is not None and self.err is not None:
            try:
                print(f"{signal.Signals(self.signalled).name}: stopping what this command started", file=self.err,
                      flush=True)
            except OSError:  # stderr's reader has gone (`2>&1 | head`): the stop goes on unsaid
                pass
        self.instance.add_run_tags(self.run_id, {MAX_RETRIES_TAG: "0"})
        stop_engine_run(self.instance, self.run_id)
        run = self.instance.get_run_by_id(self.run_id)
        if run is not None and run.status not in FINISHED and run.status != DagsterRunStatus.CANCELING:
            why = ("`migrate run` got " + signal.Signals(self.signalled).name if self.signalled is not None
                   else f"`migrate run` gave up waiting after {self.timeout:.0f} s (--timeout)")
            self.instance.report_run_canceling(run, message=f"{why}; stopping the run it executes")

    def _deliver(self) -> None:
        """The run worker's interrupt, on the main thread (`_guard` lets it through to Dagster's
        handler): once, then again every REDELIVER_SECONDS while the run executes."""
        import _thread

        now = time.monotonic()
        if not self.executing or (self._delivered_at is not None and now - self._delivered_at < REDELIVER_SECONDS):
            return
        self._delivered_at = now
        self._deliveries += 1
        _thread.interrupt_main(signal.SIGINT)


def wait_tenant_quiet(instance: DagsterInstance, tenant: str, timeout: float = 60.0,
                      poll: float = POLL_SECONDS) -> bool:
    """Until the tenant's helper runs (drainers) have finished too (read every `poll` seconds);
    False when some are still in flight after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not instance.get_runs_count(RunsFilter(tags={tags.PARTITION: tenant}, statuses=IN_FLIGHT)):
            return True
        time.sleep(poll)
    return False


@dataclass
class PhaseResult:
    asset: str
    status: str  # materialized | failed | skipped
    metadata: dict[str, Any] = field(default_factory=dict)
    message: str = ""


def phase_results(instance: DagsterInstance, run_id: str, asset_order: list[str]) -> list[PhaseResult]:
    """Per phase asset: its materialisation metadata, or its failure, from the run's events."""
    from dagster import DagsterEventType

    found: dict[str, PhaseResult] = {}
    records = instance.get_records_for_run(run_id, of_type={DagsterEventType.ASSET_MATERIALIZATION,
                                                            DagsterEventType.STEP_FAILURE}).records
    for rec in records:
        event = rec.event_log_entry.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            mat = event.step_materialization_data.materialization
            key = mat.asset_key.to_user_string()
            found[key] = PhaseResult(key, "materialized", {k: v.value for k, v in mat.metadata.items()})
        elif event.event_type == DagsterEventType.STEP_FAILURE and event.step_key:
            key = next((a for a in asset_order if a.replace("/", "__") == event.step_key), event.step_key)
            data = event.step_failure_data
            user = data.user_failure_data if data else None
            message = (user.description if user and user.description else
                       (step_error_line(data.error) if data and data.error else "failed"))
            meta = {k: v.value for k, v in (user.metadata.items() if user else [])}
            found[key] = PhaseResult(key, "failed", meta, message)
    return [found.get(a, PhaseResult(a, "skipped")) for a in asset_order]


def step_error_line(error: Any) -> str:
    """The one line that says why a step failed, from its STEP_FAILURE event's `error` (Dagster's
    SerializableErrorInfo): the first line of the user code's error - the first error down the
    `.cause` chain that is not Dagster's own - e.g. "engine_core.errors.SourceMismatch: run #3 reads
    company 6000003, but ...". Dagster wraps what an op raises in DagsterExecutionStepExecutionError
    ("Error occurred while executing op ...", dagster/_core/execution/plan/utils.py,
    `op_execution_error_boundary`), which says nothing of the cause; a fresh user saw only that, the
    engine's error being in DAGSTER_HOME/in-process-runs.log. The wrapper's own line when no cause
    is not Dagster's (a framework error)."""
    first, seen = error, 0
    while error is not None and seen < 20:  # a cause chain is short; bounded all the same
        if not (error.cls_name or "").startswith("Dagster") and not (error.message or "").startswith("dagster."):
            break
        error, seen = error.cause, seen + 1
    chosen = error if error is not None and seen < 20 else first
    lines = [ln.strip() for ln in (chosen.message or "").splitlines() if ln.strip()]
    return lines[0] if lines else (chosen.cls_name or "failed")


def run_failure_message(instance: DagsterInstance, run_id: str) -> str:
    """Why the run failed when no step did (e.g. a resource's EnvVar was not set at launch)."""
    from dagster import DagsterEventType

    records = instance.get_records_for_run(run_id, of_type={DagsterEventType.RUN_FAILURE,
                                                            DagsterEventType.ENGINE_EVENT}).records
    messages = [r.event_log_entry.user_message or "" for r in records]
    errors = [m for m in messages if "rror" in m]
    return (errors[-1] if errors else (messages[-1] if messages else "")).strip()[:2000]
