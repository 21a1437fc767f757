"""The lane as Dagster sees it, in slots (lane threads), and each tenant's fair share of it.

The lane is MIGRATE_LANE_WIDTH slots; a slot is one thread draining an engine run. A Dagster run
holds the slots its tag `migration/lane_slots` says (LANE_SLOTS_TAG): a launch's phase op records
the threads it drains with (`lane.threads.LaunchLanes`: set under the lane lock before it starts
threads, lowered once a thread has given its slot back, so the tag never says fewer threads than
run), 0 while it waits for a free slot; a drainer holds 1; a launch that has not recorded its
threads yet (`migration/lane_threads`: its first phase op is attaching) holds none - it drains
nothing until it takes its slots under the lane lock; a launch between its steps holds what its
last phase op left on its tag: 1, or all its threads when that op was alone in the lane (its next
op takes the same). dagster.yaml still caps the migration runs in progress at the width (every
tenant run carries `dagster/partition`): the outer bound, in runs.

Which tenant gets a slot that frees up is decided here, from the engine's demands
(`engine_core.fairness`, shares in slots): the sensors request drainer runs only for the slots of a
tenant's share that its runs neither hold nor can take themselves (a launch's `migration/lane_threads`,
LANE_THREADS_TAG: the threads it may grow to; none while a launch has not recorded it: its phase op is starting and
may take the whole share itself); a launch's phase op takes at most its share and never
a slot another run holds (`LanePicture.slots_for`); a drainer whose tenant holds more than its share
while another tenant waits (a run queued, or a launch holding no slot), or while the lane is over its
width, gives its slot back after its current task (`LanePicture.should_give_way`).

A tenant's in-progress runs are ranked: its own launches (phase assets) first, they never give way;
then its drainers, oldest first. The drainers whose slots fall beyond the share are the ones that go.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from engine_core.config import Settings
from engine_core.db import Database
from engine_core.fairness import fair_shares, run_demands
from migration_pipeline import tags

IN_PROGRESS = [DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED,
               DagsterRunStatus.CANCELING]
QUEUED = [DagsterRunStatus.QUEUED]

LANE_SLOTS_TAG = "migration/lane_slots"  # lane threads a Dagster run drains with now (absent: 1)
LANE_THREADS_TAG = "migration/lane_threads"  # the most a launch's phase op may drain with (absent: not yet known)
LANE_SEEN_TAG = "migration/lane_seen"  # when a launch's phase op last said its slots are live (epoch seconds)
LANE_LOCK = (0x6C616E65, 1)  # pg_advisory_lock key of the engine database: one slot change at a time


def _count(value: str | None, default: int) -> int:
    return int(value) if value is not None and value.isdigit() else default


def held_by_launch(run_tags: dict[str, str], settings: Settings, now: float) -> tuple[int, int]:
    """(slots held, threads it may grow to) of a launch's Dagster run, from its tags.

    A launch whose phase op has not recorded its threads holds none (it is attaching). A launch
    whose last `migration/lane_seen` stamp (LaunchLanes writes one every stale_lock_seconds / 4
    while a phase op runs) is older than `settings.stale_lock_seconds` counts as a run between its
    steps, or a dead one: 1 slot, growing to none. The local run launcher never sees a dead run
    worker (DAGSTER_NOTES.md trap 7): without this, a launch SIGKILLed while it held the whole lane
    would keep every tenant's work waiting until someone terminated its Dagster run.
    """
    threads = _count(run_tags.get(LANE_THREADS_TAG), 0)
    if not threads:
        return 0, 0
    seen = run_tags.get(LANE_SEEN_TAG)
    try:
        stale = seen is not None and now - float(seen) > settings.stale_lock_seconds
    except ValueError:
        stale = True
    if stale:
        return 1, 1
    return _count(run_tags.get(LANE_SLOTS_TAG), 1), threads


def dagster_managed(instance: DagsterInstance, engine_run_id: int) -> bool:
    """Whether a Dagster run ever attached to this engine run (phase assets tag the runs they drive)."""
    return instance.get_runs_count(filters=RunsFilter(tags={tags.ENGINE_RUN: str(engine_run_id)})) > 0


@dataclass
class TenantSlots:
    """One tenant's part of the lane: its Dagster runs in progress (ranked), the slots each holds,
    the threads its launches may grow to, its queued runs, its demand (slots its open tasks could
    use) and its oldest run in flight."""
    tenant: str
    in_progress: list[str] = field(default_factory=list)  # Dagster run ids, ranked
    held: dict[str, int] = field(default_factory=dict)  # Dagster run id -> slots it holds
    threads: dict[str, int] = field(default_factory=dict)  # a launch's run id -> slots it may grow to
    queued: int = 0
    demand: int = 0
    since: int = 2**63  # its oldest run in flight (the run storage's insertion order)

    @property
    def busy(self) -> int:
        """Slots its runs in progress hold (threads draining, or about to)."""
        return sum(self.held.values())

    @property
    def in_flight(self) -> int:
        """Slots held, plus one per run queued for the lane."""
        return self.busy + self.queued

    @property
    def waiting_launch(self) -> bool:
        """A launch of the tenant is in progress and waits for a slot (recorded 0 slots)."""
        return any(self.held.get(run_id) == 0 for run_id, threads in self.threads.items() if threads)


@dataclass
class LanePicture:
    """The lane at one moment: its width in slots, each tenant's slots, and each tenant's fair share
    (max-min over the demands, `engine_core.fairness.fair_shares`)."""
    width: int
    tenants: dict[str, TenantSlots]
    shares: dict[str, int]

    def share(self, tenant: str) -> int:
        """The tenant's fair share of the lane, in slots (0 for a tenant without demand)."""
        return self.shares.get(tenant, 0)

    @property
    def busy(self) -> int:
        """Slots held by every run in progress."""
        return sum(s.busy for s in self.tenants.values())

    def missing(self, tenant: str) -> int:
        """Drainer runs to request for the tenant: its share less the slots its runs hold or have
        queued, less what its launches in progress will take with threads of their own (up to their
        `migration/lane_threads`). 0 while a launch of the tenant in progress has not recorded its
        threads yet (its phase op is starting: it may take the whole share itself)."""
        slots = self.tenants.get(tenant)
        if slots is None:
            return self.share(tenant)
        if any(threads == 0 for threads in slots.threads.values()):
            return 0  # a launch has not taken its slots yet: the next look sees what it took
        growth = sum(max(0, threads - slots.held.get(run_id, 1)) for run_id, threads in slots.threads.items())
        return max(0, self.share(tenant) - slots.in_flight - growth)

    def waiting(self, other_than: str | None = None) -> list[str]:
        """Tenants with a run queued for the lane, or a launch waiting for a slot, while they hold
        less than their share."""
        return [t for t, s in self.tenants.items()
                if t != other_than and (s.queued > 0 or s.waiting_launch) and s.busy < self.share(t)]

    def should_give_way(self, tenant: str, dagster_run_id: str) -> bool:
        """Whether a drainer run gives its slot back at its next task boundary: the slots its tenant's
        runs ranked before it hold, plus its own, exceed the tenant's share, and another tenant waits
        or the lane is over its width."""
        slots = self.tenants.get(tenant)
        if slots is None or dagster_run_id not in slots.in_progress:
            return False
        position = slots.in_progress.index(dagster_run_id)
        before = sum(slots.held.get(r, 1) for r in slots.in_progress[:position])
        if before + slots.held.get(dagster_run_id, 1) <= self.share(tenant):
            return False
        return self.busy > self.width or bool(self.waiting(other_than=tenant))

    def slots_for(self, tenant: str, dagster_run_id: str, threads: int) -> int:
        """Slots a launch's run may hold now, at most `threads`: its tenant's share less what the
        tenant's other runs hold or have queued, and never a slot another run holds (the lane's
        width less every other run's slots). 0: it waits for a slot."""
        slots = self.tenants.get(tenant) or TenantSlots(tenant)
        others_mine = slots.in_flight - slots.held.get(dagster_run_id, 0)
        others_all = self.busy - slots.held.get(dagster_run_id, 0)
        return max(0, min(threads, self.share(tenant) - others_mine, self.width - others_all))


def lane_picture(instance: DagsterInstance, db: Database, settings: Settings,
                 managed: Callable[[int], bool] | None = None) -> LanePicture:
    """Every tenant with a run in the lane or waiting for it, the slots each run holds, its demand,
    and the shares (in slots).

    Demand comes from the engine runs a Dagster run attached to (runs the engine's own CLI drives
    have workers of their own, outside the lane); a tenant with a Dagster run in flight but no
    claimable work yet (its first phase still starting, a phase boundary) wants one slot. One read
    of the run storage (the slots are run tags) and one count per live engine run.
    """
    managed = managed or (lambda run_id: dagster_managed(instance, run_id))
    now = time.time()
    tenants: dict[str, TenantSlots] = {}
    ranked: dict[str, list[tuple[int, int, str]]] = {}
    for record in instance.get_run_records(filters=RunsFilter(statuses=IN_PROGRESS + QUEUED)):
        run = record.dagster_run
        tenant = run.tags.get(tags.PARTITION)
        if not tenant:
            continue
        slots = tenants.setdefault(tenant, TenantSlots(tenant))
        created = record.storage_id  # creation order; timestamps may tie within a second
        slots.since = min(slots.since, created)
        if run.status == DagsterRunStatus.QUEUED:
            slots.queued += 1
            continue
        helper = 1 if run.tags.get(tags.ROLE) == tags.DRAINER else 0
        ranked.setdefault(tenant, []).append((helper, created, run.run_id))
        if helper:
            slots.held[run.run_id] = 1
        else:
            # a launch whose phase op has not recorded its threads is starting (attach, prepare): it
            # drains nothing yet, and takes its slots under the lane lock when it does
            slots.held[run.run_id], slots.threads[run.run_id] = held_by_launch(run.tags, settings, now)
    for tenant, runs_ in ranked.items():
        tenants[tenant].in_progress = [run_id for _, _, run_id in sorted(runs_)]
    for demand in run_demands(db, settings):
        slots = demand.slots(settings.lane_width)
        if slots == 0 or not managed(demand.run_id):
            continue
        entry = tenants.setdefault(demand.tenant_id, TenantSlots(demand.tenant_id))
        entry.demand = max(entry.demand, slots)
    for slots in tenants.values():
        if slots.in_flight or slots.in_progress:
            slots.demand = max(slots.demand, 1)
    # who already holds slots keeps a remainder (no churn); then who has waited longest
    order = sorted(tenants, key=lambda t: (-tenants[t].busy, tenants[t].since, t))
    shares = fair_shares({t: s.demand for t, s in tenants.items()}, settings.lane_width, order)
    return LanePicture(settings.lane_width, tenants, shares)
