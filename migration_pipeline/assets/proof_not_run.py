"""What a phase's `matches_source` check records in a run that materialises assets and does not run it.

The proof from the source spends source tokens, so it runs only on its own (the `verify_tenant` job,
`migrate verify`). The tenant and sync jobs leave it out of their selection, but Dagster puts it in
every run of the implicit asset job: the asset graph's "Materialize" (its dialog and its launchpad,
which includes separately executable checks by default), and asset backfills, take each check whose
job names include `__ASSET_JOB` (dagster-webserver `getAssetCheckHandleInputs`), and every check is
in that job. A check a run planned and never evaluated is resolved SKIPPED by Dagster 1.13, so each
phase showed `matches_source` Skipped beside its four passed ledger checks, as if the proof had been
tried and given up.

Such a run records instead one evaluation per phase that says so (`not_run_here`): not passed,
severity WARN (the materialisation it targets is not proven from the source; a pass would claim a
proof nobody made), metadata `not_run` first, naming the ways to run it on the tenant, and
`latest_proof`, the tenant's latest real evaluation of the check (when, which run, passed or not).
Its requests and tokens are 0: nothing was asked of the source.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from dagster import AssetCheckKey, AssetCheckResult, AssetCheckSeverity, MetadataValue
from dagster._core.event_api import PartitionKeyFilter

NOT_RUN = "not run by this run"  # the first words of a not-run evaluation's `not_run`
HISTORY = 50  # how many of the check's latest executions `latest_proof` looks through


def how_to_prove(tenant: str) -> str:
    """The ways to run the proof on `tenant`, as one phrase."""
    return (f"launch the verify_tenant job on partition {tenant!r} (its launchpad), or run "
            f"`migrate verify {tenant}`")


def not_run_note(tenant: str, run_id: str) -> str:
    """The `not_run` line of a not-run evaluation in Dagster run `run_id` on `tenant`."""
    return (f"{NOT_RUN} (Dagster run {run_id[:8]}, which materialises the phase): the proof from the source "
            f"spends source tokens, so it runs only on its own - {how_to_prove(tenant)}. The phase's "
            "materialisation is not proven from the source until then.")


def is_not_run(metadata: Any) -> bool:
    """Whether an evaluation's metadata is a not-run evaluation's (`not_run_note`)."""
    entry = (metadata or {}).get("not_run")
    return str(getattr(entry, "value", entry) or "").startswith(NOT_RUN)


def latest_proof(instance: Any, key: AssetCheckKey, tenant: str) -> str:
    """The tenant's latest real evaluation of the check `key` (not a not-run one) as one line:
    "passed|failed, Dagster run 1a2b3c4d at 2026-12-07 19:20:01 UTC"; "none yet" when there is
    none among its HISTORY latest executions; "unknown" when the history cannot be read."""
    try:
        records = instance.event_log_storage.get_asset_check_execution_history(
            key, limit=HISTORY, partition_filter=PartitionKeyFilter(key=tenant))
    except Exception:  # noqa: BLE001 - the evaluation says what it can
        return "unknown"
    for rec in records:
        event = rec.event.dagster_event if rec.event is not None else None
        data = getattr(event, "event_specific_data", None)
        if data is None or not hasattr(data, "passed") or is_not_run(data.metadata):
            continue  # planned only, or another run that did not prove
        at = datetime.fromtimestamp(rec.event.timestamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"{'passed' if data.passed else 'failed'}, Dagster run {rec.run_id[:8]} at {at}"
    return "none yet: the tenant was never proven from the source"


def not_run_here(instance: Any, key: AssetCheckKey, tenant: str, run_id: str) -> AssetCheckResult:
    """The evaluation of `matches_source` (`key`) in a materialising Dagster run `run_id` on `tenant`
    that did not run it (see the module docstring): not passed, severity WARN, what to do instead."""
    return AssetCheckResult(
        asset_key=key.asset_key, check_name=key.name, passed=False, severity=AssetCheckSeverity.WARN,
        metadata={
            "not_run": MetadataValue.text(not_run_note(tenant, run_id)),
            "latest_proof": MetadataValue.text(latest_proof(instance, key, tenant)),
            "requests": MetadataValue.int(0),
            "tokens": MetadataValue.int(0),
        })
