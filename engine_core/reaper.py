"""The reaper's sweeps, as plain functions over the database.

None of them decides anything the tasks do not already say: each repeats what a finishing task
would have done had its worker lived.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

from engine_core.config import Settings
from engine_core.db import Database
from engine_core.fairness import run_demands
from engine_core.models import Run
from engine_core.barrier import advance_phase
from engine_core.topup import top_up
from engine_core.source import ProviderResolver

log = logging.getLogger(__name__)


def release_stale(db: Database, threshold_seconds: float) -> list[int]:
    """Sweep 1: running tasks whose lock is older than the threshold go back to pending, cursor intact."""
    return [r["id"] for r in db.fetch_all("stale_running_tasks", {"threshold": float(threshold_seconds)})]


# Sweep 1 for one run (the same rule and effect as the named query `stale_running_tasks`): used
# where waiting for the reaper's next tick would leave work idle - a lane slot waiting on a task a
# killed worker held, a stop waiting on it to reach a stop point (`runs.stop`).
RELEASE_STALE_OF_RUN = """
UPDATE migration_tasks t
   SET status = CASE WHEN m.cancel_requested THEN 'cancelled' ELSE 'pending' END,
       locked_at = NULL, locked_by = NULL,
       error = 'released: worker lock older than ' || %(threshold)s::text || 's', updated_at = now()
  FROM migrations m
 WHERE m.id = t.migration_id AND t.migration_id = %(run_id)s AND t.status = 'running'
   AND t.locked_at < now() - make_interval(secs => %(threshold)s)
RETURNING t.id
"""


def release_stale_of_run(db: Database, run_id: int, threshold_seconds: float) -> list[int]:
    """Sweep 1 for one run: its running tasks whose lock is older than `threshold_seconds`
    (MIGRATE_STALE_LOCK_SECONDS) lost their worker - a live worker's lock keeper renews the lock
    every third of it - and go back to pending with their cursor (cancelled when the run is being
    stopped, so the stop settles). Returns the released task ids."""
    rows = db.sql(RELEASE_STALE_OF_RUN, {"run_id": run_id, "threshold": float(threshold_seconds)})
    if rows:
        log.warning("run #%s: released %d task(s) whose worker's lock was older than %.0fs (a dead worker)",
                    run_id, len(rows), threshold_seconds)
    return [r["id"] for r in rows]


# Tasks of one run held by workers of processes that are gone from this host: released now rather
# than after MIGRATE_STALE_LOCK_SECONDS (the relaunch of a tenant whose `migrate run` was kill -9'd
# sat silent for ~110 s waiting for its locks to go stale). Fenced on the
# worker id read, so a task claimed again meanwhile is left alone.
RUNNING_HERE = """
SELECT id, locked_by FROM migration_tasks
 WHERE migration_id = %(run_id)s AND status = 'running' AND locked_by LIKE %(prefix)s
"""
RELEASE_OF_WORKERS = """
UPDATE migration_tasks t
   SET status = CASE WHEN m.cancel_requested THEN 'cancelled' ELSE 'pending' END,
       locked_at = NULL, locked_by = NULL,
       error = 'released: its worker''s process (' || t.locked_by || ') is gone', updated_at = now()
  FROM migrations m
 WHERE m.id = t.migration_id AND t.migration_id = %(run_id)s AND t.status = 'running'
   AND t.id = ANY(%(ids)s) AND t.locked_by = ANY(%(workers)s)
RETURNING t.id
"""


def process_alive(pid: int) -> bool:
    """Whether a process with `pid` exists on this host (signal 0; a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_dead_here(db: Database, run_id: int) -> list[int]:
    """Release the run's running tasks whose worker (`worker.default_worker_id`: "<host>:<pid>:<n>")
    ran on this host in a process that no longer exists - killed (SIGKILL, OOM) without reaching a
    stop point. Same effect as the stale-lock release (pending with its cursor; cancelled when the
    run is being stopped), without waiting for the lock to age. A worker id of another form or of
    another host is left to the stale-lock rule; so is a pid now held by another process. Returns
    the released task ids."""
    prefix = socket.gethostname() + ":"
    held = db.sql(RUNNING_HERE, {"run_id": run_id, "prefix": prefix.replace("%", r"\%").replace("_", r"\_") + "%"})
    dead: dict[int, str] = {}
    for row in held:
        try:
            pid = int(row["locked_by"][len(prefix):].split(":", 1)[0])
        except ValueError:
            continue
        if pid > 0 and not process_alive(pid):
            dead[row["id"]] = row["locked_by"]
    if not dead:
        return []
    rows = db.sql(RELEASE_OF_WORKERS, {"run_id": run_id, "ids": list(dead), "workers": sorted(set(dead.values()))})
    if rows:
        log.warning("run #%s: released %d task(s) whose worker's process is gone (%s)", run_id, len(rows),
                    ", ".join(sorted(set(dead.values()))))
    return [r["id"] for r in rows]


def rearm_orphaned_cancelled(db: Database) -> list[int]:
    """Sweep 1b: a task is cancelled only by a stop of its run. A cancelled task in a
    running run nobody stopped (left by older code that cancelled a sibling lane's task) goes back
    to pending with its cursor and offset, so it cannot hold the barrier for ever; returns their ids."""
    rows = db.fetch_all("rearm_orphaned_cancelled")
    for r in rows:
        log.warning("reaper: task %s of run #%s was cancelled though its run is not stopping; re-armed", r["id"], r["migration_id"])
    return [r["id"] for r in rows]


def refill(db: Database, settings: Settings) -> dict[int, int]:
    """Sweep 2: top every live run up to its in-flight limit; returns {run_id: claimable-now count}."""
    for row in db.fetch_all("live_runs"):
        if row["status"] == "running" and not row["cancel_requested"]:
            top_up(db, row["id"], settings)
    return {d.run_id: d.enqueued for d in run_demands(db, settings)
            if d.running < settings.lane_width and d.enqueued > 0}


def advance(db: Database, settings: Settings, providers: ProviderResolver) -> list[int]:
    """Sweep 3: phases that closed without a winner (its worker died between finish and advance)."""
    advanced = []
    for row in db.fetch_all("live_runs"):
        run = Run.from_row(row)
        if run.status != "running" or run.cancel_requested:
            continue
        try:
            provider = providers(run)
        except Exception:  # one run we cannot serve must not stop the sweep for the others
            log.exception("reaper: no provider for %s; skipped", run.name)
            continue
        if advance_phase(db, run.id, run.current_phase, provider, settings):
            advanced.append(run.id)
    return advanced


def finalize(db: Database, threshold_seconds: float) -> list[int]:
    """Sweep 4: runs whose heartbeat stopped with nothing left to do get their terminal status."""
    done = []
    for row in db.fetch_all("live_runs"):
        # a stop settles as soon as nothing of the run is running (no heartbeat wait needed)
        if row["status"] == "stopping" and db.fetch_one("settle_stop", {"run_id": row["id"]}):
            done.append(row["id"])
    for row in db.fetch_all("runs_needing_finalize", {"threshold": float(threshold_seconds)}):
        if row["status"] == "stopping":
            settled = db.fetch_one("settle_stop", {"run_id": row["id"]})
        else:
            settled = db.fetch_one("finalize_run", {"run_id": row["id"]})
        if settled:
            done.append(row["id"])
    return done


@dataclass
class SweepReport:
    """What one sweep did: tasks released (stale locks), cancelled tasks re-armed, runs whose phase
    it advanced, runs it finalised, and runs whose lane it refilled with how many tasks."""
    released: list[int] = field(default_factory=list)
    rearmed: list[int] = field(default_factory=list)
    advanced: list[int] = field(default_factory=list)
    finalized: list[int] = field(default_factory=list)
    below_width: dict[int, int] = field(default_factory=dict)

    @property
    def quiet(self) -> bool:
        """True when the sweep changed nothing (a refill alone does not count)."""
        return not (self.released or self.rearmed or self.advanced or self.finalized)


def sweep(db: Database, settings: Settings | None, providers: ProviderResolver) -> SweepReport:
    """All sweeps, in the order that lets one tick repair a dead worker end to end."""
    settings = settings or Settings.from_env()
    report = SweepReport()
    report.released = release_stale(db, settings.stale_lock_seconds)
    report.rearmed = rearm_orphaned_cancelled(db)
    report.advanced = advance(db, settings, providers)
    report.below_width = refill(db, settings)
    report.finalized = finalize(db, settings.stale_lock_seconds)
    return report
