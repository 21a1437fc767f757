"""One asset per phase of a provider's plan, generated from the plan, partitioned by tenant.

A phase asset's op, for its tenant partition:
1. attaches to the tenant's engine run: the one this Dagster run already works on (run tag
   `migration/run_id`, kept by re-execution), else the live run (join), else the latest run when it
   failed or was stopped (a rerun), else a new run (admission as in the engine);
2. once per Dagster run, prepares it: a stopped run resumes and failed tasks are re-armed with the
   barrier rewound to them (the engine's retry): rerunning a failed partition is the retry;
3. checks the barrier: `deps=` between phase assets is lineage, not a lock, so if the engine's
   barrier is still on an earlier phase the op helps drain that one first;
4. drains with fenced claims until its phase closes (see `lane.drain_in_slot`: terminating the
   Dagster run stops the engine run);
5. materialises with the phase's rollup, or fails with the grouped reasons if the phase closed with
   failed tasks.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import re
import time
from dataclasses import dataclass

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
    asset,
)

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.db import Database
from engine_core.errors import AdmissionRefused, NothingToDo, RunNotFound
from engine_core.models import Run
from engine_core.providers.base import provider_for
from migration_pipeline import tags
from migration_pipeline.assets.metadata import phase_metadata, phase_summary, reasons_table
from migration_pipeline.lane import drain_in_slot, hold_interrupts
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource

ATTACHED_BY = "migration/attached_by"  # the Dagster run that prepared the engine run (once per run)
STOP_SETTLE_SECONDS = 30.0


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of the provider's plan and the asset that stands for it."""

    source: str
    index: int  # position in the provider's full plan
    kinds: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"phase_{self.index + 1}_" + "_".join(re.sub(r"[^a-z0-9]+", "_", k.lower()) for k in self.kinds)

    @property
    def key(self) -> AssetKey:
        return AssetKey([self.source, self.name])

    def run_phase(self, run: Run) -> int | None:
        """This phase's index in a run's plan (a run limited to some kinds has fewer phases)."""
        for i, group in enumerate(run.plan):
            if set(group) & set(self.kinds):
                return i
        return None


def plan_of(source: str) -> list[list[str]]:
    return [list(g) for g in provider_for(source).phases() if g]


def phase_specs(source: str, phases: list[list[str]] | None = None) -> list[PhaseSpec]:
    phases = plan_of(source) if phases is None else phases
    return [PhaseSpec(source, i, tuple(group)) for i, group in enumerate(phases)]


# -- attaching a Dagster run to an engine run ----------------------------------------------------


def _run_tags(context: AssetExecutionContext) -> dict[str, str]:
    current = context.instance.get_run_by_id(context.run_id)  # fresh: earlier steps may have tagged it
    return dict(current.tags if current else context.run.tags)


def attach_run(context: AssetExecutionContext, db: Database, source: SourceResource, new_run: NewRunOptions) -> Run:
    tenant = context.partition_key
    run_tags = _run_tags(context)
    run: Run | None = None
    if run_tags.get(tags.ENGINE_RUN, "").isdigit():
        try:
            tagged = runs.get_run(db, int(run_tags[tags.ENGINE_RUN]))
            if tagged.tenant_id == tenant and tagged.source == source.source:
                run = tagged
        except RunNotFound:
            pass
    if run is None:
        run = runs.live_run(db, tenant, source.source)
        if run is not None:
            context.log.info(f"joined {run.name}")
    if run is None:
        try:
            latest = runs.latest_run(db, tenant, source.source)
        except RunNotFound:
            latest = None
        if latest is not None and latest.status in ("failed", "stopped"):
            run = latest  # a rerun: prepared (retried or resumed) below
        else:
            try:
                run, started = runs.start_or_join(db, source.provider(), tenant, **new_run.start_kwargs())
            except AdmissionRefused as e:
                raise Failure(str(e), allow_retries=False) from None
            context.log.info(f"{'started' if started else 'joined'} {run.name}: "
                             + " -> ".join("[" + ", ".join(g) + "]" for g in run.plan))
    if run_tags.get(tags.ENGINE_RUN) != str(run.id):
        context.instance.add_run_tags(context.run_id, {tags.ENGINE_RUN: str(run.id), tags.SOURCE: source.source})
    return run


def _settle_stopping(db: Database, run: Run) -> Run:
    """Wait for a stopping run's running tasks to reach a stop point; runs.stop is idempotent and
    settles the stop once nothing runs (and cancels tasks a reaper released meanwhile)."""
    deadline = time.monotonic() + STOP_SETTLE_SECONDS
    while run.status == "stopping" and time.monotonic() < deadline:
        run = runs.stop(db, run.id)
        if run.status == "stopping":
            time.sleep(0.5)
    return run


def prepare_run(context: AssetExecutionContext, db: Database, source: SourceResource, run: Run, lane: LaneSettings) -> Run:
    """Once per Dagster run: resume a stopped run, re-arm failed tasks (the engine's retry)."""
    if _run_tags(context).get(ATTACHED_BY) == context.run_id:
        return runs.get_run(db, run.id)
    settings = lane.engine_settings()
    provider = source.provider(run)
    if run.status == "stopping":
        run = _settle_stopping(db, run)
        if run.status == "stopping":
            raise Failure(f"{run.name} is still stopping (a task has not reached a stop point); "
                          "launch the partition again once it has stopped", allow_retries=False)
    try:
        if run.status == "stopped":
            run = runs.retry(db, run.id, provider, settings)  # a stopped run: cancelled and failed tasks
            context.log.info(f"resumed {run.name} from its checkpoints at phase {run.current_phase + 1}")
        elif any(k.tasks.get("failed") for k in rollups.rollup(db, run.id).kinds):
            run = runs.retry(db, run.id, provider, settings)
            context.log.info(f"retrying {run.name}: failed tasks re-armed, barrier at phase {run.current_phase + 1}")
    except NothingToDo:
        if run.status == "stopped":
            # stopped between phases with nothing cancelled: the engine cannot reopen it, start anew
            context.log.warning(f"{run.name} was stopped with no task to resume; starting a new run")
            run, _ = runs.start_or_join(db, provider, run.tenant_id, options=dict(run.options), dry_run=run.dry_run,
                                        kinds=list(run.kinds))
            context.instance.add_run_tags(context.run_id, {tags.ENGINE_RUN: str(run.id)})
    except AdmissionRefused as e:
        raise Failure(str(e), allow_retries=False) from None
    context.instance.add_run_tags(context.run_id, {ATTACHED_BY: context.run_id})
    return run


# -- the phase op --------------------------------------------------------------------------------


def stop_after_early_termination(context: AssetExecutionContext, db: Database, source: str, run: Run | None) -> None:
    """Set the stop flag of the engine run this op attached to; if the termination came between
    starting one and tagging the Dagster run with it, of the tenant's live run that no Dagster run
    has attached to (the one this op just started)."""
    with hold_interrupts():
        try:
            if run is None:
                tagged = _run_tags(context).get(tags.ENGINE_RUN, "")
                if tagged.isdigit():
                    run = runs.get_run(db, int(tagged))
                else:
                    live = runs.live_run(db, context.partition_key, source)
                    if live is not None and not context.instance.get_runs_count(
                            RunsFilter(tags={tags.ENGINE_RUN: str(live.id)})):
                        run = live
            if run is not None and not run.terminal:
                stopped = runs.stop(db, run.id)
                context.log.warning(f"terminated before draining: stop requested for {stopped.name}")
        except Exception:  # the termination itself matters more
            context.log.exception("could not set the engine run's stop flag after an early termination")



def materialize_phase(
    context: AssetExecutionContext,
    spec: PhaseSpec,
    database: MigrationDatabase,
    source: SourceResource,
    lane: LaneSettings,
    new_run: NewRunOptions,
) -> MaterializeResult:
    db = database.database()
    attached: list[Run] = []
    try:
        run = attach_run(context, db, source, new_run)
        attached.append(run)
        phase = spec.run_phase(run)
        if phase is None:
            return MaterializeResult(metadata={
                "engine_run": MetadataValue.text(run.name),
                "engine_run_id": MetadataValue.int(run.id),
                "note": MetadataValue.text(f"{', '.join(spec.kinds)} not in this run's plan"),
            })
        run = prepare_run(context, db, source, run, lane)
    except Exception:
        raise
    except BaseException:
        # Terminated before draining began (drain_in_slot handles it from then on): the engine run
        # must stop too, or the sensors' drainers would carry on a migration the user stopped.
        stop_after_early_termination(context, db, source.source, attached[0] if attached else None)
        raise
    if run.status == "running" and run.current_phase < phase:
        context.log.info(f"the barrier of {run.name} is at phase {run.current_phase + 1}; "
                         f"draining it until phase {phase + 1} ({', '.join(spec.kinds)}) closes")
    settings = lane.engine_settings()
    result = drain_in_slot(
        db,
        run.id,
        settings=settings,
        providers=source.providers(),
        until_phase_closed=phase,
        stop_grace_seconds=lane.stop_grace_seconds,
        logger=context.log,
    )
    run = runs.get_run(db, run.id)
    closed = run.current_phase > phase or run.status in ("succeeded", "failed")
    if not closed:
        if run.status in ("stopping", "stopped"):
            raise Failure(f"{run.name} was stopped before phase {phase + 1} closed; "
                          "launch the partition again to resume from the checkpoints", allow_retries=False)
        raise Failure(f"phase {phase + 1} of {run.name} is still open (drain ended: {result.reason})")
    r = rollups.rollup(db, run.id)
    metadata = phase_metadata(db, r, phase)
    summary = phase_summary(db, r, phase)
    failed_tasks = int(summary["tasks"].get("failed", 0))
    if failed_tasks:
        raise Failure(
            description=(f"phase {phase + 1} ({', '.join(spec.kinds)}) of {run.name} closed with "
                         f"{failed_tasks} failed task(s). Fix the cause, then rerun the partition "
                         f"(re-execute from failure, or backfill failed partitions) to retry.\n\n"
                         + reasons_table(summary["reasons"])),
            metadata=metadata,
            allow_retries=False,
        )
    return MaterializeResult(metadata=metadata)


def _phase_asset(spec: PhaseSpec, upstream: AssetKey | None) -> AssetsDefinition:
    @asset(
        key=spec.key,
        partitions_def=tenants,
        deps=[upstream] if upstream else None,
        group_name=f"{spec.source}_migration",
        description=(f"Phase {spec.index + 1} of the {spec.source} plan: {', '.join(spec.kinds)}. "
                     "Materialising a tenant partition starts or joins the tenant's run and drains "
                     "this phase with fenced claims until it closes."),
        kinds={"postgres"},
        metadata={"phase": spec.index + 1, "kinds": ", ".join(spec.kinds), "source": spec.source},
    )
    def _phase(
        context: AssetExecutionContext,
        database: MigrationDatabase,
        source: SourceResource,
        lane: LaneSettings,
        new_run: NewRunOptions,
    ) -> MaterializeResult:
        return materialize_phase(context, spec, database, source, lane, new_run)

    return _phase


def build_phase_assets(source: str, phases: list[list[str]] | None = None) -> list[AssetsDefinition]:
    """One asset per phase of the source's plan, each depending on the one before it."""
    built: list[AssetsDefinition] = []
    previous: AssetKey | None = None
    for spec in phase_specs(source, phases):
        built.append(_phase_asset(spec, previous))
        previous = spec.key
    return built
