"""The project's only Definitions: phase assets and checks of one source, the jobs (the tenant's
migration, its sync, its proof from the source, the drainer, `explain_row`), the sensors and the sync schedule (off by default).

The source is `MIGRATE_SOURCE` (default `pipedrive`). If its provider cannot be loaded the code
location still loads, on the `example` provider, and says why in the assets' descriptions and the
log rather than failing the whole workspace.
"""
from __future__ import annotations

import logging
import os

from dagster import Definitions

from engine_core.providers.registry import provider_for
from migration_pipeline.assets.checks import build_source_checks
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.lane.executors import executor_def
from migration_pipeline.jobs import drainer_job, explain_job, sync_job, tenant_job, verify_job
from migration_pipeline.resources import default_resources
from migration_pipeline.schedules import sync_schedule
from migration_pipeline.sensors import build_sensors

log = logging.getLogger(__name__)

DEFAULT_SOURCE = "pipedrive"
FALLBACK_SOURCE = "example"


def resolve_source(requested: str | None = None) -> str:
    """The configured source if its provider loads, else the example provider."""
    source = (requested or os.environ.get("MIGRATE_SOURCE") or DEFAULT_SOURCE).strip()
    try:
        provider_for(source).phases()
        return source
    except Exception as e:  # an unknown source or a provider that does not import yet
        log.warning("source %r is not available (%s); the Dagster face falls back to %r", source, e, FALLBACK_SOURCE)
        return FALLBACK_SOURCE


def build_definitions(source: str) -> Definitions:
    """The project's Definitions for `source`: its phase assets (with their ledger checks), the proof
    checks when the source can list its ids, the jobs, sensors, sync schedule, resources and the
    executor MIGRATE_EXECUTOR chooses. Raises ConfigError for an unknown MIGRATE_EXECUTOR."""
    drain = drainer_job()
    # the proof from the source spends tokens: run on its own from the UI, never by a launch's job
    proofs = build_source_checks(source)
    sync = sync_job(source, without_checks=proofs)
    return Definitions(
        assets=build_phase_assets(source),
        asset_checks=proofs,  # the ledger checks are the phase assets' own
        jobs=[tenant_job(source, without_checks=proofs), sync, drain, explain_job(),
              *([verify_job()] if proofs else [])],
        sensors=build_sensors(drain, source),
        schedules=[sync_schedule(sync, source)],
        resources=default_resources(source),
        # One step at a time in the run's own process: the phases are sequential anyway, and a
        # terminate reaches the op's main thread directly (see lane/terminate.py). A multi-host deployment
        # sets MIGRATE_EXECUTOR=celery: the steps run on the worker hosts (lane/executors.py, docs/deploy.md).
        executor=executor_def(),
    )


SOURCE = resolve_source()
defs = build_definitions(SOURCE)
