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

import re
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
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
    AssetSpec,
    RunsFilter,
    multi_asset,
)
from dagster._core.errors import DagsterExecutionInterruptedError

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.db import Database
from engine_core.config import Settings, number
from engine_core.errors import AdmissionRefused, NothingToSync
from engine_core.worker import Worker
from engine_core.runs import AlreadyMigrated, RunStillStopping
from engine_core.models import Run
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from engine_core.budget import waiting_state
from engine_core.progress import PhaseMeter, PhaseProgress, source_down_seconds
from migration_pipeline.assets.metadata import phase_metadata, progress_metadata
from migration_pipeline.lane import drain_in_slot, hold_interrupts
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource

NEW_RUN_TAG = tags.NEW_RUN  # without it a tenant whose latest run succeeded gets no new full run (`runs.AlreadyMigrated`)
ATTACHED_BY = "migration/attached_by"  # the Dagster run that prepared the engine run (once per run)
PROGRESS_SECONDS = 5.0  # how often a running phase reports its progress (log line + asset observation)
LAUNCH_THREADS_ENV = "MIGRATE_LAUNCH_THREADS"  # lane threads of a launch's phase op (see LaunchLanes)


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


class RunTags:
    """This Dagster run's tags as one phase op knows them: read once when the op starts (earlier
    steps may have tagged the run), then kept in step with the op's own writes (`add`). The keys
    the op reads (the engine run, attached_by, the lane tags, the launch's options) are written
    only by the run's own phase ops, one at a time, so the copy stays true for the op's life; a
    run read per look cost five reads of the run (each a query and the run's deserialisation) per
    phase op (issue 11)."""

    def __init__(self, context: AssetExecutionContext) -> None:
        self.context = context
        self.tags = _run_tags(context)

    def get(self, key: str, default: str = "") -> str:
        return self.tags.get(key, default)

    def add(self, new: dict[str, str]) -> None:
        """Write `new` on the run (Dagster's `add_run_tags`) and into this copy."""
        self.context.instance.add_run_tags(self.context.run_id, new)
        self.tags.update(new)


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
        start_kwargs["mode"] = tags.SYNC  # the sync job (issue 9): a new run is a sync, not a full run
    try:
        got = runs.attach(db, source.provider(), context.partition_key,
                          tagged_run_id=int(tagged) if tagged.isdigit() else None,
                          start_kwargs=start_kwargs, new_run=asks_for_new_run(run_tags.tags) or new_run.start_new)
    except AlreadyMigrated as e:
        # CANCELED, not FAILURE: Dagster counts every partition a FAILURE run planned and did not
        # materialise as failed (storage/partition_status_cache.py), which would turn the tenant's
        # phases red over a refusal, and run retries would relaunch a FAILURE run
        cancel_this_run(context, already_migrated_message(e, context.partition_key))
    except (AdmissionRefused, NothingToSync) as e:
        raise Failure(str(e), allow_retries=False) from None
    if got.message:
        context.log.info(got.message)
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


def cancel_this_run(context: Any, message: str) -> NoReturn:
    """End this Dagster run CANCELED, as a terminate from the UI does: the engine run was stopped
    from elsewhere (`migrate stop`, another launch's terminate), so Dagster tells the same story
    (issue 10: a stop made the run FAILURE from the CLI, CANCELED from the UI). The run is marked
    CANCELING (what Dagster's own terminate does) and the step ends with a one-line `Failure`: a
    run with a failed step that is CANCELING ends CANCELED (dagster/_core/execution/api.py,
    `job_execution_iterator`), and the step's event says why without an interrupt's stack trace."""
    context.log.warning(message)
    context.instance.report_run_canceling(context.run, message=message)
    raise Failure(description=message, allow_retries=False)


def terminate_requested(context: Any) -> bool:
    """Whether this Dagster run was asked to terminate (CANCELING or CANCELED): an interrupt then is
    the user's request, not a crash. False when it cannot be read."""
    from dagster import DagsterRunStatus

    try:
        current = context.instance.get_run_by_id(context.run_id)
    except Exception:  # noqa: BLE001 - unknown: treat the interrupt as Dagster does
        return False
    return current is not None and current.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)


def stopped_by_terminate(run: Run | None) -> str:
    """The one line a terminated phase step ends with (issue 10: a terminate looked like a crash)."""
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
                tagged = _run_tags(context).get(tags.ENGINE_RUN, "")
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
                    context.log.warning(f"terminated: stop requested for {run.name}")
        except Exception:  # the termination itself matters more
            context.log.exception("could not set the engine run's stop flag after a termination")
    return run


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


# -- the phase op's lane threads -------------------------------------------------------------------


def launch_threads(settings: Settings, env: dict[str, str] | None = None) -> int:
    """MIGRATE_LAUNCH_THREADS: how many lane threads a launch's phase op may drain with, from 1 to the
    lane width (the default, unset: the width; larger values are capped to it). The op takes at most
    its tenant's fair share of the lane's slots (`LaunchLanes`); 1 leaves the rest of the share to
    drainer runs. Raises ConfigError (one line naming the variable) for anything else."""
    value = int(number(LAUNCH_THREADS_ENV, env))  # ConfigError naming the variable (engine_core.config)
    return settings.lane_width if value == 0 else min(value, settings.lane_width)  # 0: unset


LANE_REFRESH_SECONDS = 1.0  # how often a launch with more than one thread re-reads its allowance
LANE_WAIT_SECONDS = 0.5  # how often a launch waiting for a lane slot looks again

# The op's resource pool (MigrationDatabase, one per Dagster run) grown for the extra threads once
# per run: pool -> its size before. Weak: the resource closes and drops its pool at the run's end.
_GROWN: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def lanes_pool(db: Database, threads: int) -> Database:
    """The pool the extra lane threads of a phase op drain with: the op's own (the run's
    MigrationDatabase pool), grown once per run by what the extra threads use, sized as the
    engine's own lanes are (drain_threads' callers: 3 per thread, and 2 more). Unshared, the op's
    pool (6) was slower than none (the op's thread, its lock keepers and its progress reports wait
    on it); a pool of their own per phase op opened and closed connections every phase (issue 11).
    The run's connections stay open between phases and close with the resource."""
    pool = db.pool
    if pool not in _GROWN:
        _GROWN[pool] = pool.max_size
        pool.resize(pool.min_size, pool.max_size + 3 * max(1, threads - 1) + 2)
    return db


class LaunchLanes:
    """The lane slots of a launch's phase op: its own thread (`drain_in_slot`) and up to
    MIGRATE_LAUNCH_THREADS - 1 more in the op's process (issue 11: a small account spent most of
    `migrate run` in one thread while drainer runs, each a process of its own, started).

    The lane counts slots (threads), not runs (`fair_lane`): before its own thread drains, the op
    takes `LanePicture.slots_for` slots - at most the tenant's fair share, never one another run
    holds - and records them on its Dagster run (`fair_lane.LANE_SLOTS_TAG`, with the most it may
    grow to in `LANE_THREADS_TAG`), so the sensors request drainers only for slots no launch thread
    holds or will take. Taking is serialised by an advisory lock of the engine database
    (`fair_lane.LANE_LOCK`), so two launches never both take the same free slot. When none is free
    the op records 0 and waits (the tenant is then "waiting": other tenants' extra threads and
    drainers above their share give way at their next task boundary). While it drains, the op
    re-reads its allowance every LANE_REFRESH_SECONDS (`poll`, on the op's main thread: Dagster's
    instance is not shared with the threads): it starts threads up to it, and threads beyond it give
    their slot back at a task boundary; the tag is raised before a thread starts and lowered only
    once a thread has stopped, so it never says fewer threads than drain. The op's own thread never
    gives way. A termination stops the engine run (`drain_in_slot`), which every thread checks
    before a claim.

    Alone in the lane (no other Dagster run in progress or queued: `alone`, one count of the run
    storage) nothing can change the op's allowance but itself, so the bookkeeping is skipped
    (issue 11: the lane picture read every second and the tags written at every phase's start and
    end were a tenth of a small `migrate run`'s steps): a run whose tag already says all its
    threads takes them without the picture; while it holds them all it does not re-read the
    picture; and at the phase's end it keeps its tag rather than lowering it to its one slot (the
    next phase op takes the same). A run arriving meanwhile is seen at the next look: the op then
    reads the picture under the lock as before, and a launch that had to wait for a slot waits at
    most until this run's next phase op starts (its share taken, the rest given) or the run ends."""

    def __init__(self, context: AssetExecutionContext, db: Database, run_id: int, phase: int,
                 settings: Settings, providers: Any, threads: int, run_tags: RunTags | None = None) -> None:
        from migration_pipeline.fair_lane import LANE_SEEN_TAG, LANE_SLOTS_TAG, LANE_THREADS_TAG

        self.context, self.db, self.run_id, self.phase = context, db, run_id, phase
        self.settings, self.providers, self.threads = settings, providers, threads
        # a previous phase op of this Dagster run may have tagged it
        self.run_tags = run_tags or RunTags(context)
        self.cancel = threading.Event()
        self.allowance = 1  # slots this op may hold now, its own thread included
        self.extra: dict[int, threading.Event] = {}  # extra thread index -> done
        self.finished = False  # a thread found the phase closed (or the run not running): no more starts
        self.errors: list[BaseException] = []
        self.executed = 0
        self.pool: Database | None = None
        self.next_refresh = 0.0
        # the first record writes both (the sensors hold drainers back until a launch said its threads)
        self.recorded = (self.run_tags.tags.get(LANE_SLOTS_TAG), self.run_tags.tags.get(LANE_THREADS_TAG))
        try:  # when the run last wrote its lane_seen stamp (epoch seconds): a previous phase op's counts
            self.stamped = float(self.run_tags.get(LANE_SEEN_TAG, "0")) if self.recorded[1] else 0.0
        except ValueError:
            self.stamped = 0.0
        self.stamp_every = max(1.0, settings.stale_lock_seconds / 4)

    # -- the slots tag and the lane lock

    def live(self) -> int:
        """Threads draining now, the op's own included."""
        return 1 + sum(1 for done in self.extra.values() if not done.is_set())

    def record(self, slots: int) -> None:
        """Write the run's slots tag when it changed, and its live stamp every `stamp_every` seconds
        (one write to the run storage; a stale stamp counts as a dead launch's 1 slot)."""
        from migration_pipeline.fair_lane import LANE_SEEN_TAG, LANE_SLOTS_TAG, LANE_THREADS_TAG

        wanted = (str(slots), str(self.threads))
        now = time.time()
        if wanted != self.recorded or now - self.stamped >= self.stamp_every:
            # the stamp says the slots are live (fair_lane.held_by_launch): a dead launch's go back
            self.run_tags.add({LANE_SLOTS_TAG: wanted[0], LANE_THREADS_TAG: wanted[1], LANE_SEEN_TAG: f"{now:.0f}"})
            self.recorded, self.stamped = wanted, now

    def alone(self) -> bool:
        """Whether this is the only Dagster run in progress or queued (any job, any tenant): then
        no other run holds, takes or waits for a slot. False when it cannot be read."""
        from migration_pipeline.fair_lane import IN_PROGRESS, QUEUED

        try:
            return self.context.instance.get_runs_count(RunsFilter(statuses=IN_PROGRESS + QUEUED)) <= 1
        except Exception:  # noqa: BLE001 - unknown: read the picture
            return False

    def holds_all(self) -> bool:
        """Whether the run's tag already says it holds all its threads (a previous phase op's)."""
        return self.recorded == (str(self.threads), str(self.threads))

    def _slots_now(self) -> int:
        """Under the lane lock: the slots this run may hold now (`LanePicture.slots_for`); alone in
        the lane (no other tenant's run, no other run of its own, none queued) all its threads, up to
        the width, whatever its demand now: there is nobody to share the lane with, and the threads
        that find nothing to claim wait for the work the others enqueue, as the engine's own lane
        does (`drain_threads`). Taken once, they need no re-reading while the run stays alone."""
        from migration_pipeline import fair_lane

        tenant, me = self.context.partition_key, self.context.run_id
        picture = fair_lane.lane_picture(self.context.instance, self.db, self.settings)
        mine = picture.tenants.get(tenant)
        if set(picture.tenants) <= {tenant} and (mine is None or (mine.in_progress in ([], [me]) and not mine.queued)):
            return min(self.threads, picture.width)
        return picture.slots_for(tenant, me, self.threads)

    def _locked(self, take: Any) -> int:
        """`take()` (which reads the picture and records the tag) under the lane's advisory lock."""
        from migration_pipeline.fair_lane import LANE_LOCK

        with self.db.connection() as conn:
            conn.sql("SELECT pg_advisory_lock(%s, %s)", LANE_LOCK)
            try:
                return take()
            finally:
                conn.sql("SELECT pg_advisory_unlock(%s, %s)", LANE_LOCK)

    # -- taking, growing, giving back

    def acquire(self) -> None:
        """Before the op's own thread drains: take this run's slots, waiting (tag 0) while the lane
        has none free for it; then start the extra threads. Stops waiting when the phase closed or
        the engine run is no longer running (the drain that follows finds out why). A run alone in
        the lane whose tag says all its threads takes them as they are (see the class docstring)."""

        def take() -> int:
            n = self._slots_now()
            self.record(n)
            return n

        if self.holds_all() and self.alone():
            self.allowance = self.threads  # held already, and nobody else to give way to
        else:
            self.allowance = self._take(take)
        self.record(max(self.allowance, self.live()))
        self.next_refresh = time.monotonic() + LANE_REFRESH_SECONDS  # just read
        self._grow()
        if self.allowance > 1:
            self.context.log.info(f"draining phase {self.phase + 1} with {self.allowance} lane threads "
                                  f"({LAUNCH_THREADS_ENV}={self.threads})")

    def _take(self, take: Any) -> int:
        """`take` under the lane lock until it gives a slot or more (waiting, tag 0, while it gives
        none); 1 when the picture cannot be read, the phase closed or the engine run stops."""
        announced = False
        while True:
            try:
                n = self._locked(take)
            except Exception:  # noqa: BLE001 - no picture: drain in the run's own slot, as a run always could
                self.context.log.exception("could not read the lane's picture; draining this phase in one thread")
                return 1
            if n >= 1:
                return n
            run = runs.get_run(self.db, self.run_id)
            if run.status != "running" or run.cancel_requested or run.current_phase > self.phase:
                return 1
            if not announced:
                self.context.log.info(f"waiting for a lane slot: the lane's {self.settings.lane_width} slots are "
                                      "held by other runs or beyond this tenant's fair share")
                announced = True
            time.sleep(LANE_WAIT_SECONDS)

    def poll(self) -> None:
        """On the op's main thread, every 0.25 s: the tag follows threads that gave their slot back;
        every LANE_REFRESH_SECONDS the allowance is read again and threads start up to it (unless
        the op holds all its threads and is alone in the lane: nothing to read then)."""
        if self.threads > 1 and not self.finished and time.monotonic() >= self.next_refresh:
            self.next_refresh = time.monotonic() + LANE_REFRESH_SECONDS
            if not (self.allowance >= self.threads and self.alone()):
                self.refresh()
                return
        self.record(max(self.allowance, self.live()))

    def refresh(self) -> int:
        """Read the allowance again (the op's own slot is never given back); record it; start threads
        up to it. Returns the allowance."""

        def take() -> int:
            n = max(1, self._slots_now())
            self.record(max(n, self.live()))
            return n

        try:
            self.allowance = self._locked(take)
        except Exception:  # noqa: BLE001 - no picture, no extra threads; the phase goes on in one
            self.context.log.exception("could not read the lane's picture; draining this phase in one thread")
            self.allowance = 1
        self._grow()
        return self.allowance

    def _grow(self) -> None:
        if self.cancel.is_set() or self.finished:
            return
        for i in range(1, self.allowance):
            done = self.extra.get(i)
            if done is not None and not done.is_set():
                continue
            if self.pool is None:
                self.pool = lanes_pool(self.db, self.threads)
            done = threading.Event()
            self.extra[i] = done
            threading.Thread(target=self._lane, args=(i, done), name=f"launch-lane-{self.run_id}-{i}",
                             daemon=True).start()

    def _lane(self, i: int, done: threading.Event) -> None:
        try:
            worker = Worker(self.pool, settings=self.settings, providers=self.providers, cancel=self.cancel)
            while not self.cancel.is_set() and i < self.allowance:  # beyond the allowance: give the slot back
                # one task per drain: the allowance is looked at between tasks; a drain that ends
                # otherwise found the phase closed (or the run no longer running)
                r = worker.drain(self.run_id, until_phase_closed=self.phase, max_tasks=1)
                self.executed += sum(r.executed.values())
                if r.reason != "max_tasks":
                    self.finished = True
                    break
        except BaseException as e:  # surfaced by stop()
            self.errors.append(e)
            self.finished = True
        finally:
            done.set()

    def stop(self, grace: float, raise_errors: bool = True) -> None:
        """No new claims; wait up to `grace` seconds for the threads (a running task ends at its next
        stop point); record the threads still draining (1 once they stopped: the run's own slot) -
        unless the phase ended normally (`raise_errors`) with every thread stopped and the run alone
        in the lane, where the tag is kept for the next phase op (see the class docstring); raise
        the first error a thread met (unless `raise_errors` is false)."""
        self.cancel.set()
        stopped = all([done.wait(grace) for done in self.extra.values()])
        if not stopped:
            self.context.log.warning(f"a lane thread did not reach a stop point in {grace:.0f} s; the reaper releases "
                                     "its task once its lock is stale")
        keep = raise_errors and stopped and not self.errors and self.holds_all() and self.alone()
        if not keep:
            try:
                self.record(self.live())
            except Exception:  # noqa: BLE001 - the run's end drops it from the lane anyway
                self.context.log.exception("could not record the lane threads this run holds")
        if self.errors and raise_errors:
            raise self.errors[0]


def planned_after(context: AssetExecutionContext, spec: PhaseSpec, run: Run) -> list[PhaseSpec]:
    """The phases after `spec` that are in the engine run's plan and have a step in this Dagster
    run (its asset selection; None or empty: every phase of the job)."""
    selection = context.run.asset_selection or None  # materialize() leaves it empty: every asset
    return [later for later in phase_specs(spec.source)[spec.index + 1:]
            if later.run_phase(run) is not None and (selection is None or later.key in selection)]


def not_in_plan(context: AssetExecutionContext, spec: PhaseSpec, run: Run) -> MaterializeResult | None:
    """A phase the engine run does not plan (a run limited to some kinds) claims no success
    (issue 10: every phase went green). It is not materialised - the partition keeps its last real
    materialisation, or stays missing - unless a later phase of this Dagster run is planned: Dagster
    skips every step downstream of an output that was not yielded (`ActiveExecution._should_skip_step`;
    `AssetSpec.skippable`: "causing downstream dependencies to skip"), so there the phase yields a
    materialisation that says `phase_status: not in this run's plan` and carries no counts."""
    what = f"phase {spec.index + 1} ({', '.join(spec.kinds)}) is not in {run.name}'s plan ({', '.join(run.kinds)})"
    later = planned_after(context, spec, run)
    if not later:
        context.log.info(f"{what}: not materialised")
        return None
    context.log.info(f"{what}: materialised as not planned, for {later[0].key.to_user_string()} after it to run")
    return MaterializeResult(metadata={
        "phase_status": MetadataValue.text("not in this run's plan"),
        "engine_run": MetadataValue.text(run.name),
        "engine_run_id": MetadataValue.int(run.id),
        "note": MetadataValue.text(
            f"{', '.join(spec.kinds)} not in this run's plan: nothing migrated. Materialised only because "
            f"{later[0].key.to_user_string()} after it is planned (Dagster skips every step after a phase "
            "that is not materialised)"),
    })


def materialize_phase(
    context: AssetExecutionContext,
    spec: PhaseSpec,
    database: MigrationDatabase,
    source: SourceResource,
    lane: LaneSettings,
    new_run: NewRunOptions,
    on_closed: Any = None,
) -> MaterializeResult | None:
    """The phase op's body (see the module docstring); `on_closed()`, when given, is called once the
    phase is seen closed, before its rollup is read (the op starts its checks there). A terminate
    landing anywhere in it stops the engine run (`stop_after_termination`); when the Dagster run was asked to terminate, the step
    ends with a one-line Failure ("stopped by a terminate request; relaunch resumes engine run N")
    instead of DagsterExecutionInterruptedError's stack trace, and the run still ends CANCELED
    (a CANCELING run whose steps failed ends CANCELED). Any other interrupt is re-raised."""
    db = database.database()
    attached: list[Run] = []
    try:
        return _materialize_phase(context, spec, db, source, lane, new_run, attached, on_closed)
    except Exception:
        raise
    except BaseException as e:
        run = stop_after_termination(context, db, source.source, attached[-1] if attached else None)
        if isinstance(e, (DagsterExecutionInterruptedError, KeyboardInterrupt)):
            with hold_interrupts():
                requested = terminate_requested(context)
            if requested:
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
        return not_in_plan(context, spec, run)
    run = prepare_run(context, db, source, run, lane, run_tags)
    attached.append(run)
    if run.status == "running" and run.current_phase < phase:
        context.log.info(f"the barrier of {run.name} is at phase {run.current_phase + 1}; "
                         f"draining it until phase {phase + 1} ({', '.join(spec.kinds)}) closes")
    settings = lane.engine_settings()
    reporter = PhaseReporter(context, spec, db, run.id, phase, account=run.source_account, source=run.source)
    extra = LaunchLanes(context, db, run.id, phase, settings, source.providers(), launch_threads(settings), run_tags)
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
    extra.stop(lane.stop_grace_seconds)
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
    if on_closed is not None:
        on_closed()
    if reporter.reports:
        reporter.tick()  # the closing figures, so the plot ends at the phase's end
    r = rollups.rollup(db, run.id)
    metadata = phase_metadata(db, r, phase)
    failed_tasks = int(metadata["failed_tasks"].value)  # the phase's summary, as phase_metadata read it
    if failed_tasks:
        raise Failure(
            description=(f"phase {phase + 1} ({', '.join(spec.kinds)}) of {run.name} closed with "
                         f"{failed_tasks} failed task(s); the engine run failed at this phase. Fix the cause, "
                         f"then rerun the partition (re-execute from failure, or backfill failed partitions) "
                         f"to retry.\n\n" + metadata["reasons"].value),
            metadata=metadata,
            allow_retries=False,
        )
    return MaterializeResult(metadata=metadata)


def _phase_asset(spec: PhaseSpec, upstream: AssetKey | None) -> AssetsDefinition:
    """The phase's asset, with its three ledger checks (checks.ledger_check_specs) evaluated in the
    same op: their queries start when the phase is seen closed, their results follow the
    materialisation. One step per phase, not two (issue 11: a separate checks step per phase - its
    own start and success events, inputs' data versions, the partition lookups - was ~0.1 s a phase
    of a small account's `migrate run`). The op is subsettable: a run that selects only some of the
    checks on a tenant partition evaluates those and drains nothing (without a partition - the
    checks tab's "Execute" sends none - or on a tenant with no run of the source, the step fails in
    one line saying so); a run of the asset
    without its checks evaluates none."""
    from migration_pipeline.assets.checks import (  # it imports this module
        evaluate_ledger_checks, ledger_check_specs, require_run, require_tenant)

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
        require_tenant(context)
        checks = {k.name for k in context.selected_asset_check_keys}
        if spec.key not in context.selected_asset_keys:
            require_run(database.database(), context.partition_key, spec)
            yield from evaluate_ledger_checks(database.database(), context.partition_key, spec, checks)
            return
        # The checks' queries (their own snapshot of the phase, read-only) start on a thread as soon as
        # the phase is seen closed, while the op reads the rollup and Dagster records the
        # materialisation; their results are yielded after it, so their evaluations name it as the
        # one they checked. A phase that fails (failed tasks) yields no evaluations, as before.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"checks-{spec.index + 1}") as aside:
            started = []

            def start_checks() -> None:
                started.append(aside.submit(evaluate_ledger_checks, database.database(), context.partition_key, spec,
                                            checks))

            result = materialize_phase(context, spec, database, source, lane, new_run,
                                       on_closed=start_checks if checks else None)
            if result is None:
                return  # not materialised: nothing for the checks to check (a skipped checks step before)
            yield MaterializeResult(asset_key=spec.key, metadata=result.metadata)
            if checks:  # a phase materialised as not planned was never seen closed: checked here
                yield from (started[0].result() if started else
                            evaluate_ledger_checks(database.database(), context.partition_key, spec, checks))

    return _phase


def build_phase_assets(source: str, phases: list[list[str]] | None = None) -> list[AssetsDefinition]:
    """One asset per phase of the source's plan, each depending on the one before it."""
    built: list[AssetsDefinition] = []
    previous: AssetKey | None = None
    for spec in phase_specs(source, phases):
        built.append(_phase_asset(spec, previous))
        previous = spec.key
    return built
