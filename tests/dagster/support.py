"""Helpers for the Dagster face's tests: resources on a test database, materialising a tenant."""
from __future__ import annotations

import json
from typing import Any

from dagster import DagsterInstance, materialize

from migration_pipeline.assets.checks import build_phase_checks
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, SourceResource

SMALL = {"page_size": 20, "counts": {"companies": 45, "contacts": 70, "deals": 50, "activities": 40, "notes": 30}}


def resources(db_url: str, source: str = "example", options: dict[str, Any] | None = None, **lane: Any) -> dict[str, Any]:
    return {
        "database": MigrationDatabase(url=to_url(db_url), max_size=8),
        "source": SourceResource(source=source),
        "lane": LaneSettings(heartbeat_seconds=0.0, **lane),
        "new_run": NewRunOptions(options_json=json.dumps(options or {})),
    }


def materialize_tenant(instance: DagsterInstance, tenant: str, res: dict[str, Any], source: str = "example",
                       selection: list[str] | None = None, raise_on_error: bool = False):
    if tenant not in instance.get_dynamic_partitions("tenants"):
        instance.add_dynamic_partitions("tenants", [tenant])
    assets = build_phase_assets(source)
    checks = build_phase_checks(source)
    return materialize([*assets, *checks], partition_key=tenant, instance=instance, resources=res,
                       selection=selection, raise_on_error=raise_on_error)
