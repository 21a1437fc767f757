"""Placing a tenant's Dagster run: its partition added, the run created in this process with the
same tags, config and code location origin as a launch from the UI, then queued for the daemon or
started here (`in_process`); waiting for a queued run."""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from migration_pipeline import stack, tags
from migration_pipeline.jobs import TENANT_JOB
from migration_pipeline.launch.checks import LaunchError
from migration_pipeline.launch.daemon import DaemonKeeper
from migration_pipeline.launch.in_process import start_if_room
from migration_pipeline.launch.statuses import FINISHED, IN_PROGRESS, POLL_SECONDS
from migration_pipeline.launch.stop import stop_launched_run
from migration_pipeline.partitions import TENANTS


def queue_state(instance: DagsterInstance, run_id: str, lane_width: int) -> str:
    """Why a queued run waits, in one line: the runs ahead of it in the lane (those in progress
    carrying `dagster/partition`, and those queued before it), or the dequeuer's next pass."""
    me = instance.get_run_record_by_id(run_id)
    in_progress = sum(1 for r in instance.get_run_records(RunsFilter(statuses=IN_PROGRESS))
                      if tags.PARTITION in r.dagster_run.tags)
    ahead = 0
    if me is not None:
        ahead = sum(1 for r in instance.get_run_records(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))
                    if tags.PARTITION in r.dagster_run.tags and r.dagster_run.run_id != run_id
                    and r.create_timestamp <= me.create_timestamp)
    if in_progress >= lane_width or ahead:
        return f"queued behind {in_progress + ahead} run{'' if in_progress + ahead == 1 else 's'} in the lane ({in_progress} of {lane_width} slots busy, {ahead} queued ahead)"
    return f"queued; the lane has {lane_width - in_progress} of {lane_width} slots free, waiting for the daemon to dequeue it"


def code_location_origin():  # -> ManagedGrpcPythonEnvCodeLocationOrigin
    """The code location every run of this project names: the definitions module
    (stack.DEFS_MODULE) loaded from the working directory, as `dagster job launch -m` and
    `dagster-daemon run -m` (stack.daemon) / `dagster dev -m` name it. The daemon's run launcher
    finds the run's code location in its own workspace by this origin's location name."""
    from dagster._core.workspace.load import location_origin_from_module_name

    return location_origin_from_module_name(stack.DEFS_MODULE, None, os.getcwd())


def _current_definitions() -> None:
    """The definitions module as this process's MIGRATE_SOURCE builds it: `migrate run --source X`
    sets MIGRATE_SOURCE after the module may have been imported with another source (its
    `resolve_source` ran at import), so it is rebuilt once when the two differ. Dagster keeps the
    last job and repository a `ReconstructableJob` loaded, process-wide, keyed by the module's
    name and the job's (dagster/_core/definitions/reconstruct.py, `lru_cache(maxsize=1)`): a
    process that executed another source's run (a preloaded launcher, one `migrate` process
    after another in a test) would build this run from that source's job, so both are dropped."""
    import importlib
    import sys

    from dagster._core.definitions.reconstruct import ReconstructableJob

    module = sys.modules.get(stack.DEFS_MODULE)
    if module is not None and module.SOURCE != module.resolve_source():
        importlib.reload(module)
        ReconstructableJob.get_definition.cache_clear()
        ReconstructableJob.get_repository_definition.cache_clear()


def _job_here(instance: DagsterInstance, origin: Any, location: Any, job: str) -> tuple[Any, Any, Any]:
    """`job` of the definitions module as the in-process code location `location` (an
    InProcessCodeLocationOrigin) serves it - (RemoteJob, RemoteRepository, ReconstructableJob) -
    built here from the loaded definitions, without the code location: Dagster's
    InProcessCodeLocation imports its gRPC server module for its repository loader (grpc,
    protobuf, health checks: ~0.07 s of each launch, `python -X importtime`, load 2) and a
    `migrate run` that executes its run here never serves gRPC. The same repository snapshot,
    handle and python origin as the location's (`InProcessCodeLocation.__init__`,
    `LoadedRepositories`, `CodeLocation.get_repository_python_origin`). Raises what loading
    raises (the caller then takes the code location's way, for its error)."""
    import sys

    from dagster._core.code_pointer import CodePointer
    from dagster._core.definitions.reconstruct import ReconstructableRepository
    from dagster._core.origin import RepositoryPythonOrigin
    from dagster._core.remote_representation.external import RemoteRepository
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._core.remote_representation.handle import RepositoryHandle
    from dagster._core.workspace.autodiscovery import loadable_targets_from_python_module

    target_origin = origin.loadable_target_origin
    targets = loadable_targets_from_python_module(target_origin.module_name, target_origin.working_directory)
    if len(targets) != 1:
        raise LaunchError(f"{len(targets)} repositories in {target_origin.module_name}")
    pointer = CodePointer.from_module(target_origin.module_name, targets[0].attribute, target_origin.working_directory)
    executable = target_origin.executable_path or sys.executable
    recon_repo = ReconstructableRepository(pointer, location.container_image, executable_path=executable,
                                           entry_point=location.entry_point, container_context=location.container_context)
    repo_def = recon_repo.get_definition()
    handle = RepositoryHandle(repository_name=repo_def.name, code_location_origin=location,
                              repository_python_origin=RepositoryPythonOrigin(
                                  executable_path=executable, code_pointer=pointer,
                                  container_image=location.container_image, entry_point=location.entry_point,
                                  container_context=location.container_context),
                              display_metadata=location.get_display_metadata())
    repo = RemoteRepository(RepositorySnap.from_def(repo_def), handle,
                            auto_materialize_use_sensors=instance.auto_materialize_use_sensors)
    if not repo.has_job(job):
        raise LaunchError(f"no job {job!r} in {location.location_name}")
    return repo.get_full_job(job), repo, recon_repo.get_reconstructable_job(job)


def _dagster_lines(error: BaseException) -> list[str]:
    """The lines of a Dagster error worth a user's reading: its message (a config error's list of
    problems), without tracebacks; at most 6, duplicates dropped."""
    text = str(error).strip() or type(error).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith(("File ", "raise "))]
    return list(dict.fromkeys(lines))[:6] or [type(error).__name__]


def submit_tenant_run(instance: DagsterInstance, tenant: str, run_config: dict, job: str = TENANT_JOB,
                      run_id: str | None = None, run_tags: dict[str, str] | None = None) -> str:
    """Submit `job` for the tenant's partition to the instance's run coordinator (queued); the run
    id. `place_tenant_run` without `start_here`: see there."""
    return place_tenant_run(instance, tenant, run_config, job=job, run_id=run_id, run_tags=run_tags).run_id


@dataclass
class Placement:
    """Where `place_tenant_run` put a run: `here` (STARTING, to be executed in this process by
    `InProcessRun`) or queued for a daemon; `why` says why it was not started here (one line)."""
    run_id: str
    here: bool
    why: str = ""


def place_tenant_run(instance: DagsterInstance, tenant: str, run_config: dict, job: str = TENANT_JOB,
                     run_id: str | None = None, run_tags: dict[str, str] | None = None,
                     start_here: bool = False) -> Placement:
    """Create `job`'s run for the tenant's partition, then start it here or queue it.

    In this process, what `dagster job launch` did in a subprocess of its own (a second Dagster
    import and a code server: ~10 s of every `migrate run`): the definitions are loaded
    in-process (InProcessWorkspaceLoadTarget), the run is created with the job's tags merged with
    `dagster/partition=tenant` (and `run_tags`, e.g. tags.NEW_RUN), the run config, its execution
    plan, and the remote origin `dagster job launch -m` records (`code_location_origin()`, a
    managed gRPC origin: the daemon's run launcher finds that location in its own workspace).

    `start_here` (no daemon serves the instance, `migrate run` decided to execute the run itself):
    under the instance's lane lock (`lane_lock`), when the run queue's limits leave it room
    (`lane_room`: the same count the daemon's dequeuer makes), the run goes STARTING as
    `DagsterInstance.launch_run` marks a run it hands to a launcher (RUN_STARTING event), and
    Placement.here is True. Otherwise - or without `start_here` - it is submitted: the
    QueuedRunCoordinator queues it and a daemon dequeues it as any other run.

    Raises LaunchError with Dagster's error lines (an unknown job, a run config the job refuses, a
    code location that does not load); nothing is created then."""
    from dagster import __version__
    from dagster._core.definitions.selector import JobSubsetSelector
    from dagster._core.execution.api import create_execution_plan
    from dagster._core.snap.execution_plan_snapshot import snapshot_from_execution_plan
    from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._utils.merger import merge_dicts
    from dagster._utils.tags import normalize_tags

    run_id = run_id or str(uuid.uuid4())
    origin = code_location_origin()
    name = origin.location_name
    location = InProcessCodeLocationOrigin(origin.loadable_target_origin, location_name=name)

    def create(remote_job: Any, repo: Any, plan: Any) -> Any:
        return instance.create_run(
            job_name=job, run_id=run_id, run_config=run_config,
            resolved_op_selection=remote_job.resolved_op_selection,
            step_keys_to_execute=plan.step_keys_to_execute, op_selection=None, status=None,
            root_run_id=None, parent_run_id=None,
            tags=normalize_tags(merge_dicts(remote_job.tags, {**(run_tags or {}), tags.PARTITION: tenant})),
            job_snapshot=remote_job.job_snapshot, execution_plan_snapshot=plan,
            parent_job_snapshot=remote_job.parent_job_snapshot,
            remote_job_origin=RemoteJobOrigin(RemoteRepositoryOrigin(origin, repo.name), job),
            job_code_origin=remote_job.get_python_origin(),
            asset_selection=None, asset_check_selection=None, asset_graph=repo.asset_graph)

    try:
        _current_definitions()
        run, why = None, ""
        if start_here:  # the run is likely executed here: no code location needed (`_job_here`)
            try:
                remote_job, repo, recon_job = _job_here(instance, origin, location, job)
                plan = snapshot_from_execution_plan(
                    create_execution_plan(recon_job, run_config, instance_ref=instance.get_ref()
                                          if instance.is_persistent else None),
                    remote_job.identifying_job_snapshot_id)
            except Exception:  # noqa: BLE001 - the code location's way below says what went wrong
                remote_job = None
            if remote_job is not None:
                run = create(remote_job, repo, plan)
                why = start_if_room(instance, run)
                if not why:
                    return Placement(run_id, True)
        with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(location), version=__version__) as process:
            workspace = process.create_request_context()
            if run is None:
                if workspace.has_code_location_error(name):
                    raise LaunchError(f"the code location {name} does not load:\n"
                                      + "\n".join(_dagster_lines(workspace.get_code_location_error(name))))
                code_location = workspace.get_code_location(name)
                repo = next(iter(code_location.get_repositories().values()))
                if not repo.has_job(job):
                    raise LaunchError(f"no job {job!r} in {name} (jobs: {', '.join(sorted(j.name for j in repo.get_all_jobs()))})")
                remote_job = code_location.get_job(JobSubsetSelector(location_name=name, repository_name=repo.name,
                                                                     job_name=job, op_selection=None))
                plan = code_location.get_execution_plan(remote_job, run_config, step_keys_to_execute=None,
                                                        known_state=None, instance=instance).execution_plan_snapshot
                run = create(remote_job, repo, plan)
                why = start_if_room(instance, run) if start_here else ""
                if start_here and not why:
                    return Placement(run_id, True)
            instance.submit_run(run.run_id, workspace)
            return Placement(run_id, False, why)
    except LaunchError:
        raise
    except Exception as e:  # noqa: BLE001 - Dagster's refusal, as one message
        raise LaunchError("Dagster could not launch the run:\n" + "\n".join(_dagster_lines(e))) from None


def add_tenant(instance: DagsterInstance, tenant: str) -> bool:
    """Add the tenant's partition; True when it was new (so a failed launch can take it back)."""
    if instance.has_dynamic_partition(TENANTS, tenant):
        return False
    instance.add_dynamic_partitions(TENANTS, [tenant])
    return True


def undo_failed_launch(instance: DagsterInstance, tenant: str, run_id: str, added: bool) -> None:
    """Nothing left behind by a launch that failed: its run record, if one was created and never
    started, and the partition this command added, when no other run of the tenant exists."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.status in (DagsterRunStatus.NOT_STARTED, DagsterRunStatus.FAILURE,
                                          DagsterRunStatus.CANCELED):
        instance.delete_run(run_id)
    if added and not instance.get_runs_count(RunsFilter(tags={tags.PARTITION: tenant})):
        instance.delete_dynamic_partition(TENANTS, tenant)


def wait_for_run(instance: DagsterInstance, run_id: str, *, poll: float = POLL_SECONDS,
                 on_tick: Callable[[Any], None] | None = None, timeout: float | None = None,
                 keeper: DaemonKeeper | None = None, lane_width: int = 4, queue_timeout: float | None = None,
                 on_queued: Callable[[str], None] | None = None):
    """Until the Dagster run finishes; returns it.

    While it is queued: `keeper.ensure()` on every poll (a daemon is started when none is alive),
    `on_queued(why)` whenever the reason changes (and every 30 s), and after `queue_timeout`
    seconds in the queue the run is cancelled and LaunchError says why it waited. `timeout`
    bounds the whole wait: then the run is stopped (`stop_launched_run`: cancelled from the queue,
    or its engine run stopped and the run terminated, resumable) and TimeoutError says so."""
    deadline = None if timeout is None else time.monotonic() + timeout
    queued_since: float | None = None
    said, said_at = "", 0.0
    while True:
        run = instance.get_run_by_id(run_id)
        if keeper is not None:
            keeper.ensure()
        if on_tick is not None and run is not None:
            on_tick(run)
        if run is not None and run.status in FINISHED:
            return run
        if run is not None and run.status == DagsterRunStatus.QUEUED:
            queued_since = queued_since or time.monotonic()
            why = queue_state(instance, run_id, lane_width)
            if keeper is not None and not keeper.last.alive:
                why = keeper.last.why
            now = time.monotonic()
            if on_queued is not None and (why != said or now - said_at >= 30):
                on_queued(why)
                said, said_at = why, now
            if queue_timeout is not None and now - queued_since > queue_timeout:
                instance.run_coordinator.cancel_run(run_id)
                raise LaunchError(f"gave up: Dagster run {run_id} was still queued after {queue_timeout:.0f} s "
                                  f"({why}); it was cancelled (MIGRATE_QUEUE_TIMEOUT_SECONDS sets the limit)")
        else:
            queued_since = None
        if deadline is not None and time.monotonic() > deadline:
            # As the in-process path does: what the command launched does not go on unattended (a
            # a run left QUEUED after --timeout was dequeued later and ran alone).
            was = run.status.value if run else "missing"
            final = stop_launched_run(instance, run_id, echo=lambda m: None)
            raise TimeoutError(f"Dagster run {run_id} still {was} after {timeout:.0f} s (--timeout): it was stopped "
                               f"({final.value if final else 'gone'}); launching the tenant again resumes it")
        time.sleep(poll)
