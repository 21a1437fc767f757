"""A launch refused for its tenant partition's name (`assets.checks.require_tenant`) ends the Dagster
run CANCELED, not FAILURE: Dagster 1.13 counts the partition of every asset a FAILURE run planned and
did not materialise as failed (`partition_status_cache`), so one refused name showed every phase
asset of the partition red in the asset graph until a good run came."""
from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterRunStatus
from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

from migration_pipeline.assets.cancel import canceled_by_step
from migration_pipeline.partitions import tenants
from tests.dagster.support import SMALL, materialize_tenant, resources

pytestmark = pytest.mark.timeout(180)


def test_a_refused_tenant_name_ends_the_run_canceled_and_marks_no_phase_failed(instance, engine_url, db, monkeypatch):
    # the partition stays (its deletion refused): what the asset graph counts for it is then visible
    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("deletion refused")

    monkeypatch.setattr(type(instance), "delete_dynamic_partition", refuse)
    result = materialize_tenant(instance, "bad name", resources(engine_url, options=SMALL))
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert len(failures) == 1 and "not a valid tenant name" in failures[0].event_specific_data.error.message
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    # the step's own cancel, which the `migrate` process's watcher does not take for a terminate
    assert canceled_by_step(instance.get_run_by_id(result.run_id))
    assert db.sql("SELECT id FROM migrations WHERE tenant_id = 'bad name'") == []
    for name in ("phase_1_companies", "phase_3_deals", "phase_5_notes"):
        status = get_and_update_asset_status_cache_value(instance, AssetKey(["example", name]), tenants)
        assert "bad name" not in status.deserialize_failed_partition_subsets(tenants).get_partition_keys(), name
