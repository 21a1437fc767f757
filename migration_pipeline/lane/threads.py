"""The lane threads of a launch's phase op: its own slot and up to MIGRATE_LAUNCH_THREADS - 1 more
in the op's process, within the tenant's fair share of the lane (`lane.fair`)."""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any

from dagster import RunsFilter

from engine_core import runs
from engine_core.config import Settings, number
from engine_core.db import Database, advisory_lock
from engine_core.worker import Worker
from migration_pipeline.lane import carry, fair
from migration_pipeline.lane.fair import IN_PROGRESS, LANE_LOCK, LANE_SEEN_TAG, LANE_SLOTS_TAG, LANE_THREADS_TAG, QUEUED
from migration_pipeline.tags import RunTags

LAUNCH_THREADS_ENV = "MIGRATE_LAUNCH_THREADS"  # lane threads of a launch's phase op (see LaunchLanes)


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
    on it); a pool of their own per phase op opened and closed connections every phase.
    The run's connections stay open between phases and close with the resource."""
    pool = db.pool
    if pool not in _GROWN:
        _GROWN[pool] = pool.max_size
        pool.resize(pool.min_size, pool.max_size + 3 * max(1, threads - 1) + 2)
    return db


class LaunchLanes:
    """The lane slots of a launch's phase op: its own thread (`drain_in_slot`) and up to
    MIGRATE_LAUNCH_THREADS - 1 more in the op's process (without them a small account spent most of
    `migrate run` in one thread while drainer runs, each a process of its own, started).

    The lane counts slots (threads), not runs (`lane.fair`): before its own thread drains, the op
    takes `LanePicture.slots_for` slots - at most the tenant's fair share, never one another run
    holds - and records them on its Dagster run (`fair.LANE_SLOTS_TAG`, with the most it may
    grow to in `LANE_THREADS_TAG`), so the sensors request drainers only for slots no launch thread
    holds or will take. Taking is serialised by an advisory lock of the engine database
    (`fair.LANE_LOCK`), so two launches never both take the same free slot. When none is free
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
    (the lane picture read every second and the tags written at every phase's start and
    end were a tenth of a small `migrate run`'s steps): a run whose tag already says all its
    threads takes them without the picture; while it holds them all it does not re-read the
    picture; and at the phase's end it keeps its tag rather than lowering it to its one slot (the
    next phase op takes the same). A run arriving meanwhile is seen at the next look: the op then
    reads the picture under the lock as before, and a launch that had to wait for a slot waits at
    most until this run's next phase op starts (its share taken, the rest given) or the run ends.

    Carried (`lane.carry`): alone in the lane with all its threads, an op whose next phase op
    executes after it on the same thread (`for_step`'s `carry_to`) lets its extra threads drain
    on into that phase (`until`) while Dagster closes this step and starts the next (~0.1 s a
    phase of Dagster events on a small account, the engine idle meanwhile); `finish` leaves them
    running and the next op adopts this object, threads, pool and tags as they are."""

    def __init__(self, context: Any, db: Database, run_id: int, phase: int,
                 settings: Settings, providers: Any, threads: int, run_tags: RunTags | None = None) -> None:
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
        self.until = phase  # the engine phase the extra threads drain to (beyond `phase`: carried)
        self.carry_to: int | None = None  # the next op's phase, when it executes after this one here
        self.grace = 20.0  # how long a stop waits for the threads (the op's stop_grace_seconds)
        self._lock = threading.Lock()  # a thread's decision to end against an adoption raising `until`

    @classmethod
    def for_step(cls, context: Any, db: Database, run_id: int, phase: int, settings: Settings, providers: Any,
                 threads: int, run_tags: RunTags | None = None, carry_to: int | None = None,
                 grace: float = 20.0) -> "LaunchLanes":
        """The lanes of a phase op: those a previous op of the same Dagster run carried here
        (`carry.adopt`), now this op's (its context, phase and tags; their threads keep draining),
        or new ones. `carry_to`: the engine phase of the run's next phase op when it executes after
        this one on this thread (else None: the threads stop at this phase's end)."""
        lanes = carry.adopt(context.run_id)
        if lanes is not None and (lanes.run_id != run_id or lanes.threads != threads or lanes.db is not db):
            lanes.stop(lanes.grace, raise_errors=False)  # another engine run or pool: not this op's to drain with
            lanes = None
        if lanes is None:
            lanes = cls(context, db, run_id, phase, settings, providers, threads, run_tags)
        else:
            lanes.context, lanes.phase, lanes.settings = context, phase, settings
            lanes.run_tags = run_tags or RunTags(context)
            with lanes._lock:
                lanes.finished = False
        lanes.carry_to, lanes.grace = carry_to, grace
        return lanes

    # -- the slots tag and the lane lock

    def live(self) -> int:
        """Threads draining now, the op's own included."""
        return 1 + sum(1 for done in self.extra.values() if not done.is_set())

    def record(self, slots: int) -> None:
        """Write the run's slots tag when it changed, and its live stamp every `stamp_every` seconds
        (one write to the run storage; a stale stamp counts as a dead launch's 1 slot)."""
        wanted = (str(slots), str(self.threads))
        now = time.time()
        if wanted != self.recorded or now - self.stamped >= self.stamp_every:
            # the stamp says the slots are live (fair.held_by_launch): a dead launch's go back
            self.run_tags.add({LANE_SLOTS_TAG: wanted[0], LANE_THREADS_TAG: wanted[1], LANE_SEEN_TAG: f"{now:.0f}"})
            self.recorded, self.stamped = wanted, now

    def alone(self) -> bool:
        """Whether this is the only Dagster run in progress or queued (any job, any tenant): then
        no other run holds, takes or waits for a slot. False when it cannot be read."""
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
        tenant, me = self.context.partition_key, self.context.run_id
        picture = fair.lane_picture(self.context.instance, self.db, self.settings)
        mine = picture.tenants.get(tenant)
        if set(picture.tenants) <= {tenant} and (mine is None or (mine.in_progress in ([], [me]) and not mine.queued)):
            return min(self.threads, picture.width)
        return picture.slots_for(tenant, me, self.threads)

    def _locked(self, take: Any) -> int:
        """`take()` (which reads the picture and records the tag) under the lane's advisory lock."""
        with advisory_lock(self.db, LANE_LOCK):
            return take()

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

        fast = self.holds_all() and self.alone()
        if fast:
            self.allowance = self.threads  # held already, and nobody else to give way to
        else:
            self.allowance = self._take(take)
        carrying = (self.carry_to is not None and self.threads > 1 and carry.allowed()
                    and self.allowance >= self.threads and (fast or self.alone()))
        with self._lock:
            self.until = self.carry_to if carrying and self.carry_to is not None else self.phase
        self.record(max(self.allowance, self.live()))
        self.next_refresh = time.monotonic() + LANE_REFRESH_SECONDS  # just read
        self._grow()
        if self.allowance > 1:
            self.context.log.info(f"draining the phase with {self.allowance} lane threads "
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
                until = self.until
                r = worker.drain(self.run_id, until_phase_closed=until, max_tasks=1)
                self.executed += sum(r.executed.values())
                if r.reason != "max_tasks":
                    with self._lock:
                        if self.until == until:  # not adopted by a later op meanwhile
                            self.finished = True
                            break
        except BaseException as e:  # surfaced by stop()
            self.errors.append(e)
            self.finished = True
        finally:
            done.set()

    def finish(self, grace: float) -> bool:
        """At the end of the op's drain: True when the threads drain on into the next op's phase
        (`until` beyond this one: carried, see the class docstring) - left running, a thread's error
        raised (after stopping them all); else `stop(grace)` and False."""
        if self.until > self.phase and not self.cancel.is_set():
            if self.errors:
                self.stop(grace)  # raises the first error
            return True
        self.stop(grace)
        return False

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
