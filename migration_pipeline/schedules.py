"""The sync schedule: off by default; switched on in the UI (Automation -> `sync_tenants`).

Each tick requests the sync job for every tenant partition whose latest run of the source
succeeded (a tenant still migrating, stopped or failed is left to its own launch: a sync from it
would fail with "nothing to sync" or join the live run), one run per tenant and tick (`run_key`),
so a tick evaluated twice launches nothing twice. The runs carry `dagster/partition` and count in
the lane like every tenant run.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import os

from dagster import DefaultScheduleStatus, RunRequest, ScheduleDefinition, ScheduleEvaluationContext, SkipReason, schedule

from engine_core import runs_reads
from migration_pipeline.partitions import TENANTS
from migration_pipeline.resources import MigrationDatabase

SYNC_SCHEDULE = "sync_tenants"
SYNC_CRON_ENV = "MIGRATE_SYNC_CRON"
DEFAULT_SYNC_CRON = "0 * * * *"  # hourly; MIGRATE_SYNC_CRON changes it


def syncable_tenants(db, source: str, tenants: list[str]) -> list[str]:
    """Of `tenants`, those whose latest (non-dry) run of `source` succeeded, in the given order."""
    if not tenants:
        return []
    latest = runs_reads.latest_statuses(db, source, tenants)
    ok = {t for t, status in latest.items() if status == "succeeded"}
    return [t for t in tenants if t in ok]


def sync_schedule(job, source: str) -> ScheduleDefinition:
    """The schedule over the sync job `job` (stopped until a user switches it on)."""

    @schedule(
        name=SYNC_SCHEDULE,
        job=job,
        cron_schedule=os.environ.get(SYNC_CRON_ENV, "").strip() or DEFAULT_SYNC_CRON,
        default_status=DefaultScheduleStatus.STOPPED,
        description=(f"Sync every {source} tenant whose latest run succeeded (off by default; switch it "
                     f"on to keep tenants current until cutover; {SYNC_CRON_ENV} sets the cron)."),
    )
    def sync_tenants(context: ScheduleEvaluationContext, database: MigrationDatabase):
        tenants = syncable_tenants(database.database(), source, list(context.instance.get_dynamic_partitions(TENANTS)))
        if not tenants:
            return SkipReason(f"no tenant has a succeeded {source} run to sync from")
        stamp = context.scheduled_execution_time.isoformat()
        return [RunRequest(run_key=f"sync:{t}:{stamp}", partition_key=t) for t in tenants]

    return sync_tenants
