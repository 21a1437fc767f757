"""One asset per phase of a provider's plan, generated from the plan, partitioned by tenant.

A phase asset's op, for its tenant partition:
1. attaches to the tenant's engine run by the engine's policy (`engine_core.runs.attach`): the one
   this Dagster run already works on (run tag `migration/run_id`, kept by re-execution), else the
   live run (join), else the latest run when it failed or was stopped (a rerun), else a new run;
2. once per Dagster run, prepares it (`engine_core.runs.prepare`): a stopped run resumes, failed
   tasks are re-armed with the barrier rewound to them: rerunning a failed partition is the retry;
3. checks the barrier: `deps=` between phase assets is lineage, not a lock, so if the engine's
   barrier is still on an earlier phase the op helps drain that one first;
4. drains with fenced claims until its phase closes (see `lane.drain_in_slot`: terminating the
   Dagster run stops the engine run), reporting progress every PROGRESS_SECONDS as a log line and
   an asset observation; a source failing every request for MIGRATE_SOURCE_DOWN_SECONDS pauses
   the run with that reason;
5. materialises with the phase's rollup (counts, grouped reasons, a capped table of skipped and
   failed rows, completeness), or fails with the grouped reasons if the phase closed with failed
   tasks (the engine run failed there too). An engine run stopped from elsewhere (`migrate stop`)
   ends the Dagster run CANCELED, as a terminate from the UI does.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import re
from dataclasses import dataclass
from typing import Any, NoReturn

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
    asset,
)
from dagster._core.errors import DagsterExecutionInterruptedError

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.db import Database
from engine_core.errors import AdmissionRefused, NothingToSync
from engine_core.runs import RunStillStopping
from engine_core.models import Run
from engine_core.providers.base import provider_for
from migration_pipeline import tags
from engine_core.budget import waiting_state
from engine_core.progress import PhaseMeter, PhaseProgress, source_down_seconds
from migration_pipeline.assets.metadata import phase_metadata, phase_summary, progress_metadata, reasons_table
from migration_pipeline.lane import drain_in_slot, hold_interrupts
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource

ATTACHED_BY = "migration/attached_by"  # the Dagster run that prepared the engine run (once per run)
PROGRESS_SECONDS = 5.0  # how often a running phase reports its progress (log line + asset observation)


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
# The policy (attach / join / rerun / start, then resume / retry / restart once per launch) is the
# engine's (`engine_core.runs.attach` / `prepare`); this face only reads and writes its run tags.


def _run_tags(context: AssetExecutionContext) -> dict[str, str]:
    current = context.instance.get_run_by_id(context.run_id)  # fresh: earlier steps may have tagged it
    return dict(current.tags if current else context.run.tags)


def _tag_engine_run(context: AssetExecutionContext, run: Run, source: str) -> None:
    if _run_tags(context).get(tags.ENGINE_RUN) != str(run.id):
        context.instance.add_run_tags(context.run_id, {tags.ENGINE_RUN: str(run.id), tags.SOURCE: source})


def attach_run(context: AssetExecutionContext, db: Database, source: SourceResource, new_run: NewRunOptions) -> Run:
    run_tags = _run_tags(context)
    tagged = run_tags.get(tags.ENGINE_RUN, "")
    start_kwargs = new_run.start_kwargs()
    if run_tags.get(tags.MODE) == tags.SYNC:
        start_kwargs["mode"] = tags.SYNC  # the sync job (issue 9): a new run is a sync, not a full run
    try:
        got = runs.attach(db, source.provider(), context.partition_key,
                          tagged_run_id=int(tagged) if tagged.isdigit() else None,
                          start_kwargs=start_kwargs)
    except (AdmissionRefused, NothingToSync) as e:
        raise Failure(str(e), allow_retries=False) from None
    if got.message:
        context.log.info(got.message)
    _tag_engine_run(context, got.run, source.source)
    return got.run


def prepare_run(context: AssetExecutionContext, db: Database, source: SourceResource, run: Run, lane: LaneSettings) -> Run:
    """Once per Dagster run: the engine's `runs.prepare` (resume a stopped run, retry failed tasks)."""
    if _run_tags(context).get(ATTACHED_BY) == context.run_id:
        return runs.get_run(db, run.id)
    try:
        got = runs.prepare(db, run.id, source.provider(run), lane.engine_settings())
    except (AdmissionRefused, RunStillStopping) as e:
        raise Failure(str(e), allow_retries=False) from None
    if got.message:
        (context.log.warning if got.action == "restarted" else context.log.info)(got.message)
    _tag_engine_run(context, got.run, source.source)
    context.instance.add_run_tags(context.run_id, {ATTACHED_BY: context.run_id})
    return got.run


def cancel_this_run(context: Any, message: str) -> NoReturn:
    """End this Dagster run CANCELED, as a terminate from the UI does: the engine run was stopped
    from elsewhere (`migrate stop`, another launch's terminate), so Dagster tells the same story
    (issue 10: a stop made the run FAILURE from the CLI, CANCELED from the UI). Dagster's own
    terminate marks the run CANCELING and interrupts the step; so does this."""
    context.log.warning(message)
    context.instance.report_run_canceling(context.run, message=message)
    raise DagsterExecutionInterruptedError(message)


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



class PhaseReporter:
    """Progress of the phase an op drains, every PROGRESS_SECONDS on the op's main thread: one log
    line and one AssetObservation of the phase's partition with numeric metadata (rows seen /
    imported / skipped / failed, rows/s, requests/s, 429s, retries in progress, tasks done/total,
    percent, ETA), so the UI plots throughput and 429s over time for each phase."""

    def __init__(self, context: AssetExecutionContext, spec: PhaseSpec, db: Database, run_id: int, phase: int,
                 account: str | None = None, source: str = "pipedrive") -> None:
        self.context = context
        self.spec = spec
        self.db = db
        self.run_id = run_id
        self.account = account  # the source account whose budget the run's workers share
        self.source = source
        self.meter = PhaseMeter(db, run_id, phase, list(spec.kinds))
        self.reports = 0
        self.paused: str | None = None
        self.down_after = source_down_seconds()

    def tick(self) -> PhaseProgress:
        p = self.meter.snapshot()
        waiting = self.waiting()
        self.context.log.info(f"progress: {p.line()}" + (f"; {waiting}" if waiting else ""))
        self.context.log_event(AssetObservation(
            asset_key=self.spec.key, partition=self.context.partition_key, metadata=progress_metadata(p),
        ))
        self.reports += 1
        down = None if self.paused else self.meter.source_down(self.down_after)
        if down:
            # a source that fails everything: pause with the reason instead of retrying in silence
            self.paused = down
            self.context.log.error(f"pausing the run: {down}; launch the partition again (or `migrate resume`) "
                                   "once the source answers")
            runs.pause(self.db, self.run_id, down)
        return p

    def waiting(self) -> str | None:
        """What the account's budget waits on now, with until when ("waiting on the daily token
        budget: ..., until 2026-12-02 00:00:00 UTC"; engine_core.budget.waiting_state), or None.
        A wait of the workers is never silent in the run's events; a failure to read it is not
        the phase's failure."""
        if not self.account:
            return None
        try:
            w = waiting_state(self.db, self.account, self.source)
        except Exception:  # noqa: BLE001 - the report goes on without it
            return None
        return f"{w.reason}, until {w.until:%Y-%m-%d %H:%M:%S} UTC" if w.reason and w.until else None


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
    reporter = PhaseReporter(context, spec, db, run.id, phase, account=run.source_account, source=run.source)
    result = drain_in_slot(
        db,
        run.id,
        settings=settings,
        providers=source.providers(),
        until_phase_closed=phase,
        stop_grace_seconds=lane.stop_grace_seconds,
        logger=context.log,
        on_tick=reporter.tick,
        tick_seconds=PROGRESS_SECONDS,
    )
    run = runs.get_run(db, run.id)
    if run.status == "failed" and run.current_phase < phase:
        raise Failure(f"{run.name} failed at phase {run.current_phase + 1} before phase {phase + 1} "
                      f"({', '.join(spec.kinds)}) could run; rerun the partition to retry", allow_retries=False)
    closed = run.current_phase > phase or run.status in ("succeeded", "failed")
    if not closed:
        if run.status in ("stopping", "stopped"):
            why = (f"paused: {reporter.paused}" if reporter.paused else
                   "a stop from `migrate stop` or another launch")
            cancel_this_run(context, f"{run.name} was stopped before phase {phase + 1} closed ({why}); launch the "
                                     "partition again to resume from the checkpoints")
        raise Failure(f"phase {phase + 1} of {run.name} is still open (drain ended: {result.reason})")
    if reporter.reports:
        reporter.tick()  # the closing figures, so the plot ends at the phase's end
    r = rollups.rollup(db, run.id)
    metadata = phase_metadata(db, r, phase)
    summary = phase_summary(db, r, phase)
    failed_tasks = int(summary["tasks"].get("failed", 0))
    if failed_tasks:
        raise Failure(
            description=(f"phase {phase + 1} ({', '.join(spec.kinds)}) of {run.name} closed with "
                         f"{failed_tasks} failed task(s); the engine run failed at this phase. Fix the cause, "
                         f"then rerun the partition (re-execute from failure, or backfill failed partitions) "
                         f"to retry.\n\n" + reasons_table(summary["reasons"])),
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
