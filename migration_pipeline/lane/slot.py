"""One lane slot: a Dagster run draining an engine run on a worker thread, stoppable by termination.

Terminating a Dagster run raises `DagsterExecutionInterruptedError` (a BaseException) in the main
thread only (DAGSTER_NOTES.md trap 6). So the engine's Worker drains on a thread of its own while
the main thread waits; on an interrupt the main thread sets the worker's cancel Event (no new
claims; a running task stops at its next stop point, keeping its checkpoint), sets the engine's
stop flag (every other worker of the run stops too, pending tasks are cancelled), waits briefly
for the thread, and re-raises. Launching the partition again resumes.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from engine_core import reaper, runs, runs_reads
from engine_core.config import Settings
from engine_core.db import Database
from engine_core.models import Run
from engine_core.topup import top_up
from engine_core.source import Provider
from engine_core.worker import DrainResult, Worker
from migration_pipeline.lane.terminate import hold_interrupts

log = logging.getLogger(__name__)


# How often (as a fraction of MIGRATE_STALE_LOCK_SECONDS) a draining slot releases its run's stale tasks.
RELEASE_EVERY = 6


def claimable(db: Database, run_id: int, settings: Settings) -> bool:
    """Whether the run has a task a worker could claim now: an enqueued pending task, or a pending
    one the lane's top-up enqueues (`topup.top_up`). False when every open task is held by
    another worker (running) - a slot that waits on them holds the lane for nothing."""
    counts = runs_reads.open_task_counts(db, run_id)
    if counts.get("enqueued"):
        return True
    if counts.get("pending"):
        top_up(db, run_id, settings)
        counts = runs_reads.open_task_counts(db, run_id)
        return bool(counts.get("enqueued"))
    return not counts.get("running")  # nothing open at all: let the worker close the phase


def drain_in_slot(
    db: Database,
    run_id: int,
    *,
    settings: Settings,
    providers: Callable[[Run], Provider],
    until_phase_closed: int | None = None,
    turn_seconds: float | None = None,
    give_way: Callable[[], bool] | None = None,
    stop_grace_seconds: float = 20.0,
    worker_id: str | None = None,
    logger: logging.Logger | None = None,
    on_tick: Callable[[], None] | None = None,
    tick_seconds: float = 5.0,
    on_poll: Callable[[], None] | None = None,
) -> DrainResult:
    """Drain `run_id` on one worker thread until its phase closes (or the turn ends at a task boundary).

    `give_way`, asked before every claim, ends the turn early ("gave_way") when it says so: a helper
    slot handing the lane to another tenant that is waiting for it.

    `on_tick` is called on the calling (main) thread every `tick_seconds` while the worker drains:
    the phase op's progress reports (Dagster's log and events belong to that thread). An exception
    from it is logged and does not stop the drain. `on_poll` is called there too, every 0.25 s (the
    launch's lane threads: their slots tag follows a thread that gave its slot back); the same.

    On termination (any BaseException that is not an Exception) the engine run is stopped.

    Work that cannot proceed does not hold the slot (after kill -9 of run workers,
    Dagster's retry runs and drainers sat idle on all the lane's slots while other tenants queued):
    * a turn-based slot (`turn_seconds`: a drainer) ends its turn ("nothing_to_claim") when the run
      has no task it could claim now - the rest are held by other workers - instead of waiting
      on them; the lane poller requests drainers again once tasks are enqueued;
    * while the slot drains, every RELEASE_EVERY-th of MIGRATE_STALE_LOCK_SECONDS it applies the
      reaper's stale-lock rule to its own run (`reaper.release_stale_of_run`), so a task a killed
      worker held is pending again MIGRATE_STALE_LOCK_SECONDS after its last lock renewal, not
      after the reaper's next tick (every 300 s, and never without a daemon).
    """
    logger = logger or log
    cancel = threading.Event()
    worker = Worker(db, settings=settings, providers=providers, cancel=cancel, worker_id=worker_id)
    box: dict[str, object] = {}
    # Waiting on an Event, not Thread.join: a join interrupted by a signal can mark a still-running
    # thread as finished (CPython's bpo-45274 handling), and the stop below would not wait for it.
    done = threading.Event()

    def lane() -> None:
        try:
            if turn_seconds is None and give_way is None:
                # nothing to look at between tasks: one drain until the phase closes (the Worker's
                # claims go no further than `until_phase_closed`), not two run reads per task
                box["result"] = worker.drain(run_id, until_phase_closed=until_phase_closed)
                return
            # One task per drain call: before each, the slot checks whether its phase has closed (the
            # Worker alone claims whatever phase the barrier is on), after each whether its turn is over.
            deadline = None if turn_seconds is None else time.monotonic() + turn_seconds
            total = DrainResult()
            while True:
                if until_phase_closed is not None and runs.get_run(db, run_id).current_phase > until_phase_closed:
                    total.reason = "phase_closed"
                    break
                if give_way is not None and give_way():
                    total.reason = "gave_way"
                    break
                if turn_seconds is not None and not claimable(db, run_id, settings):
                    total.reason = "nothing_to_claim"
                    break
                r = worker.drain(run_id, until_phase_closed=until_phase_closed, max_tasks=1)
                for outcome, n in r.executed.items():
                    total.executed[outcome] = total.executed.get(outcome, 0) + n
                total.deferred += r.deferred
                total.reason = r.reason
                if r.reason != "max_tasks":
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    total.reason = "turn_over"
                    break
            box["result"] = total
        except BaseException as e:  # handed to the main thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=lane, name=f"lane-run-{run_id}", daemon=True)
    thread.start()
    try:
        next_tick = time.monotonic() + tick_seconds
        release_every = max(0.5, settings.stale_lock_seconds / RELEASE_EVERY)
        next_release = time.monotonic() + release_every
        while not done.wait(0.25):
            if on_poll is not None:
                try:
                    on_poll()
                except Exception:  # the lane's bookkeeping must not stop the migration
                    logger.exception("lane poll failed")
            if time.monotonic() >= next_release:
                next_release = time.monotonic() + release_every
                try:
                    reaper.release_stale_of_run(db, run_id, settings.stale_lock_seconds)
                except Exception:  # the reaper's sweep does the same later
                    logger.exception("could not release stale tasks of engine run %s", run_id)
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + tick_seconds
                try:
                    on_tick()
                except Exception:  # a report that fails must not stop the migration
                    logger.exception("progress report failed")
    except Exception:
        cancel.set()
        raise
    except BaseException:
        # Termination (DagsterExecutionInterruptedError), Ctrl-C: stop the engine run, keep progress.
        cancel.set()
        with hold_interrupts():
            try:
                stopped = runs.stop(db, run_id)
                logger.warning("terminated: stop requested for %s; tasks keep their checkpoints", stopped.name)
            except Exception:  # the re-raise below matters more
                logger.exception("could not set the stop flag of engine run %s", run_id)
            if not done.wait(stop_grace_seconds):
                logger.warning("the running task did not reach a stop point in %.0fs; the reaper releases "
                               "it once its lock is stale", stop_grace_seconds)
            try:
                runs.stop(db, run_id)  # settles the stop once our task has let go
            except Exception:
                pass
        raise
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
