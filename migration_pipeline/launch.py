"""Launching a tenant through Dagster from the command line, on the instance the UI uses.

`migrate run` checks its inputs (settings, `--kinds` against the provider's plan, the source's
variables) before anything is launched, adds the tenant's partition, submits the tenant job through
the instance's run coordinator (`dagster job launch`: the run is queued and counts in the lane like
any other), makes sure a daemon is dequeuing (the UI's, or one started for the duration), and waits
for the run, saying why while it is queued and giving up after MIGRATE_QUEUE_TIMEOUT_SECONDS.

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
import hashlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

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


def check_launch(source: str, kinds: list[str] | None, options: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None) -> None:
    """What would fail a launch, checked first: `kinds` against the provider's plan, the source's
    variables (set, and accepted by the provider's own configuration). Raises ConfigError with a
    one-line message naming the option or the variable."""
    from engine_core.errors import ConfigError
    from engine_core.plan import plan_for
    from engine_core.providers.base import provider_for

    env = dict(os.environ if env is None else env)
    provider = provider_for(source)
    if kinds:
        try:
            plan_for(provider.phases(), kinds)
        except ConfigError as e:
            raise ConfigError(f"--kinds: {e}") from None
    for name in SOURCE_ENV.get(source, ()):
        if not env.get(name, "").strip():
            raise ConfigError(f"{name} is not set (needed to launch a {source} run); see the README's Configuration")
    config = getattr(provider, "config", None)
    if callable(config):
        config()  # the provider's own checks (URL scheme, token shape, numbers), nothing sent


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
    from urllib.parse import urlsplit

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
        return Liveness(False, "no daemon: none has ever run on this instance")
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

    def close(self, limit: float) -> None:
        """Stop our daemon once nothing of ours is in flight (waiting at most `limit` seconds)."""
        if self.proc is None:
            return
        try:
            deadline = time.monotonic() + limit
            said = False
            while self.proc.poll() is None and time.monotonic() < deadline:
                n = self.ours_in_flight()
                if not n:
                    break
                if not said:
                    self.echo(f"keeping the daemon until {n} other run(s) it serves finish (at most {limit:.0f} s)")
                    said = True
                time.sleep(2)
        finally:
            stack.stop(self.proc)
            self.proc = None
            self.lock.release()


@contextmanager
def daemon_for_duration(instance: DagsterInstance, env: dict[str, str], home: Path, log_path: Path,
                        echo: Callable[[str], None] = print, linger: float = 1800.0) -> Iterator[DaemonKeeper]:
    """A DaemonKeeper whose daemon (if it started one) is stopped on exit; see DaemonKeeper.close."""
    keeper = DaemonKeeper(instance, env, home, log_path, echo)
    try:
        yield keeper
    finally:
        keeper.close(linger)


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
        return f"queued behind {in_progress + ahead} runs in the lane ({in_progress} of {lane_width} slots busy, {ahead} queued ahead)"
    return f"queued; the lane has {lane_width - in_progress} of {lane_width} slots free, waiting for the daemon to dequeue it"


def submit_tenant_run(env: dict[str, str], tenant: str, run_config: dict, job: str = TENANT_JOB,
                      run_id: str | None = None) -> str:
    """Submit the tenant job for one partition through the instance's run coordinator; the run id.
    Raises LaunchError with Dagster's error lines when `dagster job launch` fails."""
    run_id = run_id or str(uuid.uuid4())
    argv = [stack.bin_path("dagster"), "job", "launch", "-m", stack.DEFS_MODULE, "-j", job,
            "--run-id", run_id, "--tags", json.dumps({tags.PARTITION: tenant}),
            "--config-json", json.dumps(run_config)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        lines = [ln.strip() for ln in (out.stderr + out.stdout).splitlines()]
        errors = [ln for ln in lines if ("rror" in ln or "not set" in ln) and not ln.startswith(("File ", "raise "))
                  and " = " not in ln
                  and "Warning" not in ln]
        reasons = list(dict.fromkeys(errors))[-4:] or [ln for ln in lines if ln][-5:]
        raise LaunchError("dagster job launch failed:\n" + "\n".join(reasons))
    return run_id


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


def wait_for_run(instance: DagsterInstance, run_id: str, *, poll: float = 2.0,
                 on_tick: Callable[[Any], None] | None = None, timeout: float | None = None,
                 keeper: DaemonKeeper | None = None, lane_width: int = 4, queue_timeout: float | None = None,
                 on_queued: Callable[[str], None] | None = None):
    """Until the Dagster run finishes; returns it.

    While it is queued: `keeper.ensure()` on every poll (a daemon is started when none is alive),
    `on_queued(why)` whenever the reason changes (and every 30 s), and after `queue_timeout`
    seconds in the queue the run is cancelled and LaunchError says why it waited. `timeout`
    bounds the whole wait (TimeoutError; the run is left as it is)."""
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
            raise TimeoutError(f"Dagster run {run_id} still {run.status.value if run else 'missing'} after {timeout:.0f} s (--timeout)")
        time.sleep(poll)


def wait_tenant_quiet(instance: DagsterInstance, tenant: str, timeout: float = 60.0) -> bool:
    """Until the tenant's helper runs (drainers) have finished too."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not instance.get_runs_count(RunsFilter(tags={tags.PARTITION: tenant}, statuses=IN_FLIGHT)):
            return True
        time.sleep(1)
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
                       (data.error.message.strip() if data and data.error else "failed"))
            meta = {k: v.value for k, v in (user.metadata.items() if user else [])}
            found[key] = PhaseResult(key, "failed", meta, message)
    return [found.get(a, PhaseResult(a, "skipped")) for a in asset_order]


def run_failure_message(instance: DagsterInstance, run_id: str) -> str:
    """Why the run failed when no step did (e.g. a resource's EnvVar was not set at launch)."""
    from dagster import DagsterEventType

    records = instance.get_records_for_run(run_id, of_type={DagsterEventType.RUN_FAILURE,
                                                            DagsterEventType.ENGINE_EVENT}).records
    messages = [r.event_log_entry.user_message or "" for r in records]
    errors = [m for m in messages if "rror" in m]
    return (errors[-1] if errors else (messages[-1] if messages else "")).strip()[:2000]
