"""How the lane's slots are shared between runs that want them.

The lane is a fixed number of workers (MIGRATE_LANE_WIDTH) shared by every tenant's run. What a run
can use at once is what its in-flight pool holds: its tasks enqueued or running, which the engine
caps at MAX_INFLIGHT (twice the width) and tops up as tasks finish. So a run's *demand* is that pool,
capped at the width, and the slots are split max-min fairly over the demands: handed out one at a
time, round robin, each tenant taking one while it still wants more. Two tenants that both want the
whole lane get half each; a tenant that wants one slot gets it and the rest goes to the others.

Nothing here knows who launches the workers (Dagster runs, threads); the face asks for the shares,
requests workers up to them, and workers beyond their tenant's share give their slot back at a task
boundary while another tenant waits.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine_core.config import Settings
from engine_core.db import Database


def fair_shares(demands: Mapping[str, int], width: int, order: Iterable[str] | None = None) -> dict[str, int]:
    """Split `width` slots max-min fairly over `demands` (tenant -> slots it can use).

    Slots are dealt one at a time in `order` (default: the demands' own order), skipping tenants
    whose demand is met, so the split is as even as the demands allow and a remainder goes to the
    tenants earliest in `order`. Every tenant of `demands` is in the result; the shares never exceed
    the demands, and their sum is min(width, sum of demands).
    """
    if width < 0:
        raise ValueError(f"lane width must not be negative, got {width}")
    for tenant, demand in demands.items():
        if demand < 0:
            raise ValueError(f"demand of {tenant!r} must not be negative, got {demand}")
    ordered = list(dict.fromkeys(order)) if order is not None else list(demands)
    ordered = [t for t in ordered if t in demands] + [t for t in demands if t not in ordered]
    shares = {t: 0 for t in demands}
    left = width
    wanting = [t for t in ordered if demands[t] > 0]
    while left > 0 and wanting:
        for tenant in list(wanting):
            if left == 0:
                break
            shares[tenant] += 1
            left -= 1
            if shares[tenant] >= demands[tenant]:
                wanting.remove(tenant)
    return shares


@dataclass(frozen=True)
class RunDemand:
    """One live run's place on the shared lane: its tenant and source, and how many of its tasks
    are enqueued and running now."""
    run_id: int
    tenant_id: str
    source: str
    enqueued: int
    running: int

    def slots(self, width: int) -> int:
        """Workers this run can keep busy right now: its in-flight pool, at most the lane."""
        return min(width, self.enqueued + self.running)


def run_demands(db: Database, settings: Settings) -> list[RunDemand]:
    """The demand of every running (not stopping) run, from its in-flight pool."""
    found = []
    for row in db.fetch_all("live_runs"):
        if row["status"] != "running" or row["cancel_requested"]:
            continue
        counts = db.fetch_one("inflight_count", {"run_id": row["id"]}) or {}
        found.append(RunDemand(row["id"], row["tenant_id"], row["source"],
                               int(counts.get("enqueued") or 0), int(counts.get("running") or 0)))
    return found
