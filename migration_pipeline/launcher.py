"""Dagster's default run launcher, aware of the runs `migrate run` executes in its own process.

With no daemon serving the instance, `migrate run` executes its Dagster run in the command's own
process (`launch.InProcessRun`): no run launcher launched it, so the run carries no
`dagster/grpc_info` tag and no code server knows it. The UI's Terminate then reaches
`DefaultRunLauncher.terminate`, which marks the run CANCELING, finds no gRPC client to send the
request to and returns False: the UI says "Unable to terminate run" although the command's watcher
sees CANCELING within a poll and stops the run (engine run stopped, Dagster run CANCELED).

`MigrationRunLauncher.terminate` is the default one, except for a run in progress that never had a
gRPC client (executed in a process of its own, as `migrate run` does): it marks that run CANCELING,
records an engine event saying who stops it and answers True - the request is delivered, through
the CANCELING status the executing process polls. A run launched through a
code server (the daemon's, the UI's) is terminated exactly as before.

A process that executes a run in-process can die without a word (SIGKILL, OOM, a host going
down); its run would stay STARTED and count in the lane for ever (Dagster's run monitoring cannot
see a worker the default launcher did not start). The run carries its executor's identity
(IN_PROCESS_TAG), and a run whose executor is known to be gone is failed: by the daemon's run
monitoring (`check_run_worker_health`, every `run_monitoring.poll_interval_seconds` while a daemon
runs) and by every `migrate run` before it counts the lane (`fail_runs_of_dead_processes`). Only
the host that ran the process can tell (another host's runs are left as they are).

Dagster's run retries (dagster.yaml `run_retries`) re-execute a failed run whenever a daemon next
reads its failure, which may be long after it died (no daemon ran meanwhile). `launch_run` does not
launch such an automatic retry once the tenant was taken in hand since (`retry_superseded`): it
ends CANCELED with the reason, and the engine run is left as the user left it.

dagster.yaml names it in `run_launcher:`; every Dagster process of the project imports this module
from the installed project, as it does `migration_pipeline.storage`.
"""
from __future__ import annotations

import socket
from pathlib import Path

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus, RunsFilter
from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext
from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus
from dagster._core.storage.tags import GRPC_INFO_TAG, MAX_RETRIES_TAG, RETRY_NUMBER_TAG

from engine_core import db as dbmod
from engine_core import runs
from engine_core.errors import EngineError
from migration_pipeline import tags

# The process executing a run in-process, as "<host>:<pid>:<start>" (`process_identity`): set by
# `migrate run` when it marks the run STARTING (launch.mark_starting). <start> is the process's
# start time in clock ticks since boot (/proc/<pid>/stat, field 22), so a pid reused after the
# process died is not taken for it.
IN_PROCESS_TAG = "migration/in_process"

# Where a run without a gRPC client learns of its termination (launch.InProcessRun's watcher).
DELIVERED = ("termination requested: the process executing this run in-process (`migrate run`) sees it "
             "CANCELING and stops it at its next check; the engine run stays resumable")


# A run executed in its own process is STARTED (core_execute_run reports it first) until it ends; a run
# not yet STARTED (queued, or STARTING under a launcher that is adding its gRPC tag) keeps Dagster's answer.
IN_PROCESS_STATES = (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


def _start_ticks(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22); None when
    there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 onwards
    return fields[19] if len(fields) > 19 else None


def process_identity(pid: int | None = None) -> str:
    """"<host>:<pid>:<start>" of `pid` (default: this process), the value of IN_PROCESS_TAG."""
    import os

    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_ticks(pid) or '?'}"


def executor_gone(identity: str) -> str | None:
    """Why the process named by `identity` (IN_PROCESS_TAG) is known to be gone (one line), or
    None: it is alive, it ran on another host (no way to tell from here), or the value is not one
    this module wrote."""
    try:
        host, pid_text, start = identity.rsplit(":", 2)
        pid = int(pid_text)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    now = _start_ticks(pid)
    if now is not None and (now == start or start == "?"):  # alive ("?": its start was not readable)
        return None
    return (f"the process that executed this run in-process (`migrate run`, pid {pid} on {host}) is gone "
            f"(killed, or its host restarted); relaunching the partition resumes its engine run from checkpoints")


def never_retried(instance: DagsterInstance, run_id: str) -> None:
    """Tag run `run_id` `dagster/max_retries=0` before it is failed for a gone in-process executor:
    Dagster's run retries (dagster.yaml `run_retries`) would re-execute it whenever a daemon next
    reads the failure, perhaps long after the user resumed, stopped or finished the tenant by hand.
    The engine run is left resumable; `migrate run` / `migrate resume`, or a daemon's drainers (the
    sensors), resume it from its checkpoints."""
    instance.add_run_tags(run_id, {MAX_RETRIES_TAG: "0"})


def fail_runs_of_dead_processes(instance: DagsterInstance) -> list[str]:
    """End every run in progress whose in-process executor is known to be gone (`executor_gone`):
    FAILURE with the reason (CANCELED when it was already CANCELING), never retried by Dagster
    (`never_retried`). Returns their run ids.
    `migrate run` calls it under the lane lock before it counts the lane."""
    ended = []
    active = instance.get_runs(RunsFilter(statuses=list(IN_PROCESS_STATES) + [DagsterRunStatus.STARTING]))
    for run in active:
        why = executor_gone(run.tags[IN_PROCESS_TAG]) if IN_PROCESS_TAG in run.tags else None
        if why is None:
            continue
        never_retried(instance, run.run_id)
        if run.status == DagsterRunStatus.CANCELING:
            instance.report_run_canceled(run, message=why)
        else:
            instance.report_run_failed(run, message=why)
        ended.append(run.run_id)
    return ended


def retry_superseded(instance: DagsterInstance, db: dbmod.Database, run: DagsterRun) -> str | None:
    """Why `run`, an automatic retry (Dagster's `dagster/retry_number` tag and a parent run), must not
    execute (one line), or None (it is not one, or nothing happened to its tenant since its parent
    failed: the retry resumes the engine run from its checkpoints, what run retries are for):

    * the engine run its parent attached (`migration/run_id`) has ended or is stopping: succeeded,
      stopped or failed since, by hand or by other workers - except a stop the parent's own
      interruption made (`migration/stopped_engine_run` on the parent: the worker was shut down),
      which the retry resumes; that engine run found running again was resumed by hand;
    * a run of the tenant's partition was launched after the parent, outside the retry's own run
      group (a `migrate run`, `resume` or a launch from the UI: the tenant was resumed by hand).
      The sensors' drainer runs do not count: they only help whatever run is live."""
    if RETRY_NUMBER_TAG not in run.tags or not run.parent_run_id:
        return None
    parent = instance.get_run_record_by_id(run.parent_run_id)
    tenant = run.tags.get(tags.PARTITION)
    if parent is None or not tenant:
        return None
    engine_id = parent.dagster_run.tags.get(tags.ENGINE_RUN)
    if engine_id:
        try:
            engine = runs.get_run(db, int(engine_id))
        except (EngineError, ValueError):
            engine = None
        own_stop = parent.dagster_run.tags.get(tags.STOPPED_ENGINE) == engine_id
        if engine is not None:
            if own_stop and engine.status in ("stopping", "stopped"):
                pass  # the parent's own interruption stopped it: the retry resumes it
            elif own_stop and engine.status == "running":
                return f"{engine.name} was resumed since run {run.parent_run_id} stopped it"
            elif engine.status != "running":  # a later engine run of the tenant needs this one ended
                return f"{engine.name} is {engine.status} since run {run.parent_run_id} failed"
    group = {run.root_run_id, run.parent_run_id, run.run_id}
    later = [r for r in instance.get_runs(RunsFilter(tags={tags.PARTITION: tenant}, created_after=parent.create_timestamp))
             if r.run_id not in group and r.root_run_id not in group and r.tags.get(tags.ROLE) != tags.DRAINER]
    if later:
        return f"tenant {tenant!r} was launched again since (Dagster run {later[0].run_id})"
    return None


class MigrationRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose `terminate` answers True for a run executed in its own process.

    `terminate(run_id) -> bool`: True when the request was delivered (a code server accepted it, or
    the run has no gRPC client and is now CANCELING, which its executing process polls); False for
    an unknown or finished run, or when a code server refused it. Raises what
    DefaultRunLauncher.terminate raises (a code server's error)."""

    def terminate(self, run_id: str) -> bool:
        """Deliver a terminate: a run executed in-process by `migrate run` is marked CANCELING (its
        watcher polls for it) and True returned; any other run goes to DefaultRunLauncher.terminate."""
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished or GRPC_INFO_TAG in run.tags or run.status not in IN_PROCESS_STATES:
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        self._instance.report_engine_event(message=DELIVERED, dagster_run=run, cls=self.__class__)
        return True

    def launch_run(self, context: LaunchRunContext) -> None:
        """Launch the run as DefaultRunLauncher does, except an automatic retry whose tenant was taken
        in hand since its parent failed (`retry_superseded`): that one ends CANCELED with the reason,
        unexecuted. When the engine database cannot be read the retry is launched, as Dagster would."""
        run = context.dagster_run
        why = None
        if RETRY_NUMBER_TAG in run.tags and self.has_instance:
            try:
                with dbmod.connect(max_size=1, apply=False) as db:
                    why = retry_superseded(self._instance, db, run)
            except Exception as e:  # noqa: BLE001 - the guard must not stop Dagster's own launch
                self._instance.report_engine_event(f"could not read the engine run before this retry: "
                                                   f"{type(e).__name__}: {e}", dagster_run=run, cls=self.__class__)
        if why is None:
            super().launch_run(context)
            return
        message = f"not re-executed: {why}; the automatic retry of run {run.parent_run_id} is cancelled"
        self._instance.report_run_canceled(run, message=message)

    @property
    def supports_check_run_worker_health(self) -> bool:
        """True: run monitoring asks `check_run_worker_health` about every run."""
        return True

    def check_run_worker_health(self, run: DagsterRun) -> CheckRunHealthResult:
        """For Dagster's run monitoring: FAILED (with the reason, and tagged never to be retried:
        `never_retried`) for a run whose in-process executor is known to be gone; RUNNING otherwise - a run a code server's worker executes is
        not checked, as with DefaultRunLauncher (run monitoring's timeouts still apply)."""
        why = executor_gone(run.tags[IN_PROCESS_TAG]) if IN_PROCESS_TAG in run.tags else None
        if why is not None:
            if self.has_instance:
                never_retried(self._instance, run.run_id)
            return CheckRunHealthResult(WorkerStatus.FAILED, why)
        return CheckRunHealthResult(WorkerStatus.RUNNING)
