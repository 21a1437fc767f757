"""Where the steps of a migration run execute: in the run's own process (one machine), or on the
worker hosts of a multi-host deployment through Dagster's celery executor (`dagster-celery`).

`MIGRATE_EXECUTOR` chooses: `in_process` (the default; `migrate ui`, `migrate run`, the tests:
Dagster's in-process executor with the engine run stopped on a terminate anywhere in the run,
`stopping_in_process_executor`) or `celery`. With `celery`, the executor's config is the `execution: config:` block of
`MIGRATE_CELERY_CONFIG` (default `deploy/celery.yaml` in the clone), the same file every worker host
starts with (`dagster-celery worker start -A dagster_celery.app -y deploy/celery.yaml`), so the run's
orchestrator and the workers can never disagree about the broker or the acknowledgement policy.
The broker URL itself comes from `MIGRATE_CELERY_BROKER` (read by that file; a password stays in
the environment, not on disk in the repository).

Nothing about the lane changes with the executor: the lane limit is the run coordinator's (the
daemon counts runs carrying `dagster/partition` in the shared run storage), a tenant's fair share
is read from the same storage and the engine's tables (`lane.fair.lane_picture`), and every claim,
checkpoint, barrier and budget is a row in the shared engine database. See docs/deploy.md.
"""
from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml
from dagster import ExecutorDefinition, build_resources

from engine_core.db import Database
from engine_core.errors import ConfigError
from migration_pipeline import storage
from migration_pipeline.lane import carry
from migration_pipeline.lane.join import join_at_launch
from migration_pipeline.lane.terminate import hold_interrupts, stop_engine_run, stop_on_interrupt
from migration_pipeline.resources import database_resource

EXECUTOR_ENV = "MIGRATE_EXECUTOR"
CELERY_CONFIG_ENV = "MIGRATE_CELERY_CONFIG"
BROKER_ENV = "MIGRATE_CELERY_BROKER"
EXECUTORS = ("in_process", "celery")
DEPLOY_DIR = Path(__file__).resolve().parents[2] / "deploy"
DEFAULT_CELERY_CONFIG = DEPLOY_DIR / "celery.yaml"


def celery_config(path: str | Path | None = None) -> dict[str, Any]:
    """The `execution: config:` block of the celery config file (dagster-celery's own file format:
    `dagster-celery worker start -y FILE` reads the same block). Raises ConfigError naming the file
    when it is missing or has no such block."""
    path = Path(path or os.environ.get(CELERY_CONFIG_ENV) or DEFAULT_CELERY_CONFIG)
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{CELERY_CONFIG_ENV}={path}: no such file") from None
    block = (loaded.get("execution") or {}).get("config") if isinstance(loaded, dict) else None
    if not isinstance(block, dict):
        raise ConfigError(f"{CELERY_CONFIG_ENV}={path}: no `execution: config:` block")
    return block


def executor_def(env: dict[str, str] | None = None) -> ExecutorDefinition:
    """The executor of the project's Definitions, by MIGRATE_EXECUTOR (`in_process` | `celery`).

    Raises ConfigError (one line, naming the variable) for another value, and when `celery` is
    asked for but dagster-celery is not installed (`pip install -e .[deploy]`)."""
    env = dict(os.environ if env is None else env)
    name = (env.get(EXECUTOR_ENV) or "in_process").strip()
    if name not in EXECUTORS:
        raise ConfigError(f"{EXECUTOR_ENV}={name!r}: expected one of {', '.join(EXECUTORS)}")
    if name == "in_process":
        # Dagster's in-process executor that also stops the engine run when a terminate lands
        # between steps or outside a phase op's drain (lane.stopping_in_process_executor)
        return stopping_in_process_executor()
    try:
        import dagster_celery  # noqa: F401
    except ImportError:
        raise ConfigError(f"{EXECUTOR_ENV}=celery needs dagster-celery: pip install -e '.[deploy]'") from None
    return _celery_executor().configured(celery_config(env.get(CELERY_CONFIG_ENV)), name="celery")


def _celery_executor() -> ExecutorDefinition:
    """dagster-celery's executor, with one addition: a terminate stops the engine run.

    On a terminate, dagster-celery's orchestrator revokes its steps without terminating them
    (`AsyncResult.revoke()`), so a phase op already running on a worker host would drain its phase
    to the end, and the engine run would go on (drainers included): the UI's Terminate would not be
    the engine's stop it is on one machine (lane.terminate). Here the orchestrator, when it reports the
    termination, sets the engine run's stop flag (`runs.stop`), which every worker host checks
    before every claim; the running step stops at its next task boundary and ends CANCELED."""
    from dagster import executor, multiple_process_executor_requirements
    from dagster._core.execution.retries import RetryMode
    from dagster_celery.executor import CELERY_CONFIG, CeleryExecutor

    class StoppingCeleryExecutor(CeleryExecutor):
        def execute(self, plan_context, execution_plan):
            """dagster-celery's execution, the engine run's stop flag set once it reports a termination.
            First, the launch is tagged with the engine run it joined (`lane.join`)."""
            join_at_launch(plan_context.instance, plan_context.dagster_run.run_id, lambda: run_database(plan_context),
                           plan_context.log)
            stopped = False
            for event in super().execute(plan_context, execution_plan):
                yield event
                if not stopped and _is_termination(event):
                    stopped = True
                    stop_engine_run(plan_context.instance, plan_context.dagster_run.run_id, plan_context.log,
                                    lambda: run_database(plan_context))

    @executor(name="celery", config_schema=CELERY_CONFIG, requirements=multiple_process_executor_requirements())
    def celery_executor_stopping(init_context):
        config = init_context.executor_config
        return StoppingCeleryExecutor(
            broker=config.get("broker"), backend=config.get("backend"), config_source=config.get("config_source"),
            include=config.get("include"), retries=RetryMode.from_config(config["retries"]))

    return celery_executor_stopping


def run_database(plan_context: Any) -> AbstractContextManager[Database]:
    """One connection to the Dagster run's own engine database: its job's `database` resource as the
    run's config sets it (`MigrationDatabase.reader`) - the database its steps use, which need not
    be DATABASE_URL's (a launchpad's `resources.database.config.url`, a job given another resource).
    A job without a `database` resource reads the deployment's (`resources.database_resource`)."""
    resources = plan_context.job.get_definition().resource_defs
    config = ((plan_context.run_config or {}).get("resources") or {}).get("database")
    definition = resources["database"] if "database" in resources else database_resource()
    with build_resources({"database": definition}, instance=plan_context.instance,
                         resource_config={"database": config} if config else None) as built:
        resource = built.database
    return resource.reader()


def _is_termination(event: Any) -> bool:
    """The celery orchestrator's 'received termination signal' engine event."""
    data = getattr(event, "event_specific_data", None)
    return bool(getattr(event, "is_engine_event", False) and data is not None
                and "steps_interrupted" in (getattr(data, "metadata", None) or {}))


def stopping_in_process_executor():
    """Dagster's in-process executor, with one addition: a termination stops the engine run.

    A terminate raises DagsterExecutionInterruptedError in the run's main thread wherever it is
    (DAGSTER_NOTES.md trap 6). The phase op stops the engine run when it lands in the op's body
    (`drain_in_slot`, the op's early-termination handler), but it also lands between steps, in a
    step's set-up (resources) before the op body, and in the op after its drain (materialising):
    there the Dagster run would end CANCELED while the engine run went on, and a relaunch would
    start a new engine run instead of resuming it. Here the executor itself - around every step of the run - catches the interruption and
    sets the stop flag of the engine run the Dagster run is tagged with (`stop_on_interrupt`),
    then re-raises: Dagster ends the run CANCELED, the engine run stops at its next checkpoint and
    relaunching the partition resumes it. The same config as `in_process`."""
    from dagster import executor
    from dagster._core.definitions.executor_definition import IN_PROC_CONFIG, _core_in_process_executor_creation
    from dagster._core.executor.in_process import InProcessExecutor

    class StoppingInProcessExecutor(InProcessExecutor):
        def execute(self, plan_context, execution_plan):
            """Dagster's in-process execution; an interrupt anywhere in it stops the engine run, then
            re-raises. Its phase ops may carry their lane threads from one step to the next
            (`lane.carry.steps_here`); whatever is carried is stopped when the steps end. The event log
            storage reuses a step's latest-materialisation lookup for its checks (`storage.steps_here`).
            First, the launch is tagged with the engine run it joined (`lane.join`)."""
            join_at_launch(plan_context.instance, plan_context.dagster_run.run_id, lambda: run_database(plan_context),
                           plan_context.log)
            with carry.steps_here(), storage.steps_here():  # exited after the stop flag below is set
                try:
                    yield from super().execute(plan_context, execution_plan)
                except Exception:
                    raise
                except BaseException:
                    with hold_interrupts():
                        stop_on_interrupt(plan_context.instance, plan_context.dagster_run.run_id, plan_context.log,
                                          lambda: run_database(plan_context))
                    raise

    @executor(name="in_process", config_schema=IN_PROC_CONFIG)
    def in_process_stopping(init_context):
        base = _core_in_process_executor_creation(init_context.executor_config)
        return StoppingInProcessExecutor(retries=base.retries, step_dependency_config=base.step_dependency_config,
                                         marker_to_close=base.marker_to_close)

    return in_process_stopping
