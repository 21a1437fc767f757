"""A Dagster run executed in the `migrate` process itself, as Dagster's run worker executes it,
when no daemon serves the instance and the lane has room: no daemon, code server or run worker
process to start. A watcher thread turns a signal, `migrate stop` or the UI's Terminate into the
run's stop, as a run worker is interrupted."""
from __future__ import annotations

import gc
import hashlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from engine_core.config import switch
from migration_pipeline import tags
from migration_pipeline.assets.cancel import canceled_by_step
from migration_pipeline.lane import carry
from migration_pipeline.lane.terminate import stop_engine_run
from migration_pipeline.launch.checks import LaunchError
from migration_pipeline.launch.signals import STOP_SIGNALS
from migration_pipeline.launch.statuses import FINISHED
from migration_pipeline.launch.stop import STOPPED_BY, mark_canceled, stopped_by_launcher
from migration_pipeline.launcher import IN_PROCESS_TAG, fail_runs_of_dead_processes, process_identity


IN_PROCESS_ENV = "MIGRATE_RUN_IN_PROCESS"  # engine_core.config.FACE_SWITCHES

# How often the watcher of an in-process run reads it (progress, the UI's terminate). A signal wakes
# it at once (`_wake`) and the run's end is the main thread's, so only those two wait on the poll:
# 0.5 s, not POLL_SECONDS' 0.25 s - each read is a run-storage query plus the progress's engine
# reads, ~0.5 s of CPU per small run at 0.25 s (py-spy).
WATCH_SECONDS = 0.5

# A terminate asked of an in-process run is delivered to the main thread again after this long while
# the run has not ended and Dagster only held the last delivery, outside the run's steps (the celery
# executor's orchestrator reads it there; a nested `capture_interrupts` drops it on exit). Within the
# steps a held delivery is taken back and delivered again at the watcher's next poll
# (`InProcessRun._land`); one that raised is never delivered again.
REDELIVER_SECONDS = 2.0

# Where Dagster's own output of in-process runs goes (its console logger writes every event to
# stderr; in a run worker that went to the daemon's log), under DAGSTER_HOME.
IN_PROCESS_LOG = "in-process-runs.log"


def run_in_process(env: dict[str, str] | None = None) -> bool:
    """MIGRATE_RUN_IN_PROCESS: whether `migrate run` may execute its Dagster run in its own process
    when no daemon serves the instance (default 1; 0 keeps the old path: a daemon started for the
    duration of the command, a code server and a run worker). Raises ConfigError naming the
    variable (one line) for any other value than 1/0, true/false, yes/no, on/off
    (`engine_core.config.switch`, also checked by `check_environment`)."""
    return switch(IN_PROCESS_ENV, env)


def _storage_engine(instance: DagsterInstance) -> Any:
    """The SQLAlchemy engine of the instance's Postgres run storage (migration_pipeline.storage),
    or None (another storage: the tests' SQLite instances)."""
    storage = instance.run_storage
    for candidate in (storage, getattr(storage, "_storage", None)):
        engine = getattr(candidate, "_engine", None)
        if engine is not None and getattr(engine.dialect, "name", "") == "postgresql":
            return engine
    return None


# The lane lock's key: a Postgres advisory lock in Dagster's storage database (one per instance,
# since each engine database has its own storage database: migration_pipeline.instance).
LANE_LOCK_KEY = int.from_bytes(hashlib.sha256(b"migrate run: in-process lane").digest()[:8], "big", signed=True)


@contextmanager
def lane_lock(instance: DagsterInstance) -> Iterator[None]:
    """While inside, no other `migrate run` on this instance counts the lane and starts a run here
    (`place_tenant_run(start_here=True)`): a session advisory lock on a connection of the run
    storage, released on exit (or by Postgres, if this process dies). Nothing on a storage that is
    not Postgres."""
    engine = _storage_engine(instance)
    if engine is None:
        yield
        return
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_lock(%s)", (LANE_LOCK_KEY,))
        try:
            yield
        finally:
            conn.exec_driver_sql("SELECT pg_advisory_unlock(%s)", (LANE_LOCK_KEY,))


def lane_room(instance: DagsterInstance, run: Any) -> str:
    """"" when the instance's run queue would dequeue `run` now, else why not (one line): the count
    Dagster's QueuedRunCoordinatorDaemon makes - the runs in progress (STARTING, STARTED,
    CANCELING) against `max_concurrent_runs` and the `tag_concurrency_limits` (dagster.yaml: at
    most the lane width of runs carrying `dagster/partition`), through Dagster's own
    TagConcurrencyLimitsCounter."""
    from dagster._core.storage.dagster_run import ACTIVE_RUN_STATUSES
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    config = instance.get_concurrency_config().run_queue_config
    if config is None:
        return ""
    active = [r.dagster_run for r in instance.get_run_records(RunsFilter(statuses=list(ACTIVE_RUN_STATUSES)))
              if r.dagster_run.run_id != run.run_id]
    if config.max_concurrent_runs != -1 and len(active) >= config.max_concurrent_runs:
        return f"{len(active)} runs in progress (the instance's max_concurrent_runs is {config.max_concurrent_runs})"
    if TagConcurrencyLimitsCounter(list(config.tag_concurrency_limits or []), active).is_blocked(run):
        lane = sum(1 for r in active if tags.PARTITION in r.tags)
        return f"the lane is full ({lane} runs in progress carry {tags.PARTITION})"
    return ""


def start_if_room(instance: DagsterInstance, run: Any) -> str:
    """Under the lane lock: runs whose in-process executor died are failed first
    (`launcher.fail_runs_of_dead_processes`); then, when the lane has room for `run` (`lane_room`), mark it STARTING
    (`mark_starting`) and return ""; else return why not, the run left as it was.

    The race that remains. Between two `migrate run`s of this project the lock makes the count and
    the start one step: they start at most as many runs as the lane has room for. A daemon's
    dequeuer takes no such lock: a daemon that came alive after the command judged that none is
    (`migrate ui` started in the same second) may launch a queued run while the command starts
    its own, putting the lane one run over its Dagster limit, per such coincidence, for the length
    of those runs. It is bounded: only runs already queued (launched while no daemon was alive)
    can be dequeued in that window, the next dequeue counts the command's STARTING run, and the
    engine's own lane - the slots a phase op takes under its Postgres advisory lock
    (`migration/lane_slots`, MIGRATE_LANE_WIDTH threads in all) - is never over: an extra run
    waits for a slot rather than adding threads."""
    with lane_lock(instance):
        fail_runs_of_dead_processes(instance)  # a killed `migrate run`'s run holds no slot
        why = lane_room(instance, run)
        if not why:
            mark_starting(instance, run)
        return why


def mark_starting(instance: DagsterInstance, run: Any) -> None:
    """The run goes STARTING as `DagsterInstance.launch_run` marks a run before its launcher starts
    it (a RUN_STARTING event): from then on it counts in the lane (`lane_room`, the daemon's
    dequeuer) like a run a daemon launched. It carries this process's identity
    (launcher.IN_PROCESS_TAG), so that a run left by a killed command is failed, not counted for
    ever (`launcher.fail_runs_of_dead_processes`, the daemon's run monitoring)."""
    from dagster._core.events import DagsterEvent, DagsterEventType

    instance.add_run_tags(run.run_id, {IN_PROCESS_TAG: process_identity()})
    instance.report_dagster_event(DagsterEvent(event_type_value=DagsterEventType.RUN_STARTING.value,
                                               job_name=run.job_name), run_id=run.run_id)


@contextmanager
def output_aside(log_path: Path) -> Iterator[tuple[Any, Any]]:
    """While inside, file descriptors 1 and 2 write to `log_path` (appended); yields text files on
    the command's own stdout and stderr for what the user is to see.

    An in-process run brings Dagster's run-worker output into the command: its console logger
    writes every event to stderr, and its compute-log capture (LocalComputeLogManager) points
    descriptors 1 and 2 at the run's log files for the whole run and mirrors them back with `tail
    -F` to wherever 1 and 2 pointed before - here `log_path`, as a run worker's went to the
    daemon's log. The command's progress and messages go to the yielded files instead."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    saved = (os.dup(1), os.dup(2))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = os.fdopen(saved[0], "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
                    errors="replace", closefd=False)
    err = os.fdopen(saved[1], "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                    errors="replace", closefd=False)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield out, err
    finally:
        for stream in (sys.stdout, sys.stderr, out, err):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (out, err):
            try:
                f.close()
            except OSError:  # its reader has gone (`| head`): what it had not read is dropped
                pass
        for d in (*saved, fd):
            os.close(d)


class InProcessRun:
    """Execute a STARTING Dagster run (`place_tenant_run(start_here=True)`) in this process, as
    Dagster's run worker (`dagster api execute_run`) does: `core_execute_run(recon_job, run,
    instance)` on the main thread, between its "Started process for run" and "Process for run
    exited" engine events. Steps run on the main thread: Dagster's interrupts are delivered there
    (DAGSTER_NOTES.md trap 6) and the phase op's stop handling relies on them.

    A watcher thread, every WATCH_SECONDS while the run executes:
    * calls `on_tick(run)` (the command's progress: the rich bar or the plain lines);
    * delivers an interrupt to the main thread when the run is CANCELING or CANCELED (the UI's
      Terminate: with no gRPC client for the run, DefaultRunLauncher.terminate only marks it
      CANCELING) - what a run worker's interrupt is, SIGINT to the process - until one has raised
      there (see "Where a delivery lands" below); not when a step of the run marked it so itself
      (`assets.cancel.canceled_by_step`: its engine run was stopped or paused, the step is ending
      with its own Failure, as a run worker gets no interrupt for it);
    * acts on a stop signal (SIGINT, SIGTERM, SIGHUP) the command received: announces it on `err`
      ("SIGTERM: stopping what this command started"), tags the run `dagster/max_retries=0`, sets
      the engine run's stop flag, marks the run CANCELING, then delivers the interrupt. The signal
      is recorded in `signalled`.
    * after `timeout` seconds, stops the run the same way (`timed_out`).

    The signals. Dagster's execution swaps the SIGINT/SIGTERM handlers (capture_interrupts,
    raise_interrupts_as); a signal reaching Dagster's handler first would interrupt the step before
    the run is CANCELING, and the run would end FAILURE ("interrupted unexpectedly"). While the run
    executes here, every handler Dagster installs is wrapped (dagster._utils.interrupts's
    `_replace_interrupt_signal`, 1.13.27): a stop signal is only recorded, the watcher (within
    WATCH_SECONDS) marks the run CANCELING first and then delivers the interrupt
    (`_thread.interrupt_main`), which the wrapper passes to Dagster's handler. So the run ends CANCELED and the engine run stopped, resumable, as from a
    run worker.

    Where a delivery lands. Dagster raises an interrupt as DagsterExecutionInterruptedError only
    inside user code (`raise_execution_interrupts`: an op's body, a resource's set-up); anywhere else
    in a step - its start, the events of an op's yielded result, its end, between steps - it holds
    it (`capture_interrupts`) and raises it on entering the next user code, before that code runs.
    There the phase op cannot turn it into its one-line "stopped by a terminate request" Failure:
    the next step failed with the interrupt's stack trace instead. So while this thread executes
    the run's steps (`lane.carry.allowed`, the project's in-process executor), a delivery Dagster
    only held is taken back and delivered again at the watcher's next poll, until one lands in user
    code and raises there. After that none is delivered: a second one could land in the op's own
    stop handling, between the blocks that hold interrupts, and cut it short."""

    def __init__(self, instance: DagsterInstance, run_id: str, *, on_tick: Callable[[Any], None] | None = None,
                 err: Any = None, timeout: float | None = None, poll: float = WATCH_SECONDS) -> None:
        self.instance = instance
        self.run_id = run_id
        self.on_tick = on_tick
        self.err = err
        self.timeout = timeout
        self.poll = poll
        self.signalled: int | None = None
        self.timed_out = False
        self.executing = False
        self._stopping = False
        self._deliveries = 0  # deliveries made and not yet landed on the main thread
        self.landed = 0  # deliveries that reached the main thread (`_land`)
        self._kept_back = False  # the last delivery was taken back from Dagster (`_land`)
        self._raised = False  # a delivery raised on the main thread: none is delivered again
        self._wake = None  # threading.Event, made in execute()
        self._done = None
        self._delivered_at: float | None = None
        self._said: set[str] = set()  # what `_said_once` has said

    # -- the main thread --------------------------------------------------------------------------

    def execute(self) -> Any:
        """Execute the run; returns it once finished (DagsterRun). A run left unfinished by the
        execution (stopped before its first step, or a framework error) is ended here: CANCELED
        when it was asked to stop, else FAILURE."""
        import threading

        import sys

        from dagster._core.events import EngineEventData
        from dagster._grpc.impl import core_execute_run
        from dagster._utils.error import serializable_error_info_from_exc_info
        from dagster._utils.hosted_user_process import recon_job_from_origin

        instance, run_id = self.instance, self.run_id
        run = instance.get_run_by_id(run_id)
        if run is None:
            raise LaunchError(f"Dagster run {run_id} vanished before it could be executed")
        self._wake, self._done = threading.Event(), threading.Event()
        pid = os.getpid()
        instance.report_engine_event(f"Started process for run (pid: {pid}): `migrate run` executes it in its own "
                                     f"process (no daemon served the instance)", run, EngineEventData.in_process(pid))
        with self._signals_to_watcher():
            watcher = threading.Thread(target=self._watch, name=f"watch-run-{run_id[:8]}", daemon=True)
            watcher.start()
            try:
                if self.signalled is None:
                    try:
                        recon_job = recon_job_from_origin(run.job_code_origin)
                    except Exception:  # noqa: BLE001 - said in the run's events; `_settle` fails the run
                        recon_job = None
                        instance.report_engine_event("Could not load the job to execute it in this process.", run,
                                                     EngineEventData.engine_error(serializable_error_info_from_exc_info(
                                                         sys.exc_info())))
                    # the definitions and the run's workspace, built by the launch, live as long as
                    # the command: not scanned by every full collection while the run executes
                    gc.freeze()
                    self.executing = recon_job is not None
                    try:
                        if recon_job is not None:
                            for _event in core_execute_run(recon_job, run, instance, inject_env_vars=True):
                                pass
                    except BaseException:  # noqa: BLE001 - core_execute_run wrote it to the event log first
                        pass
                    finally:
                        self.executing = False
            finally:
                self._done.set()
                self._wake.set()
                watcher.join()
        instance.report_engine_event(f"Process for run exited (pid: {pid}).", run)
        return self._settle()

    def _settle(self) -> Any:
        run = self.instance.get_run_by_id(self.run_id)
        if run is not None and run.status not in FINISHED:
            if run.status == DagsterRunStatus.CANCELING or self.signalled is not None or self.timed_out:
                mark_canceled(self.instance, self.run_id, "stopped by the command that executed it in its own process "
                                                          "before its steps ran")
            else:
                self.instance.report_run_failed(run, message="`migrate run` executed the run in its own process and it "
                                                             "ended without finishing; see the run's events")
            run = self.instance.get_run_by_id(self.run_id)
        return run

    @contextmanager
    def _signals_to_watcher(self) -> Iterator[None]:
        """The stop signals' handlers, and every SIGINT/SIGTERM handler Dagster installs meanwhile,
        wrapped by `_guard` (see the class docstring); everything restored on exit."""
        from dagster._utils import interrupts

        replace = interrupts._replace_interrupt_signal
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def guarded_replace(handler: Any) -> None:
            replace(self._guard(handler))

        interrupts._replace_interrupt_signal = guarded_replace
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._guard(None))
            yield
        finally:
            interrupts._replace_interrupt_signal = replace
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _guard(self, handler: Any) -> Any:
        """A signal handler in front of `handler` (Dagster's, or none): an interrupt the watcher
        delivers goes through to `handler`; a stop signal from outside is recorded for the watcher,
        nothing else happens on the main thread."""
        if getattr(handler, "_migrate_guard", False):
            return handler

        def guard(signo: int, frame: Any) -> None:
            if self._deliveries > 0:
                self._deliveries -= 1
                self._land(handler, signo, frame)
                return
            if self.signalled is None:  # the watcher sees it within WATCH_SECONDS (no lock taken here:
                self.signalled = int(signo)  # the main thread may hold any lock the signal interrupted)

        guard._migrate_guard = True  # type: ignore[attr-defined]
        return guard

    def _land(self, handler: Any, signo: int, frame: Any) -> None:
        """A delivery of the watcher's, on the main thread: passed to `handler`, Dagster's. When
        the handler only held it (Dagster's flag of a captured interrupt set) while this thread
        executes the run's steps, the flag is cleared and the delivery is taken back: the watcher
        delivers again at its next poll (see the class docstring). With no handler of Dagster's yet,
        the same. One that raised is recorded, and the exception goes on."""
        from dagster._utils import interrupts

        self.landed += 1
        self._kept_back = False
        if not callable(handler):
            self._kept_back = True
            return
        try:
            handler(signo, frame)
        except BaseException:
            self._raised = True
            raise
        held = interrupts._received_interrupt  # dagster 1.13.27's flag (check_captured_interrupt)
        if held["received"] and carry.allowed():
            held["received"] = False
            self._kept_back = True

    # -- the watcher thread -----------------------------------------------------------------------

    def _watch(self) -> None:
        started = time.monotonic()
        while not self._done.is_set():
            self._wake.wait(self.poll)
            self._wake.clear()
            if self._done.is_set():
                return
            try:
                if self.timeout is not None and not self.timed_out and time.monotonic() - started > self.timeout:
                    self.timed_out = True
                if (self.signalled is not None or self.timed_out) and not self._stopping:
                    self._stopping = True
                    self._stop_run()
                run = self.instance.get_run_by_id(self.run_id)
                if run is None:
                    continue
                if self.on_tick is not None:
                    try:
                        self.on_tick(run)
                    except KeyboardInterrupt:
                        raise
                    except BaseException as e:  # noqa: BLE001 - progress is best effort; SystemExit too
                        self._said_once("progress", e)
                if self._stopping or (run.status in (DagsterRunStatus.CANCELING, DagsterRunStatus.CANCELED)
                                      and not canceled_by_step(run)):  # a step's own end is no terminate
                    self._deliver()
            except KeyboardInterrupt:
                raise
            except BaseException as e:  # noqa: BLE001 - the storage hiccuped: asked again next poll
                if not isinstance(e, Exception):
                    self._said_once("watch", e)
                continue

    def _said_once(self, what: str, error: BaseException) -> None:
        """One line on `err` the first time `what` ("progress": `on_tick`; "watch": the watcher's own
        work) raised something that is no Exception (SystemExit, GeneratorExit): such an exception
        had ended the watcher thread silently, and with it the stop signals' handling (the watcher
        acts on them) and the terminate delivery. The watcher keeps watching."""
        if what in self._said:
            return
        self._said.add(what)
        if self.err is not None:
            try:
                print(f"the run's {what} display raised {type(error).__name__}{f': {error}' if str(error) else ''}; "
                      f"the run goes on, and a stop signal still stops it" if what == "progress" else
                      f"the run's watcher met {type(error).__name__}; it keeps watching", file=self.err, flush=True)
            except (OSError, ValueError):
                pass

    def _stop_run(self) -> None:
        """A stop this command was asked for (a signal, --timeout): as `stop_launched_run` does for
        a run on a daemon - no Dagster retry, the engine run's stop flag, the run CANCELING."""
        from dagster._core.storage.tags import MAX_RETRIES_TAG

        if self.signalled is not None and self.err is not None:
            try:
                print(f"{signal.Signals(self.signalled).name}: stopping what this command started", file=self.err,
                      flush=True)
            except OSError:  # stderr's reader has gone (`2>&1 | head`): the stop goes on unsaid
                pass
        # tagged before the stop reaches the op: it names this command as the stopper (`STOPPED_BY`)
        self.instance.add_run_tags(self.run_id, {MAX_RETRIES_TAG: "0", STOPPED_BY: stopped_by_launcher(self.run_id)})
        stop_engine_run(self.instance, self.run_id)
        run = self.instance.get_run_by_id(self.run_id)
        if run is not None and run.status not in FINISHED and run.status != DagsterRunStatus.CANCELING:
            why = ("`migrate run` got " + signal.Signals(self.signalled).name if self.signalled is not None
                   else f"`migrate run` gave up waiting after {self.timeout:.0f} s (--timeout)")
            self.instance.report_run_canceling(run, message=f"{why}; stopping the run it executes")

    def _deliver(self) -> None:
        """The run worker's interrupt, on the main thread (`_guard` lets it through to Dagster's
        handler, `_land`): once; again at the next poll when it was taken back, every
        REDELIVER_SECONDS when Dagster held it outside the steps; never while one is on its way (a
        signal trips once however often it is sent: two would land as one, and the count of those
        on their way stays one up) nor after one raised."""
        import _thread

        now = time.monotonic()
        if not self.executing or self._raised or self._deliveries > 0:
            return
        if self._delivered_at is not None and not self._kept_back and now - self._delivered_at < REDELIVER_SECONDS:
            return
        self._delivered_at = now
        self._kept_back = False
        self._deliveries += 1
        _thread.interrupt_main(signal.SIGINT)
