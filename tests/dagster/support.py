"""Helpers for the Dagster face's tests: resources on a test database, materialising a tenant."""
from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from dagster import DagsterEventType, DagsterInstance, instance_for_test, materialize

from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource

SMALL = {"page_size": 20, "counts": {"companies": 45, "contacts": 70, "deals": 50, "activities": 40, "notes": 30}}


# Where test instances keep their SQLite storage: a tmpfs when the machine has one (see tmpfs_instance).
SHM = "/dev/shm"


@contextmanager
def tmpfs_instance(**options: Any) -> Iterator[DagsterInstance]:
    """Dagster's `instance_for_test(**options)` (SQLite run and event log storage in a temporary
    directory, DAGSTER_HOME set to it for the block), with that directory on /dev/shm when it is a
    writable directory, else where `tempfile` puts it.

    SQLite syncs every commit to disk, and a materialisation stores each of its ~100 events in a
    commit of its own: on the suite's loaded disk a SMALL tenant's materialisation took 11.0 s from
    /tmp and 6.3 s from /dev/shm (CPU 3.1 s and 2.4 s), most of it `store_event` waiting for the
    sync. Only the tests' own instances use SQLite (the product's storage is Postgres); what they
    store and read is the same on either."""
    where = SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK) else None
    with tempfile.TemporaryDirectory(prefix="dagster-test-", dir=where, ignore_cleanup_errors=True) as home, \
            instance_for_test(temp_dir=home, **options) as instance:
        yield instance


def resources(db_url: str, source: str = "example", options: dict[str, Any] | None = None, **lane: Any) -> dict[str, Any]:
    return {
        "database": MigrationDatabase(url=to_url(db_url), max_size=8),
        "source": SourceResource(source=source),
        "lane": LaneSettings(heartbeat_seconds=0.0, **lane),
        "new_run": NewRunOptions(options_json=json.dumps(options or {})),
    }


def materialize_tenant(instance: DagsterInstance, tenant: str, res: dict[str, Any], source: str = "example",
                       selection: list[str] | None = None, raise_on_error: bool = False):
    if tenant not in instance.get_dynamic_partitions("tenants"):
        instance.add_dynamic_partitions("tenants", [tenant])
    assets = build_phase_assets(source)  # with their ledger checks
    return materialize(assets, partition_key=tenant, instance=instance, resources=res,
                       selection=selection, raise_on_error=raise_on_error)


def migrate_env(db_url: str, home: str, base_url: str, **extra: str) -> dict[str, str]:
    """The environment of a `migrate` subprocess on a test database and a sandbox account: this
    process's environment without its MIGRATE_*, PIPEDRIVE_*, DAGSTER_* and DATABASE_URL, then the
    engine and Dagster's storage on `db_url`, MIGRATE_HOME `home`, the sandbox at `base_url`
    (token "tok"), no drainer or reaper ticks, and `extra`."""
    import os

    from migration_pipeline.instance import STORAGE_URL_ENV

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=home, MIGRATE_SOURCE="pipedrive",
               PIPEDRIVE_BASE_URL=base_url, PIPEDRIVE_API_TOKEN="tok",
               MIGRATE_LANE_INTERVAL_SECONDS="3600", MIGRATE_REAPER_INTERVAL_SECONDS="3600",
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")}, **extra)
    return env


def example_env(db_url: str, tmp_path: Any) -> dict[str, str]:
    """The environment of `migrate` and Dagster processes on a test database with the `example`
    source: this process's environment without its MIGRATE_*, DAGSTER_* and DATABASE_URL, then the
    engine and Dagster's storage on `db_url`, MIGRATE_HOME under `tmp_path`, no drainer or reaper
    ticks, and DAGSTER_HOME `tmp_path / "dagster"` with the project's instance file."""
    import os

    from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env

    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIGRATE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="example",
               MIGRATE_LANE_INTERVAL_SECONDS="3600", MIGRATE_REAPER_INTERVAL_SECONDS="3600",
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    return dagster_env(tmp_path / "dagster", env)


def example_instance(db_url: str, tmp_path: Any, monkeypatch: Any) -> tuple[DagsterInstance, dict[str, str]]:
    """A Dagster instance on `example_env`'s environment, with this process's DAGSTER_HOME,
    MIGRATE_DAGSTER_STORAGE_URL and MIGRATE_SOURCE unset for the test (the caller disposes it)."""
    from migration_pipeline.instance import EVENT_BATCH_ENV, STORAGE_URL_ENV, open_instance

    for key in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE"):
        monkeypatch.delenv(key, raising=False)
    env = example_env(db_url, tmp_path)
    monkeypatch.setenv(EVENT_BATCH_ENV, env[EVENT_BATCH_ENV])  # what open_instance exports, undone after the test
    return open_instance(env), env


@contextmanager
def sandbox_account(**options: Any) -> Iterator[str]:
    """A sandbox server of its own (seed 1, token "tok", `options` as `SandboxConfig.from_options`
    takes them: scale, latency, ...) for the block; yields its base URL."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    proc, base_url = start_subprocess(SandboxConfig.from_options(seed=1, token="tok", **options))
    try:
        yield base_url
    finally:
        proc.terminate()
        proc.wait(10)


def instance_of(env: dict[str, str]) -> DagsterInstance:
    """The Dagster instance a `migrate` subprocess with `env` uses (this process's
    MIGRATE_DAGSTER_STORAGE_URL set to it; the caller disposes it)."""
    import os

    from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env

    full = dagster_env(env=env)
    os.environ[STORAGE_URL_ENV] = full[STORAGE_URL_ENV]
    return DagsterInstance.from_config(full["DAGSTER_HOME"])


def planned_rows(instance: DagsterInstance, run_id: str) -> dict[str, list]:
    """What a run's planned events left in the event log storage, without ids and timestamps."""
    from dagster import deserialize_value

    with instance.event_log_storage._engine.connect() as conn:
        events = conn.exec_driver_sql(
            "SELECT dagster_event_type, step_key, asset_key, partition, event FROM event_logs "
            "WHERE run_id = %(r)s AND dagster_event_type LIKE '%%PLANNED' ORDER BY id", {"r": run_id}).fetchall()
        checks = conn.exec_driver_sql(
            "SELECT asset_key, check_name, partition, execution_status, evaluation_event_storage_id IS NOT NULL "
            "FROM asset_check_executions WHERE run_id = %(r)s ORDER BY asset_key, check_name", {"r": run_id}).fetchall()
        keys = conn.exec_driver_sql("SELECT asset_key FROM asset_keys WHERE last_run_id = %(r)s ORDER BY 1",
                                    {"r": run_id}).fetchall()
    payload = [deserialize_value(e[4]).dagster_event for e in events]
    return {"events": [tuple(e[:4]) + (p.event_specific_data,) for e, p in zip(events, payload)],
            "checks": [tuple(c) for c in checks], "asset_keys": [tuple(k) for k in keys]}


def side_by_side(scenarios: dict[str, Callable[[], Any]], timeout: float, where: str = "") -> None:
    """Run each scenario on a thread of its own, at once (the suite pays for the slowest, not their
    sum), and raise one AssertionError naming every scenario that failed, chained from the first
    failure, after printing each failure's traceback; `where` is appended (e.g. "; see <log>")."""
    errors: dict[str, BaseException] = {}
    with ThreadPoolExecutor(len(scenarios)) as pool:
        futures = {name: pool.submit(f) for name, f in scenarios.items()}
        for name, fut in futures.items():
            try:
                fut.result(timeout=timeout)
            except BaseException as e:  # noqa: BLE001 - reported below with the scenario's name
                errors[name] = e
    for e in errors.values():
        traceback.print_exception(e)
    if errors:
        raise AssertionError(f"failed: {', '.join(errors)}{where}: {errors}") from next(iter(errors.values()))


def step_succeeded(record: Any, step_key: str) -> bool:
    """Whether a log record of a Dagster run logger is `step_key`'s STEP_SUCCESS (where Dagster
    holds interrupts: the held-terminate tests act there)."""
    event = (getattr(record, "dagster_meta", None) or {}).get("dagster_event")
    return event is not None and event.event_type == DagsterEventType.STEP_SUCCESS and event.step_key == step_key


@contextmanager
def source_failing(metrics: Any) -> Iterator[None]:
    """While the block runs, `metrics` (an engine_core.progress.SourceMetrics) hears what the client
    records while the source is down: every request failed and retried (HTTP 500), every 50 ms."""
    done = threading.Event()

    def answers_500() -> None:
        while not done.is_set():
            metrics.request(ok=False)
            metrics.retrying("HTTP 500", 0.5)
            time.sleep(0.05)

    feeder = threading.Thread(target=answers_500, name="source-failing")
    feeder.start()
    try:
        yield
    finally:
        done.set()
        feeder.join()
