"""Running tasks: the claim-or-exit job, and the drain loop many threads or processes run at once.

Two locks answer two questions: whatever hands a worker a task id (a drainer, a sensor, a retry)
decides who runs; the fenced claim decides whether there is any work left to do.
"""
from __future__ import annotations

import gc
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from psycopg.types.json import Jsonb

from engine_core import claim
from engine_core.config import Settings
from engine_core.context import TaskContext
from engine_core.db import Conn, Database
from engine_core.errors import LockLost, PageFailed, RateLimitParked, SourceMismatch, TaskStopped, TransientError
from engine_core.models import Run, Stats, Task, TaskOutcome
from engine_core import statistics
from engine_core.barrier import advance_phase
from engine_core.topup import WORK, insert_tasks, top_up, top_up_in
from engine_core.source import Provider, ProviderResolver, identity_of, ledger_lists
from engine_core.runlog import RunLog, failure_reason

log = logging.getLogger(__name__)



# Objects allocated (less freed) before CPython's young collection runs: 700 by default. A
# worker allocates tens of thousands per page (rows, their JSON, mapped values), nearly all freed by
# reference counting; at 700 a small entity run made ~290 collections (1 in 10 a middle one, a
# few full ones scanning the whole process), at 10,000 ~14, and the process's CPU fell ~8% (2.67 ->
# 2.46 CPU-s, interleaved A/B of 6 runs). With orjson and 500-row windows: 2.6-2.9 CPU-s
# at 700, 2.37 at 10,000, 2.25 at 50,000 (gc.callbacks, two runs each).
YOUNG_COLLECTION_THRESHOLD = 50_000


def collector_for_draining() -> None:
    """Raise the cyclic collector's young threshold of this process to YOUNG_COLLECTION_THRESHOLD
    (never lower it, nor turn automatic collection back on: 0 stays 0; the older generations'
    thresholds are kept); idempotent. Called by every `Worker`: a process that drains tasks spends
    its time allocating short-lived objects.
    Cycles are still collected, at most 50,000 container allocations later."""
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_COLLECTION_THRESHOLD:
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)


def default_worker_id() -> str:
    """This worker's name in `locked_by`: host, pid and a short random part (at most 100
    characters), so two workers of one process differ."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"[:100]


@dataclass
class DrainResult:
    """What one drain did: tasks executed by outcome, how often it deferred under database
    pressure, and why it stopped ("idle", "phase_closed", "max_tasks", a run status, ...)."""
    executed: dict[str, int] = field(default_factory=dict)
    deferred: int = 0
    reason: str = ""

    def count(self, outcome: str) -> None:
        """Count one executed task's outcome."""
        self.executed[outcome] = self.executed.get(outcome, 0) + 1


class Worker:
    """Runs tasks: the claim-or-exit job (`execute`), and the drain loop that claims a run's tasks
    until none is left (`drain`). `providers` builds a run's provider (the composition
    root's choice); the worker refuses a run whose provider reaches another source than the
    run reads (SourceMismatch)."""
    def __init__(
        self,
        db: Database,
        *,
        providers: ProviderResolver,
        settings: Settings | None = None,
        worker_id: str | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.db = db
        self.settings = settings or Settings.from_env()
        self.providers = providers
        self.worker_id = worker_id or default_worker_id()
        self.cancel = cancel or threading.Event()
        self._last_heartbeat = 0.0
        self._refilled: set[int] = set()  # tasks whose finish refilled the lane (`_finish_tx`)
        self._provider_cache: dict[int, Provider] = {}
        collector_for_draining()

    # -- the seed's TaskJob.perform ------------------------------------------------------------
    def execute(self, task_id: int) -> str:
        """Claim one task by id and run it, or exit doing nothing if someone else has it."""
        row = self.db.fetch_one("get_task", {"task_id": task_id})
        if row is None:
            return "missing"
        run_row = self.db.fetch_one("get_run", {"run_id": row["migration_id"]})
        run = Run.from_row(run_row)  # type: ignore[arg-type]
        if run.terminal:
            return "terminal"
        if run.cancel_requested:
            return "stopping"
        if claim.pressure_high(self.db, self.settings):
            return "deferred"  # not claimed: the task stays honestly pending
        self.provider(run)  # a worker reaching another source refuses before it claims
        task = claim.claim(self.db, task_id, self.worker_id)
        if task is None:
            return "lost"
        return self.run_claimed(task, run)

    # -- claim and run --------------------------------------------------------------------
    def provider(self, run: Run) -> Provider:
        """The run's provider, as this worker's settings build it - refused (`SourceMismatch`) when
        those settings reach another source (another Pipedrive company) than the run reads. A
        rotated token of the same company passes; a source that cannot say now is left to the tasks."""
        p = self._provider_cache.get(run.id)
        if p is None:
            p = self.providers(run)
            identity = identity_of(p, db=self.db)
            if identity is not None:
                bound = run.source_identity
                if bound is None:
                    row = self.db.fetch_one("bind_source_identity", {"run_id": run.id, "identity": identity})
                    bound = row["source_identity"] if row else identity
                if bound != identity:
                    raise SourceMismatch(run.name, bound, identity)
            self._provider_cache[run.id] = p
        return p

    def run_claimed(self, task: Task, run: Run) -> str:
        """Run a task this worker has claimed and settle it; returns the outcome ("succeeded",
        "failed", "released", "parked", "cancelled" or "lost").

        A lock keeper keeps the task's lock fresh while it runs, whatever the provider waits on.
        A task that stops early is cancelled only when its run is being stopped; a worker that is
        merely shutting down (its cancel Event set: a sibling lane died, the process is terminated)
        releases it with its checkpoint and the attempt refunded. An error while settling
        propagates and leaves the task running for the reaper."""
        provider = self.provider(run)
        runlog = RunLog(run.id, task.id, cap=self.settings.log_cap)
        ctx = TaskContext(
            db=self.db, run=run, task=task, worker=self.worker_id, settings=self.settings, log=runlog,
            cancel=self.cancel, stats=Stats(dict(task.stats)), offset=task.processed_offset,
            lists=ledger_lists(provider),
        )
        keeper = claim.LockKeeper.for_task(self.db, task.id, self.worker_id, self.settings, ctx.lock_lost)
        try:
            result = self._run_and_settle(ctx, task, provider)
        finally:
            keeper.stop()
        topped_up = task.id in self._refilled
        self._refilled.discard(task.id)
        self._after(run, task, provider, topped_up=topped_up)
        return result

    def _run_and_settle(self, ctx: TaskContext, task: Task, provider: Provider) -> str:
        outcome: TaskOutcome | None = None
        try:
            outcome = provider.run_task(ctx)
            result = self._finish(ctx, "succeeded", None, outcome)
        except TaskStopped:
            result = self._stopped(ctx)
        except LockLost:
            log.warning("task %s: lock lost (released as stale); its last window rolled back", task.id)
            return "lost"
        except RateLimitParked as e:
            until = datetime.now(timezone.utc) + timedelta(seconds=max(0.0, e.wait_seconds))
            result = self._settle(ctx, "release_task", {"error": failure_reason(e), "not_before": until, "refund": 1}, "parked")
        except TransientError as e:
            if task.attempts >= self.settings.max_attempts:
                result = self._finish(ctx, "failed", f"gave up after {task.attempts} attempts: {failure_reason(e)}", None)
            else:
                wait = min(self.settings.retry_backoff_seconds * (2 ** (task.attempts - 1)), 300.0)
                until = datetime.now(timezone.utc) + timedelta(seconds=wait)
                result = self._settle(ctx, "release_task", {"error": failure_reason(e), "not_before": until, "refund": 0}, "released")
        except PageFailed as e:
            result = self._finish(ctx, "failed", failure_reason(e), None)
        except Exception as e:  # a task that cannot do its work fails with its reason
            log.exception("task %s (%s) failed", task.id, task.kind)
            result = self._finish(ctx, "failed", failure_reason(e), None)
        return result

    def _stopped(self, ctx: TaskContext) -> str:
        """Settle a task that stopped before finishing. The run is read again: only a stop of the run
        (`cancel_requested`) cancels the task; anything else - this worker shutting down, a sibling
        lane that crashed, a terminated step - releases it to pending with its cursor, offset and
        stats as last checkpointed and the attempt refunded, for any drainer to resume."""
        if ctx.lock_lost.is_set():
            log.warning("task %s: lock lost (released as stale) while it waited; left to its new holder", ctx.task.id)
            return "lost"
        current = self.db.fetch_one("get_run", {"run_id": ctx.run.id})
        if current is not None and current["cancel_requested"]:
            with self.db.transaction() as tx:
                stopping = self._stopping_locked(tx, ctx.run.id)
                # fenced on the run's stop flag as well: a resume that cleared it meanwhile wins
                if tx.execute("cancel_running_task", {"task_id": ctx.task.id, "worker": self.worker_id,
                                                      "stats": Jsonb(ctx.stats.values)}) == 1:
                    ctx.log.flush(tx)
                    self._settle_stop(tx, ctx.run.id, stopping)
                    return "cancelled"
        return self._settle(
            ctx, "release_task",
            {"error": "released: its worker stopped before the task finished (not a failure)",
             "not_before": None, "refund": 1},
            "released",
        )

    def _settle(self, ctx: TaskContext, query: str, params: dict, result: str) -> str:
        with self.db.transaction() as tx:
            stopping = self._stopping_locked(tx, ctx.run.id)
            n = tx.execute(query, {"task_id": ctx.task.id, "worker": self.worker_id, **params})
            if n != 1:
                return "lost"
            ctx.log.flush(tx)
            self._settle_stop(tx, ctx.run.id, stopping)
        return result

    @staticmethod
    def _stopping_locked(tx: Conn, run_id: int) -> bool:
        """First in a transaction that ends a task: whether the run is stopping, its row then locked
        (`lock_stopping_run`) so the stop can settle in the same commit (`_settle_stop`)."""
        return tx.fetch_one("lock_stopping_run", {"run_id": run_id}) is not None

    @staticmethod
    def _settle_stop(tx: Conn, run_id: int, stopping: bool) -> None:
        """A stopping run whose last running task this transaction ends is `stopped` in the same
        commit. Settled after it (`_after`), a worker gone in between - its process exiting while
        its thread stopped, kill -9 - left the run `stopping` with nothing running, and every launch
        then joined a run nobody drove."""
        if stopping:
            tx.fetch_one("settle_stop", {"run_id": run_id})

    def _finish(self, ctx: TaskContext, status: str, error: str | None, outcome: TaskOutcome | None) -> str:
        """Successors, the final status and the task's log entries commit together."""
        try:
            return self._finish_tx(ctx, status, error, outcome)
        except _Abandon:
            return "lost"

    def _finish_tx(self, ctx: TaskContext, status: str, error: str | None, outcome: TaskOutcome | None) -> str:
        """The successors, the task's status, its log entries and the lane's refill (`top_up_in`:
        the finished task's slot and its successors go on the lane in the same commit)
        in one transaction."""
        enqueued: list[int] = []
        with self.db.transaction() as tx:
            stopping = self._stopping_locked(tx, ctx.run.id)
            if outcome is not None and outcome.successors:
                insert_tasks(tx, ctx.run, ctx.task.phase, ctx.task.kind, outcome.successors)
            row = tx.fetch_one(
                "finish_task",
                {"task_id": ctx.task.id, "worker": self.worker_id, "status": status,
                 "stats": Jsonb(ctx.stats.values), "error": error},
            )
            if row is None:
                raise _Abandon()
            if error:
                ctx.log.note("error", ctx.task.kind, error, subject=f"task {ctx.task.id}")
            ctx.log.flush(tx)
            enqueued = top_up_in(tx, ctx.run.id, self.settings)
            self._settle_stop(tx, ctx.run.id, stopping)
        self._refilled.add(ctx.task.id)
        # committed: as many idle lanes may claim them now (an idle lane takes a page's successor
        # while this one does its bookkeeping: `_after`)
        WORK.announce(ctx.run.id, len(enqueued))
        return status

    def _after(self, run: Run, task: Task, provider: Provider, *, topped_up: bool = False) -> None:
        """What a settled task always does: heartbeat, settle a stop, refill the lane, try the barrier.

        One statement (`after_task`) beats the heartbeat, reads the stop flag and counts the
        phase's open tasks; the barrier is tried only when none is open (the last finisher, which
        reads after its own commit, always sees 0). `topped_up`: the task's finish refilled the
        lane in its own transaction already."""
        self._last_heartbeat = time.monotonic()
        current = self.db.fetch_one("after_task", {"run_id": run.id, "phase": task.phase,
                                                   "interval": self.settings.heartbeat_seconds})
        if current and current["cancel_requested"]:
            self.db.execute("cancel_pending_tasks", {"run_id": run.id})
            self.db.fetch_one("settle_stop", {"run_id": run.id})
            return
        if not topped_up:
            top_up(self.db, run.id, self.settings)
        if current is None or current["phase_open"] == 0:
            advance_phase(self.db, run.id, task.phase, provider, self.settings, background_statistics=True)
        else:
            statistics.after_advance(self.db, closed=False)  # the growth check advance_phase makes

    def heartbeat(self, run_id: int, force: bool = False) -> None:
        """Mark the run alive (its heartbeat column), at most every `heartbeat_seconds` unless
        `force`."""
        now = time.monotonic()
        if force or now - self._last_heartbeat >= self.settings.heartbeat_seconds:
            self._last_heartbeat = now
            self.db.execute("heartbeat_run", {"run_id": run_id, "interval": self.settings.heartbeat_seconds})

    # -- the drain loop -------------------------------------------------------------------
    def drain(
        self,
        run_id: int,
        *,
        until_phase_closed: int | None = None,
        poll_seconds: float = 0.2,
        max_tasks: int | None = None,
    ) -> DrainResult:
        """Claim and run the run's tasks until nothing is left to claim (or its phase closes).

        Waits while other workers still hold tasks, since they may seed successors or the next phase.
        """
        result = DrainResult()
        row = self.db.fetch_one("get_run", {"run_id": run_id})
        if row is None:
            result.reason = "missing"
            return result
        self.provider(Run.from_row(row))  # a worker reaching another source refuses before it claims
        while not self.cancel.is_set():
            if max_tasks is not None and sum(result.executed.values()) >= max_tasks:
                result.reason = "max_tasks"
                break
            if claim.pressure_high(self.db, self.settings):
                result.deferred += 1
                self.cancel.wait(min(5.0, poll_seconds * (2 ** min(result.deferred, 5))))
                continue
            seen = WORK.generation()  # before looking: an enqueue after this wakes the wait below
            claimed = claim.claim_next(self.db, run_id, self.worker_id, max_phase=until_phase_closed)
            if claimed is not None:
                result.count(self.run_claimed(*claimed))
                continue
            WORK.looked_empty(run_id, seen)
            row = self.db.fetch_one("drain_look", {"run_id": run_id})  # the run and its counts
            if row is None:
                result.reason = "missing"
                break
            run = Run.from_row(row)
            if run.status != "running":
                result.reason = run.status
                break
            if until_phase_closed is not None and run.current_phase > until_phase_closed:
                result.reason = "phase_closed"
                break
            counts = row
            if not counts.get("pending") and not counts.get("running"):
                # nothing left: close whatever phase is open (a crashed winner, an empty phase)
                if not advance_phase(self.db, run_id, run.current_phase, self.provider(run), self.settings):
                    result.reason = "idle"
                    break
                continue
            if counts.get("pending") and not counts.get("enqueued"):
                top_up(self.db, run_id, self.settings)
            self.heartbeat(run_id)
            WORK.wait(seen, poll_seconds, self.cancel, run_id)  # woken by this process's enqueues
        else:
            result.reason = "cancelled"
        return result


class _Abandon(Exception):
    """The task was taken from us (released as stale) before we could finish it."""


def drain_threads(
    db: Database,
    run_id: int,
    *,
    width: int,
    providers: ProviderResolver,
    settings: Settings | None = None,
    cancel: threading.Event | None = None,
    until_phase_closed: int | None = None,
) -> list[DrainResult]:
    """The lane in one process: `width` threads draining one run."""
    cancel = cancel or threading.Event()
    results: list[DrainResult] = [DrainResult() for _ in range(width)]
    errors: list[BaseException] = []

    def lane(i: int) -> None:
        try:
            w = Worker(db, settings=settings, providers=providers, cancel=cancel)
            results[i] = w.drain(run_id, until_phase_closed=until_phase_closed)
        except BaseException as e:  # surfaced below
            errors.append(e)
            cancel.set()

    done = [threading.Event() for _ in range(width)]

    def run_lane(i: int) -> None:
        try:
            lane(i)
        finally:
            done[i].set()

    threads = [threading.Thread(target=run_lane, args=(i,), name=f"lane-{i}", daemon=True) for i in range(width)]
    for t in threads:
        t.start()
    try:
        # Wait on events, not Thread.join: a join interrupted by an exception in the main thread
        # (a terminated Dagster run) can mark a still-running thread as finished.
        for e in done:
            while not e.wait(0.5):
                pass
    except BaseException:
        cancel.set()
        raise
    if errors:
        raise errors[0]
    return results
