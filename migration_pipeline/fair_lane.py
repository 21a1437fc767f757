"""The lane as Dagster sees it, and each tenant's fair share of it.

dagster.yaml caps the migration runs in progress at the lane width (every tenant run carries
`dagster/partition`). Which tenant gets a slot that frees up is decided here, from the engine's
demands (`engine_core.fairness`): the sensors request drainer runs only up to a tenant's share, and
a drainer whose tenant holds more than its share while another tenant waits in the run queue gives
its slot back after its current task (`LanePicture.should_give_way`).

A tenant's in-progress runs are ranked: its own launches (phase assets) first, they never give way;
then its drainers, oldest first. The drainers ranked at or beyond the share are the ones that go.
"""
from __future__ import annotations

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


def dagster_managed(instance: DagsterInstance, engine_run_id: int) -> bool:
    """Whether a Dagster run ever attached to this engine run (phase assets tag the runs they drive)."""
    return instance.get_runs_count(filters=RunsFilter(tags={tags.ENGINE_RUN: str(engine_run_id)})) > 0


@dataclass
class TenantSlots:
    tenant: str
    in_progress: list[str] = field(default_factory=list)  # Dagster run ids, ranked
    queued: int = 0
    demand: int = 0
    since: int = 2**63  # its oldest run in flight (the run storage's insertion order)

    @property
    def in_flight(self) -> int:
        return len(self.in_progress) + self.queued


@dataclass
class LanePicture:
    width: int
    tenants: dict[str, TenantSlots]
    shares: dict[str, int]

    def share(self, tenant: str) -> int:
        return self.shares.get(tenant, 0)

    def missing(self, tenant: str) -> int:
        """Drainer runs to request for the tenant: its share less its runs queued or in progress."""
        slots = self.tenants.get(tenant)
        return max(0, self.share(tenant) - (slots.in_flight if slots else 0))

    def waiting(self, other_than: str | None = None) -> list[str]:
        """Tenants with a run queued for the lane while they hold less than their share."""
        return [t for t, s in self.tenants.items()
                if t != other_than and s.queued > 0 and len(s.in_progress) < self.share(t)]

    def should_give_way(self, tenant: str, dagster_run_id: str) -> bool:
        slots = self.tenants.get(tenant)
        if slots is None or dagster_run_id not in slots.in_progress:
            return False
        return slots.in_progress.index(dagster_run_id) >= self.share(tenant) and bool(self.waiting(other_than=tenant))


def lane_picture(instance: DagsterInstance, db: Database, settings: Settings,
                 managed: Callable[[int], bool] | None = None) -> LanePicture:
    """Every tenant with a run in the lane or waiting for it, its demand, and the shares.

    Demand comes from the engine runs a Dagster run attached to (runs the engine's own CLI drives
    have workers of their own, outside the lane); a tenant with a Dagster run in flight but no
    claimable work yet (its first phase still starting, a phase boundary) wants one slot.
    """
    managed = managed or (lambda run_id: dagster_managed(instance, run_id))
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
        else:
            helper = 1 if run.tags.get(tags.ROLE) == tags.DRAINER else 0
            ranked.setdefault(tenant, []).append((helper, created, run.run_id))
    for tenant, runs_ in ranked.items():
        tenants[tenant].in_progress = [run_id for _, _, run_id in sorted(runs_)]
    for demand in run_demands(db, settings):
        slots = demand.slots(settings.lane_width)
        if slots == 0 or not managed(demand.run_id):
            continue
        entry = tenants.setdefault(demand.tenant_id, TenantSlots(demand.tenant_id))
        entry.demand = max(entry.demand, slots)
    for slots in tenants.values():
        if slots.in_flight:
            slots.demand = max(slots.demand, 1)
    # who already holds slots keeps a remainder (no churn); then who has waited longest
    order = sorted(tenants, key=lambda t: (-len(tenants[t].in_progress), tenants[t].since, t))
    shares = fair_shares({t: s.demand for t, s in tenants.items()}, settings.lane_width, order)
    return LanePicture(settings.lane_width, tenants, shares)
