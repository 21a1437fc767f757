"""Jobs: a tenant's whole migration (every phase asset), the drainer that widens its lane, and
`explain_row`, which tells one source row's story from the UI.

The drainer is an op job partitioned by tenant, so its runs carry `dagster/partition` like every
other tenant run and count in the same run-level limit (dagster.yaml). It joins the tenant's live
engine run (`engine_core.runs.attach` with `may_start=False`) and drains it for one turn; it never
starts, retries or resumes a run. A stop of the engine run during its turn ends it CANCELED (as a
terminate does). When its turn closed phases - a run the drainers finished after a CLI retry - it
materialises those phase assets of the tenant's partition with their rollup (the
partition's last phase stayed red), unless the phase is already materialised since it closed.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import os
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckSeverity,
    AssetMaterialization,
    AssetRecordsFilter,
    AssetSelection,
    Config,
    Failure,
    MetadataValue,
    JobDefinition,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    RunsFilter,
    define_asset_job,
    job,
    op,
    resource,
)

from dagster._core.storage.dagster_run import IN_PROGRESS_RUN_STATUSES as IN_PROGRESS
from pydantic import Field

from engine_core import rollup as rollups
from engine_core import runs, runs_reads
from engine_core.db import Database
from engine_core.errors import RunNotFound
from engine_core.ledger_reads import explain_unreadable, ledger_kinds, row_entries
from engine_core.models import Run
from engine_core.plan import kinds_left_out, left_out_line
from engine_core.providers.registry import provider_for
from engine_core.progress import source_down_seconds, source_metrics
from migration_pipeline import tags
from migration_pipeline.assets.checks import MATCHES_SOURCE, proof_specs, source_check
from migration_pipeline.assets.metadata import busy_windows, not_planned_metadata, phase_metadata, phase_summary
from migration_pipeline.assets.cancel import cancel_this_run
from migration_pipeline.assets.specs import asset_number, phase_specs
from migration_pipeline.lane.fair import lane_picture
from migration_pipeline.lane.slot import drain_in_slot
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, SourceResource

TENANT_JOB = "migrate_tenant"
SYNC_JOB = "sync_tenant"
VERIFY_JOB = "verify_tenant"
DRAINER_JOB = "drain_tenant"
EXPLAIN_JOB = "explain_row"


def phase_selection(source: str, without=()) -> AssetSelection:
    """The phase assets of `source` with their checks, less the checks in `without` (the
    `matches_source` checks, which spend source tokens and run on their own from the UI)."""
    selection = AssetSelection.groups(f"{source}_migration")
    if without:
        selection = selection - AssetSelection.checks(*without)
    return selection


def tenant_job(source: str, without_checks=()):
    """Every phase asset (and its checks, less `without_checks`) of `source` for one tenant partition."""
    return define_asset_job(
        TENANT_JOB,
        selection=phase_selection(source, without_checks),
        description=f"Migrate one tenant from {source}: every phase, in plan order.",
        tags={tags.SOURCE: source},
    )


def sync_job(source: str, without_checks=()):
    """The re-sync: the same phase assets and steps, launched on a tenant's partition;
    the run tag `migration/mode=sync` makes the first phase op start an engine sync
    (`engine_core.runs.start_sync`: changes since the last succeeded run or sync, same phases,
    claims, windows, budget, stop/retry/resume) instead of a full run. A tenant with no succeeded
    run fails its first step with one line saying so."""
    return define_asset_job(
        SYNC_JOB,
        selection=phase_selection(source, without_checks),
        description=(f"Sync one tenant from {source}: bring what changed at the source since its last "
                     "succeeded run or sync (same phases; only changed rows are listed, mail only for "
                     "deals whose mail changed)."),
        tags={tags.SOURCE: source, tags.MODE: tags.SYNC},
    )


@op(name="verify", out=Out(Nothing),
    description="Prove the tenant's phases against the source (engine_core.verify): one matches_source "
                "evaluation per phase asset, with the requests and tokens it spent.")
def verify_tenant_op(context: OpExecutionContext, database: MigrationDatabase, source: SourceResource,
                     lane: LaneSettings):
    """Evaluate `matches_source` for every phase of the tenant partition (`source_check`); one
    AssetCheckEvaluation a phase, then an output with the phases that differ and the tokens spent."""
    db, tenant = database.database(), context.partition_key
    provider, settings = source.provider(), lane.engine_settings()
    failed, tokens = [], 0
    for spec in proof_specs(source.source):
        passed, md = source_check(db, provider, tenant, spec, settings)
        tokens += int(getattr(md.get("tokens"), "value", 0) or 0)
        context.log_event(AssetCheckEvaluation(asset_key=spec.key, check_name=MATCHES_SOURCE, passed=passed,
                                               metadata=md, partition=tenant, severity=AssetCheckSeverity.ERROR))
        if not passed:
            failed.append(spec.name)
    context.log.info(f"{tenant}: {len(failed)} phase(s) differ from the source" + (f": {', '.join(failed)}" if failed else "")
                     + f"; {tokens} tokens spent")
    yield Output(None, metadata={"phases_differing": len(failed), "tokens": tokens})


def verify_job() -> JobDefinition:
    """The proof from the source on its own, launched on a tenant partition from the
    launchpad: every phase's `matches_source` evaluated (`engine_core.verify`), nothing
    materialised. An op job, because Dagster cannot infer a partitioned run for a selection of
    asset checks alone; its evaluations land on each phase asset's `matches_source` check."""

    @job(name=VERIFY_JOB, partitions_def=tenants, tags={tags.ROLE: "verify"},
         description="Prove one tenant against its source: each phase's kinds listed at the source (cheapest "
                     "listing) against the ledger and the product's rows; spends source tokens.")
    def verify_tenant():
        verify_tenant_op()

    return verify_tenant


@op(description="Drain the tenant's live engine run for one turn (one lane slot).", out=Out(Nothing))
def drain_tenant_run(
    context: OpExecutionContext, database: MigrationDatabase, source: SourceResource, lane: LaneSettings
):
    """A drainer's turn: drain the tenant's live engine run in one lane slot until its turn ends, it
    gives way to a tenant waiting for the lane, or the run has nothing to claim; then record the
    materialisations of the phases that closed meanwhile."""
    db = database.database()
    tenant = context.partition_key
    engine_run_id = context.run.tags.get(tags.ENGINE_RUN, "")
    try:
        run = runs.attach(db, source.provider(), tenant, may_start=False,
                          tagged_run_id=int(engine_run_id) if engine_run_id.isdigit() else None).run
    except RunNotFound:
        run = None
    if run is None or run.status != "running" or run.cancel_requested:
        context.log.info(f"tenant {tenant!r} has no running migration; nothing to drain")
        if run is not None:
            yield from closed_phase_materializations(context, db, run, source.source)
        yield Output(None, metadata={"executed": 0, "reason": "no running migration"})
        return
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

    started, down_after, paused = time.monotonic(), source_down_seconds(), []

    def watch_source() -> None:
        # a source that fails every request for minutes pauses the run (as the phase op does)
        down = None if paused else source_metrics.down_since(started, down_after)
        if down:
            paused.append(down)
            context.log.error(f"pausing {run.name}: {down}")
            runs.pause(db, run.id, down)

    result = drain_in_slot(
        db,
        run.id,
        settings=settings,
        providers=source.providers(),
        turn_seconds=lane.drainer_turn_seconds,
        give_way=give_way,
        stop_grace_seconds=lane.stop_grace_seconds,
        logger=context.log,
        on_tick=watch_source,
    )
    executed = sum(result.executed.values())
    context.log.info(f"drained {executed} task(s) of {run.name}: {dict(result.executed)}; ended: {result.reason}")
    if result.reason == "missing":
        raise Failure(f"engine run {run.id} disappeared")
    after = runs.get_run(db, run.id)
    yield from closed_phase_materializations(context, db, after, source.source)
    if after.status in ("stopping", "stopped"):  # by this turn's pause (its reason) or from elsewhere
        cancel_this_run(context, f"{after.name} was paused during this drainer's turn: {paused[0]}; a launch "
                                 "resumes it once the source answers" if paused else
                                 f"{after.name} was stopped during this drainer's turn")
    if after.status == "failed":
        # the failed phase is the phase asset's to report; the drainer stops working on the run
        context.log.warning(f"{after.name} failed at phase {asset_number(after, after.current_phase)}; no drainer "
                            "works on it")
    yield Output(None, metadata={
        "engine_run_id": run.id,
        "executed": executed,
        "outcomes": dict(result.executed),
        "reason": result.reason,
        "engine_run_status_after_turn": after.status,
    })


def _materialized_since(instance: Any, key, tenant: str, run_id: int, closed_at: datetime | None) -> bool:
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, asset_partitions=[tenant]), limit=1).records
    if not records:
        return False
    entry = records[0].event_log_entry
    md = entry.asset_materialization.metadata if entry.asset_materialization else {}
    same_run = getattr(md.get("engine_run_id"), "value", None) == run_id
    return same_run and (closed_at is None or entry.timestamp >= closed_at.timestamp())


def closed_phase_materializations(context: OpExecutionContext, db: Database, run: Run, source: str):
    """`phases_to_materialize` for a drainer run's op (`context`), each said in its log."""
    for phase, spec, mat in phases_to_materialize(context.instance, db, run, source, f"drainer run {context.run_id}",
                                                  own_run_id=context.run_id):
        what = "closed" if phase is not None else "is not in its plan"
        context.log.info(f"phase {spec.index + 1} ({', '.join(spec.kinds)}) of {run.name} {what}: materialising "
                         f"{spec.key.to_user_string()}")
        yield mat


def phases_to_materialize(instance: Any, db: Database, run: Run, source: str, by: str, *,
                          own_run_id: str | None = None) -> Iterator[tuple[int | None, Any, AssetMaterialization]]:
    """(phase index, its spec, its AssetMaterialization) for the phases of `run` that closed without
    failed tasks and have not been materialised for this engine run since their last task finished
    (a phase asset that drained them itself has); `by` says who materialises them (their
    `materialized_by`). Nothing while a launch of the tenant (a Dagster run in progress other than a
    drainer or `own_run_id`) still works on the run: its phase ops materialise them. A phase the run
    does not plan (phase index None) is materialised empty, as its phase op does ("not in this run's
    plan"), once a later planned phase has closed: after a stop and a drain it had stayed missing
    (or kept another run's counts) between green phases. Used by drainer runs and by `migrate
    resume/retry --drain`, which drains with no Dagster run (its materialisations are reported runless)."""
    live = instance.get_runs(filters=RunsFilter(tags={tags.ENGINE_RUN: str(run.id)}, statuses=IN_PROGRESS))
    if any(d.tags.get(tags.ROLE) != tags.DRAINER and d.run_id != own_run_id for d in live):
        return  # the tenant's own launch is still on it: its phase ops materialise what they close
    r = rollups.rollup(db, run.id)
    last_finished: dict[int, datetime] = {}
    for t in runs_reads.task_groups(db, run.id):
        if t["last_finished"] is not None:
            last_finished[t["phase"]] = max(last_finished.get(t["phase"], t["last_finished"]), t["last_finished"])
    specs = phase_specs(source)
    for spec in specs:
        phase = spec.run_phase(run)
        if phase is None:
            held = runs_reads.kinds_taken(db, run.tenant_id, run.source, succeeded_only=True)
            mat = _not_planned(instance, run, spec, specs, by, held)
            if mat is not None:
                yield None, spec, mat
            continue
        closed = phase < run.current_phase or run.status == "succeeded"
        if not closed:
            continue
        summary = phase_summary(db, r, phase)
        if summary["tasks"].get("failed"):
            continue
        if _materialized_since(instance, spec.key, run.tenant_id, run.id, last_finished.get(phase)):
            continue
        metadata = phase_metadata(db, r, phase, busy_windows(instance, run.id))
        metadata["materialized_by"] = MetadataValue.text(f"{by} (the phase closed in its turn)")
        yield phase, spec, AssetMaterialization(asset_key=spec.key, partition=run.tenant_id, metadata=metadata)


def _not_planned(instance: Any, run: Run, spec: Any, specs: list[Any], by: str,
                 held: Any = ()) -> AssetMaterialization | None:
    """The empty materialisation of a phase `run` does not plan (`spec`), when a later phase of
    `specs` is planned and closed and the phase has none for this engine run yet; else None. Its
    metadata is the phase op's (`metadata.not_planned_metadata`): "no kind of this phase in the run"
    first, no counts, the kinds left out."""
    later = [s for s in specs[spec.index + 1:] if s.run_phase(run) is not None]
    if not any(s.run_phase(run) < run.current_phase or run.status == "succeeded" for s in later):
        return None
    if _materialized_since(instance, spec.key, run.tenant_id, run.id, None):
        return None
    left = kinds_left_out(provider_for(run.source), run, held)  # `held`: kinds the tenant's succeeded runs took
    metadata = not_planned_metadata(spec.kinds, run, left_out_line(left) if left else None,
                                    f"Materialised by {by}: a later phase closed")
    metadata["materialized_by"] = MetadataValue.text(f"{by} (a later phase closed)")
    return AssetMaterialization(asset_key=spec.key, partition=run.tenant_id, metadata=metadata)


def drainer_job() -> JobDefinition:
    """The drainer job (`drain_tenant`): one helper lane slot for a tenant partition's live run,
    requested by the reaper and lane sensors; its runs carry the drainer role tag."""
    @job(
        name=DRAINER_JOB,
        partitions_def=tenants,
        description="A helper lane slot for a tenant's run, requested by the reaper/lane sensors.",
        tags={tags.ROLE: tags.DRAINER},
    )
    def drain_tenant():
        drain_tenant_run()

    return drain_tenant


# -- explain_row: what happened to one source row, from the UI -----------------------------------


class ExplainRowConfig(Config):
    """The row to explain (the launchpad's `ops: explain: config:`): the tenant partition's key,
    the kind as the ledger names it (e.g. `deals`, `persons`, `emails`), the source's own id. Each
    field carries its description, which the launchpad shows beside it."""

    tenant: str = Field(description="the tenant (its partition key), e.g. acme")
    kind: str = Field(description="the kind as the ledger names it, e.g. deals, persons, emails")
    source_id: str = Field(description="the row's id at the source, as `migrate rows` shows it")
    source: str = Field(default="", description="the source the row came from (e.g. pipedrive); empty: every "
                                                "source the tenant was migrated from")


@resource(description="The engine's Postgres, as the other jobs reach it (DATABASE_URL, else the embedded "
                      "server under MIGRATE_HOME); nothing to set.")
def _explain_database(_: Any) -> Iterator[MigrationDatabase]:
    """The explain job's database resource: fully set from the environment, so its launchpad scaffold
    holds only the row to explain (MigrationDatabase's own fields, url and max_size, appeared there
    pre-filled and unexplained)."""
    database = MigrationDatabase(url=os.environ.get("DATABASE_URL", "").strip(), max_size=2)
    try:
        yield database
    finally:
        if database._db is not None:
            database._db.close()


def row_story(db: Database, config: ExplainRowConfig) -> tuple[str, list[dict[str, Any]]]:
    """(markdown, ledger entries) for one source row: its ledger entries with their runs, and for
    each run whether the row's kind was in its plan; or why there is nothing to tell."""
    entries = row_entries(db, config.tenant, config.kind, str(config.source_id))
    if config.source:
        entries = [e for e in entries if e["source"] == config.source]
    title = f"### {config.kind} {config.source_id} of tenant {config.tenant}"
    if not entries:
        unread = explain_unreadable(db, config.tenant, config.kind, str(config.source_id), config.source or None)
        if unread:  # rows without a readable id (migration 0013): kept apart under their id as served
            lines = [title, ""]
            for u in unread:
                at = u["created_at"].astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
                lines.append(f"- **failed** by run #{u['migration_id']} ({u['run_status']}) from {u['source']} at {at}: "
                             f"the row has no readable id, so it is not in the ledger; kept as `{u['raw_key']}`")
                lines.append(f"  - reason: {u['reason']}")
                if u["excerpt"]:
                    lines.append(f"  - as served: `{u['excerpt']}`")
            return "\n".join(lines), [dict(u) for u in unread]
        kinds = ledger_kinds(db, config.tenant)
        why = (f"The ledger has no entry for this row. Kinds the ledger knows for this tenant: "
               f"{', '.join(kinds) or 'none (no run wrote anything yet)'}. A row never listed by the source "
               "(deleted there, or outside the run's kinds) has no entry.")
        return f"{title}\n\n{why}", []
    lines = [title, ""]
    for e in entries:
        at = e["created_at"].astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        lines.append(f"- **{e['action']}** by run #{e['migration_id']} ({e['run_status']}"
                     f"{', dry run' if e['run_dry_run'] else ''}) from {e['source']} at {at}")
        if e["record_type"]:
            lines.append(f"  - target: `{e['record_type']}` id {e['record_id']}")
        if e["reason"]:
            lines.append(f"  - reason: {e['reason']}")
        gone = [r for r in e.get("dangling") or [] if not r.get("owed")]
        owed = [r for r in e.get("dangling") or [] if r.get("owed")]
        if gone:
            lines.append(f"  - references to parents deleted at the source: `{gone}`")
        later = [r for r in owed if r.get("pending")]  # to rows of the run's kinds not written yet (`pending_links`)
        owed = [r for r in owed if not r.get("pending")]
        if owed:  # links to a kind the run left out, filled when a run takes it (`owed_links`)
            lines.append(f"  - links owed to kinds not taken yet: `{owed}`")
        if later:
            lines.append(f"  - links owed to rows not written yet (the run's end fills them): `{later}`")
    return "\n".join(lines), [dict(e) for e in entries]


@op(name="explain", description="Tell one source row's story from the ledger (set tenant, kind and source_id "
                                "in the launchpad).", out=Out(Nothing))
def explain_op(context: OpExecutionContext, config: ExplainRowConfig, database: MigrationDatabase):
    """Log one source row's story (`row_story`) and put it in the step's metadata (markdown, entries,
    the latest action and reason)."""
    story, entries = row_story(database.database(), config)
    context.log.info(story)
    metadata: dict[str, Any] = {
        "story": MetadataValue.md(story),
        "entries": MetadataValue.int(len(entries)),
    }
    if entries:
        metadata["action"] = MetadataValue.text(str(entries[0]["action"]))
        if entries[0]["reason"]:
            metadata["reason"] = MetadataValue.text(str(entries[0]["reason"]))
    yield Output(None, metadata=metadata)


def explain_job() -> JobDefinition:
    """The `explain_row` job: one source row's story from the ledger, launched from the launchpad."""
    @job(name=EXPLAIN_JOB, description="What happened to one source row: launch with tenant, kind and source_id "
                                        "(ops -> explain -> config) and read the step's log or metadata.",
         tags={tags.ROLE: "explain"}, resource_defs={"database": _explain_database})
    def explain_row():
        explain_op()

    return explain_row
