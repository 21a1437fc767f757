"""Where the steps of a migration run execute: in the run's own process (one machine), or on the
worker hosts of a multi-host deployment through Dagster's celery executor (`dagster-celery`).

`MIGRATE_EXECUTOR` chooses: `in_process` (the default; `migrate ui`, `migrate run`, the tests) or
`celery`. With `celery`, the executor's config is the `execution: config:` block of
`MIGRATE_CELERY_CONFIG` (default `deploy/celery.yaml` in the clone), the same file every worker host
starts with (`dagster-celery worker start -A dagster_celery.app -y deploy/celery.yaml`), so the run's
orchestrator and the workers can never disagree about the broker or the acknowledgement policy.
The broker URL itself comes from `MIGRATE_CELERY_BROKER` (read by that file; a password stays in
the environment, not on disk in the repository).

Nothing about the lane changes with the executor: the lane limit is the run coordinator's (the
daemon counts runs carrying `dagster/partition` in the shared run storage), a tenant's fair share
is read from the same storage and the engine's tables (`fair_lane.lane_picture`), and every claim,
checkpoint, barrier and budget is a row in the shared engine database. See docs/deploy.md.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from dagster import ExecutorDefinition, in_process_executor

from engine_core.errors import ConfigError

EXECUTOR_ENV = "MIGRATE_EXECUTOR"
CELERY_CONFIG_ENV = "MIGRATE_CELERY_CONFIG"
BROKER_ENV = "MIGRATE_CELERY_BROKER"
EXECUTORS = ("in_process", "celery")
DEPLOY_DIR = Path(__file__).resolve().parents[1] / "deploy"
DEFAULT_CELERY_CONFIG = DEPLOY_DIR / "celery.yaml"


def celery_config(path: str | Path | None = None) -> dict[str, Any]:
    """The `execution: config:` block of the celery config file (dagster-celery's own file format:
    `dagster-celery worker start -y FILE` reads the same block). Raises ConfigError naming the file
    when it is missing or has no such block."""
    path = Path(path or os.environ.get(CELERY_CONFIG_ENV) or DEFAULT_CELERY_CONFIG)
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{CELERY_CONFIG_ENV}={path}: no such file") from None
    block = (loaded.get("execution") or {}).get("config") if isinstance(loaded, dict) else None
    if not isinstance(block, dict):
        raise ConfigError(f"{CELERY_CONFIG_ENV}={path}: no `execution: config:` block")
    return block


def executor_def(env: dict[str, str] | None = None) -> ExecutorDefinition:
    """The executor of the project's Definitions, by MIGRATE_EXECUTOR (`in_process` | `celery`).

    Raises ConfigError (one line, naming the variable) for another value, and when `celery` is
    asked for but dagster-celery is not installed (`pip install -e .[deploy]`)."""
    env = dict(os.environ if env is None else env)
    name = (env.get(EXECUTOR_ENV) or "in_process").strip()
    if name not in EXECUTORS:
        raise ConfigError(f"{EXECUTOR_ENV}={name!r}: expected one of {', '.join(EXECUTORS)}")
    if name == "in_process":
        return in_process_executor
    try:
        from dagster_celery import celery_executor
    except ImportError:
        raise ConfigError(f"{EXECUTOR_ENV}=celery needs dagster-celery: pip install -e '.[deploy]'") from None
    return celery_executor.configured(celery_config(env.get(CELERY_CONFIG_ENV)), name="celery")
