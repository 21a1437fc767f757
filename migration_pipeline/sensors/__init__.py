"""The reaper and the lane poller, as sensors over the engine's sweeps.

* `reaper` (every MIGRATE_REAPER_INTERVAL_SECONDS, default 300, the seed's five-minute cron): the
  engine's four sweeps - release stale locks, advance phases that closed without a winner, refill
  runs below width, finalise runs whose heartbeat stopped - then drainer runs for the runs whose
  pool is below the lane's width.
* `lane_poller` (every MIGRATE_LANE_INTERVAL_SECONDS, default 15, the seed's poller): only the
  refill sweep and the drainer requests, so one tenant fills the lane within seconds of its launch
  instead of waiting for the reaper.

Neither decides anything the tasks do not already say: drainers are requested only for enqueued
work, only up to the tenant's fair share of the lane's slots (`lane.fair`: two tenants that both
want the whole lane get half each) minus the slots its runs hold or have queued and those its
launches take with threads of their own (MIGRATE_LAUNCH_THREADS; a lone `migrate run` holds its
whole share and gets no drainer), and only for engine runs a Dagster run has attached to (a run started by the engine's own CLI or a benchmark is drained by its
own workers, with its own source settings). The sweeps themselves cover every run.
"""
# No `from __future__ import annotations`: Dagster reads the context and resource annotations
# of op, asset and sensor functions at definition time.

import os

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from engine_core import reaper, runs, runs_reads
from engine_core.config import Settings
from engine_core.db import Database
from engine_core.errors import ConfigError
from engine_core.fairness import run_demands
from engine_core.models import Run
from engine_core.source import Provider, identity_of
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.lane.fair import dagster_managed, lane_picture
from migration_pipeline.partitions import TENANTS
from migration_pipeline.resources import LaneSettings, MigrationDatabase

REAPER_INTERVAL_ENV = "MIGRATE_REAPER_INTERVAL_SECONDS"
LANE_INTERVAL_ENV = "MIGRATE_LANE_INTERVAL_SECONDS"


def _interval(env: str, default: int) -> int:
    raw = os.environ.get(env, "").strip()
    try:
        return max(1, int(raw)) if raw else default
    except ValueError:
        raise ValueError(f"{env} must be a whole number of seconds, got {raw!r}") from None


def drainer_requests(
    context: SensorEvaluationContext,
    db: Database,
    below_width: dict[int, int],
    settings: Settings,
    source: str,
    why: list[str] | None = None,
) -> list[RunRequest]:
    """Drainer runs for runs below width, each tenant up to its fair share of the lane
    (`migration_pipeline.lane.fair`). A run started outside Dagster (the engine's own CLI) may
    have no tenant partition yet: it is added here, before the requests that need it are returned.
    `why`, when given, receives one line per run below width that got no drainer, saying why."""
    why = [] if why is None else why
    requests: list[RunRequest] = []
    new_tenants: list[str] = []
    known = set(context.instance.get_dynamic_partitions(TENANTS))
    managed: dict[int, bool] = {}

    def is_managed(run_id: int) -> bool:
        if run_id not in managed:
            managed[run_id] = dagster_managed(context.instance, run_id)
        return managed[run_id]

    picture = lane_picture(context.instance, db, settings, is_managed)
    for run_id, enqueued in sorted(below_width.items()):
        run = runs.get_run(db, run_id)
        if run.source != source or run.status != "running" or run.cancel_requested:
            why.append(f"{run.name}: " + ("another source's run" if run.source != source else
                                          "stopping" if run.cancel_requested else run.status))
            continue
        if not is_managed(run.id):
            # Started outside Dagster (the engine's own drain, a benchmark): its source settings
            # (base URL option, token in that process's environment) are not ours to run it with.
            context.log.info(f"{run.name} was not launched through Dagster; its own workers drain it")
            why.append(f"{run.name}: not launched through Dagster, its own workers drain it")
            continue
        if not same_source(context, run, db):
            why.append(f"{run.name}: read with other source settings, its own launch drains it")
            continue
        counts = runs_reads.open_task_counts(db, run_id)
        missing = picture.missing(run.tenant_id)
        if missing <= 0:
            slots = picture.tenants.get(run.tenant_id)
            held = slots.in_flight if slots else 0
            why.append(f"{run.name}: tenant {run.tenant_id!r} has its fair share of the lane "
                       f"({held} slot(s) of {picture.share(run.tenant_id)} held or queued"
                       + (", the rest taken by its launch's own threads" if held < picture.share(run.tenant_id) else "")
                       + ")")
            continue
        if run.tenant_id not in known:
            new_tenants.append(run.tenant_id)
            known.add(run.tenant_id)
        for _ in range(missing):
            requests.append(
                RunRequest(
                    partition_key=run.tenant_id,
                    tags={
                        tags.ENGINE_RUN: str(run.id),
                        tags.ROLE: tags.DRAINER,
                        tags.PRIORITY: tags.DRAINER_PRIORITY,
                        tags.SOURCE: source,
                    },
                )
            )
        context.log.info(f"{run.name}: {enqueued} enqueued, {counts.get('running', 0)} running; fair share "
                         f"{picture.share(run.tenant_id)} of {settings.lane_width}; requesting {missing} drainer run(s)")
    if new_tenants:
        # Added directly rather than as SensorResult(dynamic_partitions_requests=...): run requests
        # for a partition added in the same result fail Dagster's partition-key validation in 1.13.
        context.instance.add_dynamic_partitions(TENANTS, new_tenants)
        context.log.info(f"added tenant partitions {new_tenants}")
    return requests


# What the deployment's source settings reach, per account key (host and token fingerprint): asked
# of the source once per process and token, not once per tick.
_identities: dict[tuple[str, str], str] = {}


def same_source(context: SensorEvaluationContext, run: Run, db: Database | None = None) -> bool:
    """Whether drainers (built from the deployment's source settings) would read the run's source.

    A tenant launched with other source settings (a launchpad override reaching another company) is
    drained by its own launch only: a drainer would refuse it anyway (engine SourceMismatch). When
    either side is not known yet, drainers are requested and decide for themselves. `db`: the
    engine's database, whose budget of the account paces the one identity request (`/v1/users/me`)."""
    try:
        provider = provider_for(run.source, run)
        key = (run.source, provider.account())
    except ConfigError as e:
        context.log.info(f"{run.name}: no drainers, the source settings are incomplete here ({e})")
        return False
    if run.source_identity is None:
        return True
    if key not in _identities:
        identity = identity_of(provider, db=db)  # paced by the account's budget (`db`)
        if identity is None:
            return True
        _identities[key] = identity
    if _identities[key] != run.source_identity:
        context.log.info(f"{run.name} reads {run.source_identity}; this deployment's source settings reach "
                         f"{_identities[key]}: its own launch drains it")
        return False
    return True


def _result(requests: list[RunRequest], quiet_reason: str) -> SensorResult | SkipReason:
    return SensorResult(run_requests=requests) if requests else SkipReason(quiet_reason)


def lane_state(db: Database, settings: Settings, below_width: dict[int, int], why: list[str]) -> str:
    """Why a tick requested no drainer, as it is: "idle: no engine run in progress"; "no slot to
    fill: every run in progress has as many tasks running as the lane's width W (run #N W running)";
    "no run below the lane's width has a task to claim (...)" when runs below width have all their
    open tasks held or waiting on a phase barrier; or, for runs below width with tasks to claim,
    why each got no drainer (`drainer_requests`' `why`)."""
    demands = run_demands(db, settings)
    width = settings.lane_width
    if not demands:
        return "idle: no engine run in progress"
    if below_width:
        return "no drainer needed: " + ("; ".join(why) if why else f"{len(below_width)} run(s) below width {width}")
    full = [d for d in demands if d.running >= width]
    if len(full) == len(demands):
        busy = ", ".join(f"run #{d.run_id} {d.running} running" for d in full[:5])
        return f"no slot to fill: every run in progress has as many tasks running as the lane's width {width} ({busy})"
    idle = [d for d in demands if d.running < width]
    listed = ", ".join(f"run #{d.run_id} {d.running} of {width} running" for d in idle[:5])
    return (f"no run below the lane's width has a task to claim ({listed}; nothing enqueued)"
            + (f"; {len(full)} run(s) at width {width}" if full else ""))


def _providers(run: Run) -> Provider:
    # The sweeps only seed phases (no I/O, no credentials): the sensors need no source resource,
    # so they keep ticking in a UI started without the source's settings.
    return provider_for(run.source, run)


def build_sensors(drainer_job, source: str) -> list[SensorDefinition]:
    """The reaper sensor (the engine's sweeps, then drainers for runs below the lane's width) and
    the lane sensor (drainers for each tenant's unused fair share), both targeting `drainer_job`."""
    @sensor(
        name="reaper",
        job=drainer_job,
        minimum_interval_seconds=_interval(REAPER_INTERVAL_ENV, 300),
        default_status=DefaultSensorStatus.RUNNING,
        description="The engine's four sweeps, then drainer runs for runs below the lane's width.",
    )
    def reaper_sensor(context: SensorEvaluationContext, database: MigrationDatabase, lane: LaneSettings):
        db = database.database()
        settings = lane.engine_settings()
        report = reaper.sweep(db, settings, _providers)
        if not report.quiet:
            context.log.info(f"reaper: released tasks {report.released}, advanced runs {report.advanced}, "
                             f"finalized runs {report.finalized}")
        why: list[str] = []
        requests = drainer_requests(context, db, report.below_width, settings, source, why)
        repairs = ("nothing to repair" if report.quiet else
                   f"released {len(report.released)}, advanced {len(report.advanced)}, "
                   f"finalized {len(report.finalized)}")
        return _result(requests, f"{repairs}; {lane_state(db, settings, report.below_width, why)}")

    @sensor(
        name="lane_poller",
        job=drainer_job,
        minimum_interval_seconds=_interval(LANE_INTERVAL_ENV, 15),
        default_status=DefaultSensorStatus.RUNNING,
        description="Refill runs below the lane's width with drainer runs (the reaper's refill sweep only).",
    )
    def lane_sensor(context: SensorEvaluationContext, database: MigrationDatabase, lane: LaneSettings):
        db = database.database()
        settings = lane.engine_settings()
        below = reaper.refill(db, settings)
        why: list[str] = []
        requests = drainer_requests(context, db, below, settings, source, why)
        return _result(requests, lane_state(db, settings, below, why))

    return [reaper_sensor, lane_sensor]
