"""Engine settings from the environment, validated at start-up with the variable's name in the error."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engine_core.errors import ConfigError

WINDOW = 25  # rows per transaction: 2 savepoints per row under Postgres's 64 cached subxids


def _int(env: dict[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def _float(env: dict[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {raw!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    """The engine's knobs, read once per process (`from_env`): lane width, stale-lock threshold and
    heartbeat (seconds), database-pressure threshold (active queries; 0: off), attempts and
    retry backoff, the run log's cap; and, set by a launch, the last phase it executes. Frozen: a
    worker reads one consistent set."""
    lane_width: int = 4
    # A live task's lock keeper renews its lock every third of this, so a lock older than
    # this belongs to a dead process (kill -9, a lost host). The seeds' 30 min predates the keeper
    # and leaves a tenant stuck half an hour after a kill -9; 2 min frees it with the keeper
    # renewing every 40 s (the chaos and cross-host tests run with 5-6 s).
    stale_lock_seconds: float = 120.0
    heartbeat_seconds: float = 5.0
    pressure_threshold: int = 0  # active queries above which workers defer; 0 = off
    max_attempts: int = 8
    retry_backoff_seconds: float = 2.0
    log_cap: int = 200
    # The last phase (0-based) of the run that the launch driving these workers executes (a Dagster
    # run whose selection ends earlier), or None: every phase. Nothing is asked of the source ahead
    # for a later phase - no task of it runs in this launch, and its answer would be wasted.
    launch_last_phase: int | None = None

    @property
    def max_inflight(self) -> int:
        # 2x the lane width: the per-run fairness bound
        """Tasks a run may have enqueued or running at once: twice the lane width, the per-run
        fairness bound."""
        return 2 * self.lane_width

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Settings from `env` (default: the process environment), each MIGRATE_* value checked
        against its minimum; raises ConfigError naming the variable for a value that is
        not a number or is too small."""
        env = dict(os.environ if env is None else env)
        return cls(
            lane_width=_int(env, "MIGRATE_LANE_WIDTH", 4, minimum=1),
            stale_lock_seconds=_float(env, "MIGRATE_STALE_LOCK_SECONDS", 120.0, minimum=1.0),  # 0 reaps live tasks
            heartbeat_seconds=_float(env, "MIGRATE_HEARTBEAT_SECONDS", 5.0, minimum=0.0),
            pressure_threshold=_int(env, "MIGRATE_PRESSURE_THRESHOLD", 0, minimum=0),
            max_attempts=_int(env, "MIGRATE_MAX_ATTEMPTS", 8, minimum=1),
            retry_backoff_seconds=_float(env, "MIGRATE_RETRY_BACKOFF_SECONDS", 2.0, minimum=0.0),
        )


# MIGRATE_* numbers read outside Settings (by the Dagster face), with their defaults and minimums:
# checked together with Settings by `check_environment`, so every command fails at start-up on a bad
# one rather than in a sensor tick or a run.
FACE_NUMBERS: dict[str, tuple[type, float, float]] = {
    "MIGRATE_REAPER_INTERVAL_SECONDS": (int, 300, 1),
    "MIGRATE_LANE_INTERVAL_SECONDS": (int, 15, 1),
    "MIGRATE_QUEUE_TIMEOUT_SECONDS": (float, 1800.0, 0.0),
    # lane threads of a launch's phase op (migration_pipeline.lane.threads.launch_threads): checked
    # at the launch, else a bad value fails the launched run with its reason only in the daemon's log
    "MIGRATE_LAUNCH_THREADS": (int, 0, 1),  # 0 (unset): the lane width, capped by the fair share
    # migration_pipeline.preload: a launcher server's idle lifetime
    "MIGRATE_PRELOAD_IDLE_SECONDS": (float, 900.0, 1.0),
    # engine_core.progress.source_down_seconds: read by a phase op or drainer mid-run, where a bad
    # value failed the run after it had started (0: never pause)
    "MIGRATE_SOURCE_DOWN_SECONDS": (float, 180.0, 0.0),
}


def number(name: str, env: dict[str, str] | None = None) -> float:
    """One of FACE_NUMBERS from the environment (its default when unset). Raises ConfigError
    naming the variable when the value is not a number of the right kind or below its minimum."""
    env = dict(os.environ if env is None else env)
    kind, default, minimum = FACE_NUMBERS[name]
    if kind is int:
        return _int(env, name, int(default), minimum=int(minimum))
    return _float(env, name, float(default), minimum=float(minimum))


# The Dagster face's on/off switches, checked by `check_environment` with the numbers: name ->
# (default, what it switches on).
FACE_SWITCHES: dict[str, tuple[bool, str]] = {
    # migration_pipeline.launch.in_process.run_in_process
    "MIGRATE_RUN_IN_PROCESS": (True, "execute `migrate run`'s Dagster run in its own process when no daemon "
                                     "serves the instance"),
    # migration_pipeline.preload.enabled: unset means on only for a command typed at a terminal (the
    # default below is never read for its value: the variable is checked here, decided there)
    "MIGRATE_PRELOAD": (False, "hand `migrate run`/`sync` to the pre-loaded launcher"),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(name: str, env: dict[str, str] | None = None) -> bool:
    """One of FACE_SWITCHES from the environment (its default when unset or empty): 1/true/yes/on
    or 0/false/no/off, any case. Raises ConfigError naming the variable (one line) otherwise."""
    env = dict(os.environ if env is None else env)
    default, what = FACE_SWITCHES[name]
    raw = env.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name} must be 1, true, yes or on ({what}) or 0, false, no or off, got {raw!r}")


DAILY_TOKEN_SHARE = "MIGRATE_DAILY_TOKEN_SHARE"
DEFAULT_DAILY_TOKEN_SHARE = 0.8  # the rest of the day's tokens stays with the customer's other integrations


def daily_token_share(env: dict[str, str] | None = None) -> float:
    """MIGRATE_DAILY_TOKEN_SHARE: the share of the source's daily token budget the engine may spend,
    a number in (0, 1] (default 0.8: a fifth of the day stays for the customer's other
    integrations; Pipedrive's daily budget is per company and shared by all of them). The budget
    (engine_core.budget) never lets the source's remaining tokens fall below (1 - share) * limit.
    Raises ConfigError naming the variable when the value is not a number in (0, 1]."""
    env = dict(os.environ if env is None else env)
    raw = env.get(DAILY_TOKEN_SHARE)
    value = _float(env, DAILY_TOKEN_SHARE, DEFAULT_DAILY_TOKEN_SHARE)
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{DAILY_TOKEN_SHARE} must be a share in (0, 1] (e.g. 0.8), got {raw!r}")
    return value


def check_environment(env: dict[str, str] | None = None) -> Settings:
    """Every MIGRATE_* number (Settings, FACE_NUMBERS, MIGRATE_DAILY_TOKEN_SHARE) and switch (FACE_SWITCHES) checked; returns
    the engine's Settings. Raises ConfigError naming the first bad variable and its value."""
    env = dict(os.environ if env is None else env)
    settings = Settings.from_env(env)
    for name in FACE_NUMBERS:
        number(name, env)
    for name in FACE_SWITCHES:
        switch(name, env)
    daily_token_share(env)
    return settings


def migrate_home(env: dict[str, str] | None = None) -> Path:
    """The directory of the project's local state (MIGRATE_HOME, default ./.migrate), absolute."""
    env = dict(os.environ if env is None else env)
    return Path(env.get("MIGRATE_HOME") or "./.migrate").expanduser().resolve()


def shown_url(url: str) -> str:
    """`url` as a message may show it: scheme, host, port and path, with no user:password, query
    or fragment ("http://u:p@127.0.0.1:8811/x?api_token=t#f" -> "http://127.0.0.1:8811/x"; the port
    is kept). A value that is not an http(s) URL keeps only what follows any
    credentials in it. At most 120 characters (80 for a value that is no URL). A token put in a
    base URL's query (`...?api_token=...`) never reaches a message through it (the brief: secrets
    never reach logs or exceptions)."""
    parts = urlsplit(url.strip())
    if parts.scheme in ("http", "https") and parts.netloc:
        return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"[:120]
    return url.strip().rsplit("@", 1)[-1][:80]
