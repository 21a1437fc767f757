"""Launching a tenant through Dagster from the command line, on the instance the UI uses.

`migrate run` adds the tenant's partition, submits the tenant job through the instance's run
coordinator (`dagster job launch`: the run is queued and counts in the lane like any other), makes
sure a daemon is dequeuing (the UI's, or one started for the duration), and waits for the run.
"""
from __future__ import annotations

import json
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


class LaunchError(RuntimeError):
    """Dagster refused or failed to launch the run."""


def new_run_config(kinds: list[str] | None = None, dry_run: bool = False, options: dict[str, Any] | None = None) -> dict:
    config: dict[str, Any] = {"options_json": json.dumps(options or {})}
    if kinds:
        config["kinds"] = list(kinds)
    if dry_run:
        config["dry_run"] = True
    return {"resources": {"new_run": {"config": config}}}


def daemon_alive(instance: DagsterInstance) -> bool:
    statuses = instance.get_daemon_statuses(["QUEUED_RUN_COORDINATOR"])
    status = statuses.get("QUEUED_RUN_COORDINATOR")
    return bool(status and status.healthy)


@contextmanager
def daemon_running(instance: DagsterInstance, env: dict[str, str], log_path: Path,
                   echo: Callable[[str], None] = print, timeout: float = 90.0) -> Iterator[bool]:
    """The UI's daemon when one is alive, else one of our own for the duration. Yields started."""
    if daemon_alive(instance):
        yield False
        return
    echo(f"no Dagster daemon is running on this instance; starting one (log: {log_path})")
    proc = stack.daemon(env, log_path=log_path)
    try:
        deadline = time.monotonic() + timeout
        while not daemon_alive(instance):
            if proc.poll() is not None:
                raise LaunchError(f"dagster-daemon exited with {proc.returncode}; see {log_path}")
            if time.monotonic() > deadline:
                raise LaunchError(f"dagster-daemon did not report healthy in {timeout:.0f}s; see {log_path}")
            time.sleep(1)
        yield True
    finally:
        stack.stop(proc)


def submit_tenant_run(env: dict[str, str], tenant: str, run_config: dict, job: str = TENANT_JOB) -> str:
    """Submit the tenant job for one partition through the instance's run coordinator."""
    run_id = str(uuid.uuid4())
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


def add_tenant(instance: DagsterInstance, tenant: str) -> None:
    if not instance.has_dynamic_partition(TENANTS, tenant):
        instance.add_dynamic_partitions(TENANTS, [tenant])


def wait_for_run(instance: DagsterInstance, run_id: str, *, poll: float = 2.0,
                 on_tick: Callable[[Any], None] | None = None, timeout: float | None = None):
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        run = instance.get_run_by_id(run_id)
        if on_tick is not None and run is not None:
            on_tick(run)
        if run is not None and run.status in FINISHED:
            return run
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"Dagster run {run_id} still {run.status.value if run else 'missing'}")
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
