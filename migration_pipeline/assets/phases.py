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

A launch on a tenant whose latest run succeeded starts nothing unless it is a sync or asks for a new
run (run tag `migration/new_run=true`; `runs.AlreadyMigrated`). A terminate ends the step with a
one-line Failure saying how to resume, the run CANCELED. A phase out of the run's plan (a run
limited to some kinds) is not materialised, except where a planned phase follows it in the same
Dagster run (`not_in_plan`).
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator

from dagster import (
    AssetCheckResult,
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetsDefinition,
    AssetSpec,
    DagsterRunStatus,
    Failure,
    MaterializeResult,
    MetadataValue,
    RunsFilter,
    multi_asset,
)
from dagster._core.errors import DagsterExecutionInterruptedError

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.budget_waiting import waiting_state
from engine_core.db import Database
from engine_core.errors import AdmissionRefused, NothingToSync
from engine_core.models import Run
from engine_core.plan import kinds_left_out, left_out_line
from engine_core.progress import PhaseMeter, PhaseProgress, source_down_seconds
from engine_core.runs import AlreadyMigrated, RunStillStopping
from engine_core.runs_reads import kinds_taken
from migration_pipeline import tags
from migration_pipeline.assets.cancel import cancel_this_run
from migration_pipeline.assets.checks import (evaluate_ledger_checks, ledger_check_specs, require_run, require_tenant,
                                              settle_planned_checks)
from migration_pipeline.assets.metadata import (busy_windows, not_planned_metadata, phase_metadata, progress_metadata,
                                                run_end_metadata)
from migration_pipeline.assets.specs import PhaseSpec, asset_number, phase_specs
from migration_pipeline.lane import carry
from migration_pipeline.lane.slot import drain_in_slot
from migration_pipeline.lane.terminate import hold_interrupts
from migration_pipeline.lane.threads import LaunchLanes, launch_threads
from migration_pipeline.launch.stop import STOPPED_BY, run_started_at
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource
from migration_pipeline.tags import RunTags, read_run_tags

NEW_RUN_TAG = tags.NEW_RUN  # without it a tenant whose latest run succeeded gets no new full run (`runs.AlreadyMigrated`)
ATTACHED_BY = "migration/attached_by"  # the Dagster run that prepared the engine run (once per run)
PROGRESS_SECONDS = 5.0  # how often a running phase reports its progress (log line + asset observation)


# -- attaching a Dagster run to an engine run ----------------------------------------------------
# The policy (attach / join / rerun / start, then resume / retry / restart once per launch) is the
# engine's (`engine_core.runs.attach` / `prepare`); this face only reads and writes its run tags.


def _tag_engine_run(context: AssetExecutionContext, run: Run, source: str, run_tags: RunTags | None = None) -> None:
    run_tags = run_tags or RunTags(context)
    if run_tags.get(tags.ENGINE_RUN) != str(run.id):
        run_tags.add({tags.ENGINE_RUN: str(run.id), tags.SOURCE: source})


def asks_for_new_run(run_tags: dict[str, str]) -> bool:
    """Whether the launch asks for a new engine run explicitly: run tag `migration/new_run` set to
    true/yes/1 (case-insensitive). Anything else (absent, "false") does not."""
    return run_tags.get(NEW_RUN_TAG, "").strip().lower() in ("true", "yes", "1")


def already_migrated_message(e: AlreadyMigrated, tenant: str) -> str:
    """The one-line refusal of a launch on a tenant whose latest run succeeded, with what to do."""
    return (f"not starting a new run: {e}. To bring what changed since, launch the sync_tenant job on "
            f"partition {tenant!r} (or `migrate sync {tenant}`); to migrate again from scratch, launch with "
            f"the run tag {NEW_RUN_TAG}=true (or resources.new_run.config.start_new: true)")


def attach_run(context: AssetExecutionContext, db: Database, source: SourceResource, new_run: NewRunOptions,
               run_tags: RunTags | None = None) -> Run:
    """The engine run this op works on (see the module docstring, 1.), its id tagged on the Dagster
    run. `run_tags`: the op's copy of the run's tags (default: read now)."""
    run_tags = run_tags or RunTags(context)
    tagged = run_tags.get(tags.ENGINE_RUN, "")
    start_kwargs = new_run.start_kwargs()
    if run_tags.get(tags.MODE) == tags.SYNC:
        start_kwargs["mode"] = tags.SYNC  # the sync job: a new run is a sync, not a full run
    try:
        got = runs.attach(db, source.provider(), context.partition_key,
                          tagged_run_id=int(tagged) if tagged.isdigit() else None,
                          start_kwargs=start_kwargs, new_run=asks_for_new_run(run_tags.tags) or new_run.start_new)
    except AlreadyMigrated as e:
        # CANCELED, not FAILURE: Dagster counts every partition a FAILURE run planned and did not
        # materialise as failed (storage/partition_status_cache.py), which would turn the tenant's
        # phases red over a refusal, and run retries would relaunch a FAILURE run
        settle_planned_checks(context, db, source.source)  # else every planned check shows skipped
        cancel_this_run(context, already_migrated_message(e, context.partition_key))
    except (AdmissionRefused, NothingToSync) as e:
        raise Failure(str(e), allow_retries=False) from None
    if got.message:
        context.log.info(got.message)
    if got.action == "joined" and not run_tags.get(tags.JOINED):
        run_tags.add({tags.JOINED: "true"})
    _tag_engine_run(context, got.run, source.source, run_tags)
    return got.run


def prepare_run(context: AssetExecutionContext, db: Database, source: SourceResource, run: Run, lane: LaneSettings,
                run_tags: RunTags | None = None) -> Run:
    """Once per Dagster run: the engine's `runs.prepare` (resume a stopped run, retry failed tasks)."""
    run_tags = run_tags or RunTags(context)
    if run_tags.get(ATTACHED_BY) == context.run_id:
        return runs.get_run(db, run.id)
    try:
        got = runs.prepare(db, run.id, source.provider(run), lane.engine_settings())
    except (AdmissionRefused, RunStillStopping) as e:
        raise Failure(str(e), allow_retries=False) from None
    if got.message:
        (context.log.warning if got.action == "restarted" else context.log.info)(got.message)
    _tag_engine_run(context, got.run, source.source, run_tags)
    run_tags.add({ATTACHED_BY: context.run_id})
    return got.run


def terminate_requested(context: Any) -> bool:
    """Whether this Dagster run was asked to terminate (CANCELING or CANCELED): an interrupt then is
    the user's request, not a crash. False when it cannot be read."""
    try:
        current = context.instance.get_run_by_id(context.run_id)
    except Exception:  # noqa: BLE001 - unknown: treat the interrupt as Dagster does
        return False
    return current is not None and current.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)


def stopped_by_terminate(run: Run | None) -> str:
    """The one line a terminated phase step ends with (a terminate looked like a crash)."""
    if run is None:
        return "stopped by a terminate request before an engine run was attached; relaunching starts or joins the tenant's run"
    return f"stopped by a terminate request; relaunch resumes engine run {run.id}"


# -- the phase op --------------------------------------------------------------------------------


def stop_after_termination(context: AssetExecutionContext, db: Database, source: str, run: Run | None) -> Run | None:
    """Set the stop flag of the engine run this op attached to, wherever in the op a termination
    landed (attach, prepare, the drain - `drain_in_slot` has set it already - or materialising after
    the drain); if it came between starting one and tagging the Dagster run with it, of the tenant's
    live run that no Dagster run has attached to (the one this op just started). The engine run, or
    None. Never raises: the termination itself matters more."""
    with hold_interrupts():
        try:
            if run is None:
                tagged = read_run_tags(context).get(tags.ENGINE_RUN, "")
                if tagged.isdigit():
                    run = runs.get_run(db, int(tagged))
                else:
                    live = runs.live_run(db, context.partition_key, source)
                    if live is not None and not context.instance.get_runs_count(
                            RunsFilter(tags={tags.ENGINE_RUN: str(live.id)})):
                        run = live
            if run is not None:
                run = runs.get_run(db, run.id)
                if not run.terminal and not run.cancel_requested:
                    run = runs.stop(db, run.id)
                    context.instance.add_run_tags(context.run_id, {tags.STOPPED_ENGINE: str(run.id)})
                    context.log.warning(f"terminated: stop requested for {run.name}")
        except Exception:  # the termination itself matters more
            context.log.exception("could not set the engine run's stop flag after a termination")
    return run


def record_terminate(context: AssetExecutionContext, db: Database, run: Run | None) -> None:
    """Say in the engine run's log who stopped it (`runs.note_stop`), for `migrate status`: the
    command that launched this Dagster run when it tagged the run so (`STOPPED_BY`: its Ctrl-C),
    else a terminate from Dagster, naming this run - unless the stop was named already since this
    Dagster run started (`migrate stop` noted its own; the terminate is that stop's end here, as in
    an in-process run whose watcher interrupts the op that marked the run CANCELING for it). Never
    raises: the termination matters more."""
    if run is None:
        return
    with hold_interrupts():
        try:
            by = read_run_tags(context).get(STOPPED_BY) or f"from Dagster (Dagster run {context.run_id[:8]} terminated)"
            runs.note_stop(db, run.id, by, unless_noted_since=run_started_at(context.instance, context.run_id))
        except Exception:  # noqa: BLE001 - the termination itself matters more
            context.log.exception("could not record who stopped the engine run")


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
        """One progress report (log line and AssetObservation); pauses the run when the source has failed
        every request for MIGRATE_SOURCE_DOWN_SECONDS. The phase's progress as reported."""
        p = self.meter.snapshot()
        waiting = self.waiting()
        self.context.log.info(f"progress: {p.line(self.spec.index + 1)}" + (f"; {waiting}" if waiting else ""))
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
        budget: ..., until 2026-12-02 00:00:00 UTC"; engine_core.budget_waiting.waiting_state), or None.
        A wait of the workers is never silent in the run's events; a failure to read it is not
        the phase's failure."""
        if not self.account:
            return None
        try:
            w = waiting_state(self.db, self.account, self.source)
        except Exception:  # noqa: BLE001 - the report goes on without it
            return None
        return f"{w.reason}, until {w.until:%Y-%m-%d %H:%M:%S} UTC" if w.reason and w.until else None


def planned_after(context: AssetExecutionContext, spec: PhaseSpec, run: Run) -> list[PhaseSpec]:
    """The phases after `spec` that are in the engine run's plan and have a step in this Dagster
    run (its asset selection; None or empty: every phase of the job)."""
    selection = context.run.asset_selection or None  # materialize() leaves it empty: every asset
    return [later for later in phase_specs(spec.source)[spec.index + 1:]
            if later.run_phase(run) is not None and (selection is None or later.key in selection)]


def not_in_plan(context: AssetExecutionContext, spec: PhaseSpec, run: Run, provider: Any = None,
                held: Any = ()) -> MaterializeResult | None:
    """A phase the engine run does not plan (a run limited to some kinds) claims no success
    (every phase went green). It is not materialised - the partition keeps its last real
    materialisation, or stays missing - unless a later phase of this Dagster run is planned: Dagster
    skips every step downstream of an output that was not yielded (`ActiveExecution._should_skip_step`;
    `AssetSpec.skippable`: "causing downstream dependencies to skip"), so there the phase yields a
    materialisation whose first entry says "no kind of this phase in the run" (`not_planned_metadata`)
    and carries no counts, but `left_out` (`provider`'s kinds neither the run nor its tenant's succeeded runs,
    `held`, took: opt-in or not chosen)."""
    what = f"phase {spec.index + 1} ({', '.join(spec.kinds)}) is not in {run.name}'s plan ({', '.join(run.kinds)})"
    later = planned_after(context, spec, run)
    if not later:
        context.log.info(f"{what}: not materialised")
        return None
    context.log.info(f"{what}: materialised as not planned, for {later[0].key.to_user_string()} after it to run")
    left = kinds_left_out(provider, run, held) if provider is not None else {}
    return MaterializeResult(metadata=not_planned_metadata(
        spec.kinds, run, left_out_line(left) if left else None,
        f"Materialised only because {later[0].key.to_user_string()} after it is planned (Dagster skips every "
        "step after a phase that is not materialised)"))


def materialize_phase(
    context: AssetExecutionContext,
    spec: PhaseSpec,
    database: MigrationDatabase,
    source: SourceResource,
    lane: LaneSettings,
    new_run: NewRunOptions,
    on_closed: Any = None,
    attached: list[Run] | None = None,
) -> MaterializeResult | None:
    """The phase op's body (see the module docstring); `on_closed()`, when given, is called once the
    phase is seen closed, before its rollup is read (the op starts its checks there). A terminate
    landing anywhere in it ends the step as `ending_on_terminate` says. `attached` (appended to):
    the engine runs the op attached to, last the latest."""
    db = database.database()
    attached = [] if attached is None else attached
    with ending_on_terminate(context, db, source.source, attached):
        return _materialize_phase(context, spec, db, source, lane, new_run, attached, on_closed)


@contextmanager
def ending_on_terminate(context: AssetExecutionContext, db: Database, source: str, attached: list[Run]) -> Iterator[None]:
    """Around a part of the phase op that runs user code (the drain, the wait for its checks): a
    terminate landing in it stops the engine run (`stop_after_termination`; `attached`: the engine
    runs the op attached to, last the latest, empty before one was); when the Dagster run was asked
    to terminate, the step ends with a one-line Failure ("stopped by a terminate request; relaunch
    resumes engine run N") instead of DagsterExecutionInterruptedError's stack trace, and the run
    still ends CANCELED (a CANCELING run whose steps failed ends CANCELED). Any other interrupt is
    re-raised. Not to wrap a `yield`: a generator closed there gets GeneratorExit."""
    try:
        yield
    except Exception:
        raise
    except BaseException as e:
        run = stop_after_termination(context, db, source, attached[-1] if attached else None)
        if isinstance(e, (DagsterExecutionInterruptedError, KeyboardInterrupt)):
            with hold_interrupts():
                requested = terminate_requested(context)
            if requested:
                record_terminate(context, db, run)
                raise Failure(description=stopped_by_terminate(run), allow_retries=False) from None
        raise


def _materialize_phase(
    context: AssetExecutionContext,
    spec: PhaseSpec,
    db: Database,
    source: SourceResource,
    lane: LaneSettings,
    new_run: NewRunOptions,
    attached: list[Run],
    on_closed: Any = None,
) -> MaterializeResult | None:
    run_tags = RunTags(context)  # read once: the op's own writes keep it true
    run = attach_run(context, db, source, new_run, run_tags)
    attached.append(run)
    phase = spec.run_phase(run)
    if phase is None:
        held = kinds_taken(db, run.tenant_id, run.source, succeeded_only=True)
        return not_in_plan(context, spec, run, source.provider(run), held)
    run = prepare_run(context, db, source, run, lane, run_tags)
    attached.append(run)
    if run.status == "running" and run.current_phase < phase:
        context.log.info(f"the barrier of {run.name} is at phase {asset_number(run, run.current_phase)}; "
                         f"draining it until phase {spec.index + 1} ({', '.join(spec.kinds)}) closes")
    settings = replace(lane.engine_settings(), launch_last_phase=last_phase_here(context, spec, run))
    reporter = PhaseReporter(context, spec, db, run.id, phase, account=run.source_account, source=run.source)
    extra = LaunchLanes.for_step(context, db, run.id, phase, settings, source.providers(), launch_threads(settings),
                                 run_tags, carry_to=next_phase_here(context, spec, run, phase),
                                 grace=lane.stop_grace_seconds)
    try:
        extra.acquire()
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
            on_poll=extra.poll,
        )
    except BaseException:
        extra.stop(lane.stop_grace_seconds, raise_errors=False)  # the termination or error goes first
        raise
    if not extra.finish(lane.stop_grace_seconds):
        return _after_drain(context, spec, db, source, run, phase, reporter, result, on_closed)
    try:  # its threads drain on into the next op's phase: handed to that op once this one materialises
        materialized = _after_drain(context, spec, db, source, run, phase, reporter, result, on_closed)
    except BaseException:
        extra.stop(lane.stop_grace_seconds, raise_errors=False)
        raise
    carry.carry(context.run_id, extra)
    return materialized


def _steps_to_execute(context: AssetExecutionContext) -> set[str] | None:
    """The step keys of this Dagster run's execution plan, or None when it cannot be read."""
    try:
        return set(context.op_execution_context.get_step_execution_context().execution_plan.step_keys_to_execute)
    except Exception:  # noqa: BLE001 - unknown
        return None


def last_phase_here(context: AssetExecutionContext, spec: PhaseSpec, run: Run) -> int | None:
    """The last engine phase this Dagster run executes, from this op's on (`Settings.launch_last_phase`:
    nothing is asked ahead of the source for a phase after it); None when that cannot be told (every
    phase). A launch whose selection stops before the run's last phase - a run of some phase assets
    only - would otherwise list the next phase's first pages for nobody."""
    steps = _steps_to_execute(context)
    specs = phase_specs(spec.source)
    if steps is None or spec.index >= len(specs) or specs[spec.index].key != spec.key:
        return None  # no plan to read, or assets built from another plan than the source's
    here = [at for later in specs[spec.index:] if later.key.to_python_identifier() in steps
            for at in (later.run_phase(run),) if at is not None]
    return max(here) if here else None


def next_phase_here(context: AssetExecutionContext, spec: PhaseSpec, run: Run, phase: int) -> int | None:
    """The engine phase of the Dagster run's next phase op when that op executes after this one on
    this thread (`lane.carry.allowed`: the project's in-process executor) - every phase asset up to
    it is a step of the run's plan, and it drains `phase + 1` - else None."""
    if not carry.allowed():
        return None
    steps = _steps_to_execute(context)
    if steps is None:  # no plan to read: nothing is carried
        return None
    specs = phase_specs(spec.source)
    if spec.index >= len(specs) or specs[spec.index].key != spec.key:
        return None  # assets built from another plan than the source's
    for later in specs[spec.index + 1:]:
        if later.key.to_python_identifier() not in steps:
            return None
        at = later.run_phase(run)
        if at is not None:  # the phases between, out of the run's plan, materialise without draining
            return at if at == phase + 1 else None
    return None


def _after_drain(context: AssetExecutionContext, spec: PhaseSpec, db: Database, source: SourceResource, run: Run,
                 phase: int, reporter: PhaseReporter, result: Any, on_closed: Any) -> MaterializeResult:
    """The op's phase after its drain: closed, its checks started (`on_closed`), its rollup read
    into the materialisation's metadata; Failure when it is still open or closed with failed tasks."""
    run = runs.get_run(db, run.id)
    if run.status == "failed" and run.current_phase < phase:
        raise Failure(f"{run.name} failed at phase {asset_number(run, run.current_phase)} before phase {spec.index + 1} "
                      f"({', '.join(spec.kinds)}) could run; rerun the partition to retry", allow_retries=False)
    closed = run.current_phase > phase or run.status in ("succeeded", "failed")
    if not closed:
        if run.status in ("stopping", "stopped"):
            why = (f"paused: {reporter.paused}" if reporter.paused else
                   "a stop from `migrate stop` or another launch")
            cancel_this_run(context, f"{run.name} was stopped before phase {spec.index + 1} closed ({why}); launch the "
                                     "partition again to resume from the checkpoints")
        raise Failure(f"phase {spec.index + 1} of {run.name} is still open (drain ended: {result.reason})")
    if on_closed is not None:
        on_closed()
    if reporter.reports:
        reporter.tick()  # the closing figures, so the plot ends at the phase's end
    r = rollups.rollup(db, run.id)
    metadata = phase_metadata(db, r, phase, busy_windows(context.instance, run.id))
    held = kinds_taken(db, run.tenant_id, run.source, succeeded_only=True)  # kinds the tenant's other runs took
    left = left_out_line(kinds_left_out(source.provider(run), run, held))
    if left:  # what the run did not take, on every phase it materialises: the UI's first answer to "is that all?"
        metadata["left_out"] = MetadataValue.text(left)
    failed_tasks = int(metadata["failed_tasks"].value)  # the phase's summary, as phase_metadata read it
    if failed_tasks:
        raise Failure(
            description=(f"phase {spec.index + 1} ({', '.join(spec.kinds)}) of {run.name} closed with "
                         f"{failed_tasks} failed task(s); the engine run failed at this phase. Fix the cause, "
                         f"then rerun the partition (re-execute from failure, or backfill failed partitions) "
                         f"to retry.\n\n" + metadata["reasons"].value),
            metadata=metadata,
            allow_retries=False,
        )
    if phase == len(r.phases) - 1:
        observe_run_end(context, spec, db, run, r)
    return MaterializeResult(metadata=metadata)


def observe_run_end(context: AssetExecutionContext, spec: PhaseSpec, db: Database, run: Run,
                    r: rollups.RunRollup) -> None:
    """Once the run's last phase (the catch-up) has closed: an observation of every earlier phase
    of the run's plan, on this partition, with its per_kind as the run ended (`run_end_metadata`).
    Each phase materialised at its own close, before the catch-up wrote rows of its kinds and marked
    rows deleted at the source, so its by_catchup and deleted_at_source said 0 while `migrate status`
    showed the catch-up's figures."""
    for earlier in phase_specs(spec.source)[:spec.index]:
        at = earlier.run_phase(run)
        if at is not None and at < len(r.phases) - 1:
            context.log_event(AssetObservation(asset_key=earlier.key, partition=context.partition_key,
                                               metadata=run_end_metadata(db, r, at, run.mode)))


def phase_step(
    context: AssetExecutionContext,
    spec: PhaseSpec,
    database: MigrationDatabase,
    source: SourceResource,
    lane: LaneSettings,
    new_run: NewRunOptions,
) -> Iterator[MaterializeResult | AssetCheckResult]:
    """The phase op's step for its tenant partition: the phase drained to its close and
    materialised (`materialize_phase`), then its selected ledger checks; a run that selects only
    checks evaluates those and drains nothing. Raises Failure (one line) without a tenant
    partition, or when the tenant has no run of the source and only checks are selected.

    The checks' queries (their own snapshot of the phase, read-only) start on a thread as soon as
    the phase is seen closed, while the op reads the rollup and Dagster records the
    materialisation; their results are yielded after it, so their evaluations name it as the one
    they checked. A phase that fails (failed tasks) yields no evaluations. A terminate landing while
    the op waits for them ends the step as one in the drain does (`ending_on_terminate`)."""
    require_tenant(context)
    checks = {k.name for k in context.selected_asset_check_keys}
    if spec.key not in context.selected_asset_keys:
        require_run(database.database(), context.partition_key, spec)
        yield from evaluate_ledger_checks(database.database(), context.partition_key, spec, checks)
        return
    attached: list[Run] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"checks-{spec.index + 1}") as aside:
        started = []

        def start_checks() -> None:
            started.append(aside.submit(evaluate_ledger_checks, database.database(), context.partition_key, spec,
                                        checks))

        result = materialize_phase(context, spec, database, source, lane, new_run,
                                   on_closed=start_checks if checks else None, attached=attached)
        if result is None:  # not materialised, nor any later phase (Dagster skips their steps): their checks
            settle_planned_checks(context, database.database(), source.source)  # read the last materialisations
            return
        yield MaterializeResult(asset_key=spec.key, metadata=result.metadata)
        if checks:  # a phase materialised as not planned was never seen closed: checked here
            with ending_on_terminate(context, database.database(), source.source, attached):
                evaluations = (started[0].result() if started else
                               evaluate_ledger_checks(database.database(), context.partition_key, spec, checks))
            yield from evaluations


def _phase_asset(spec: PhaseSpec, upstream: AssetKey | None) -> AssetsDefinition:
    """The phase's asset, with its ledger checks (checks.ledger_check_specs) evaluated in the
    same op: their queries start when the phase is seen closed, their results follow the
    materialisation. One step per phase, not two: a separate checks step per phase (its own start
    and success events, inputs' data versions, partition lookups) cost ~0.1 s a phase of a small
    account's `migrate run`. The op is subsettable (`phase_step`): a run that selects only some of
    the checks evaluates those and drains nothing; a run of the asset without its checks evaluates
    none. Its body is `phase_step`."""

    @multi_asset(
        name=spec.key.to_python_identifier(),
        specs=[AssetSpec(
            key=spec.key,
            deps=[upstream] if upstream else [],
            group_name=f"{spec.source}_migration",
            description=(f"Phase {spec.index + 1} of the {spec.source} plan: {', '.join(spec.kinds)}. "
                         "Materialising a tenant partition starts or joins the tenant's run and drains "
                         "this phase with fenced claims until it closes."),
            kinds={"postgres"},
            metadata={"phase": spec.index + 1, "kinds": ", ".join(spec.kinds), "source": spec.source},
            skippable=True,  # a phase out of the run's plan is not materialised (`not_in_plan`)
        )],
        check_specs=ledger_check_specs(spec),
        partitions_def=tenants,
        can_subset=True,
    )
    def _phase(
        context: AssetExecutionContext,
        database: MigrationDatabase,
        source: SourceResource,
        lane: LaneSettings,
        new_run: NewRunOptions,
    ):
        yield from phase_step(context, spec, database, source, lane, new_run)

    return _phase


def build_phase_assets(source: str, phases: list[list[str]] | None = None) -> list[AssetsDefinition]:
    """One asset per phase of the source's plan, each depending on the one before it."""
    built: list[AssetsDefinition] = []
    previous: AssetKey | None = None
    for spec in phase_specs(source, phases):
        built.append(_phase_asset(spec, previous))
        previous = spec.key
    return built
