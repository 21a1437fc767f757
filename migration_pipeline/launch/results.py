"""What a launch reports once its Dagster run ended: each phase asset's status and materialisation
metadata, the step error that failed it, and a quiet tenant (no run of it still in flight)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterInstance, RunsFilter

from migration_pipeline import tags
from migration_pipeline.launch.statuses import IN_FLIGHT, POLL_SECONDS


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
    """One phase asset's outcome in a finished Dagster run: its key ("pipedrive/phase_1_users"),
    status (materialized | failed | skipped), its materialisation metadata and the step's message."""
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
    `op_execution_error_boundary`), which says nothing of the cause, the engine's error
    being in DAGSTER_HOME/in-process-runs.log. The wrapper's own line when no cause
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
