"""Jobs: a tenant's whole migration (every phase asset), and the drainer that widens its lane.

The drainer is an op job partitioned by tenant, so its runs carry `dagster/partition` like every
other tenant run and count in the same run-level limit (dagster.yaml). It attaches to the tenant's
live engine run and drains it for one turn; it never starts, retries or resumes a run.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

from dagster import (
    AssetSelection,
    Failure,
    JobDefinition,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    define_asset_job,
    job,
    op,
)

from engine_core import runs
from engine_core.errors import RunNotFound
from migration_pipeline import tags
from migration_pipeline.fair_lane import lane_picture
from migration_pipeline.lane import drain_in_slot
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, SourceResource

TENANT_JOB = "migrate_tenant"
DRAINER_JOB = "drain_tenant"


def tenant_job(source: str):
    """Every phase asset (and its checks) of `source` for one tenant partition."""
    return define_asset_job(
        TENANT_JOB,
        selection=AssetSelection.groups(f"{source}_migration"),
        description=f"Migrate one tenant from {source}: every phase, in plan order.",
        tags={tags.SOURCE: source},
    )


@op(description="Drain the tenant's live engine run for one turn (one lane slot).", out=Out(Nothing))
def drain_tenant_run(
    context: OpExecutionContext, database: MigrationDatabase, source: SourceResource, lane: LaneSettings
):
    db = database.database()
    tenant = context.partition_key
    engine_run_id = context.run.tags.get(tags.ENGINE_RUN)
    try:
        run = runs.get_run(db, int(engine_run_id)) if engine_run_id and engine_run_id.isdigit() else None
    except RunNotFound:
        run = None
    if run is None or run.tenant_id != tenant:
        run = runs.live_run(db, tenant, source.source)
    if run is None or run.status != "running" or run.cancel_requested:
        context.log.info(f"tenant {tenant!r} has no running migration; nothing to drain")
        return Output(None, metadata={"executed": 0, "reason": "no running migration"})
    settings = lane.engine_settings()

    def give_way() -> bool:
        # a tenant waiting in the run queue while this one holds more than its fair share gets our slot
        picture = lane_picture(context.instance, db, settings)
        if picture.should_give_way(tenant, context.run_id):
            context.log.info(f"giving the lane slot to {', '.join(picture.waiting(other_than=tenant))}: "
                             f"{tenant} holds {len(picture.tenants[tenant].in_progress)} of its share "
                             f"{picture.share(tenant)}")
            return True
        return False

    result = drain_in_slot(
        db,
        run.id,
        settings=settings,
        providers=source.providers(),
        turn_seconds=lane.drainer_turn_seconds,
        give_way=give_way,
        stop_grace_seconds=lane.stop_grace_seconds,
        logger=context.log,
    )
    executed = sum(result.executed.values())
    context.log.info(f"drained {executed} task(s) of {run.name}: {dict(result.executed)}; ended: {result.reason}")
    if result.executed.get("failed") and executed == result.executed.get("failed"):
        # tasks failing is the engine's business (the phase asset reports it); note it here too
        context.log.warning(f"{result.executed['failed']} task(s) failed in this turn")
    if result.reason == "missing":
        raise Failure(f"engine run {run.id} disappeared")
    return Output(None, metadata={
        "engine_run_id": run.id,
        "executed": executed,
        "outcomes": dict(result.executed),
        "reason": result.reason,
    })


def drainer_job() -> JobDefinition:
    @job(
        name=DRAINER_JOB,
        partitions_def=tenants,
        description="A helper lane slot for a tenant's run, requested by the reaper/lane sensors.",
        tags={tags.ROLE: tags.DRAINER},
    )
    def drain_tenant():
        drain_tenant_run()

    return drain_tenant
