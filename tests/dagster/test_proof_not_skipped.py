"""A run that migrates a tenant never leaves a phase's `matches_source` check Skipped.

The tenant job (`migrate_tenant`: its launchpad, its asset graph's Materialize, `migrate run`)
plans no `matches_source` at all. The global asset graph's "Materialize" (and its launchpad, which
includes separately executable checks by default) launches `__ASSET_JOB`, which holds every check:
there the check records one evaluation saying it was not run here and how to run it (not passed,
WARN, no request), as does a refused relaunch from there (its step is skipped after the refusal). The
`verify_tenant` job still proves the phase, and the next not-run evaluation names that proof as
the tenant's latest. Read from the instance as the Checks tab reads it (`get_asset_check_state`,
the check's execution history).
"""
from __future__ import annotations

import json

import pytest
from dagster import AssetCheckKey, AssetCheckSeverity, DagsterEventType, Definitions
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus as Status

from migration_pipeline.assets.checks import MATCHES_SOURCE, build_source_checks
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.assets.proof_not_run import latest_proof
from migration_pipeline.instance import to_url
from migration_pipeline.jobs import SYNC_JOB, TENANT_JOB, VERIFY_JOB, tenant_job, verify_job
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, PipedriveSource
from tests.pipedrive.support import UNLIMITED, sandbox

pytestmark = pytest.mark.timeout(300)

TOKEN = "sandbox-tok-5e0c1a2b3d4f6789"
TENANT = "acme"


def _resources(db_url: str, base_url: str, **new_run) -> dict:
    return {"database": MigrationDatabase(url=to_url(db_url), max_size=8),
            "source": PipedriveSource(base_url=base_url, api_token=TOKEN),
            "lane": LaneSettings(heartbeat_seconds=0.0),
            "new_run": NewRunOptions(kinds=["users"], options_json=json.dumps({"burst_limit": UNLIMITED}), **new_run)}


def _defs(res) -> Definitions:
    proofs = build_source_checks("pipedrive")
    return Definitions(assets=build_phase_assets("pipedrive"), asset_checks=proofs, resources=res,
                       jobs=[tenant_job("pipedrive", without_checks=proofs), verify_job()])


def _shown(instance, key: AssetCheckKey) -> set[str]:
    """The resolved statuses of `key` whose partitions hold TENANT (what the Checks tab shows)."""
    with partition_loading_context(dynamic_partitions_store=instance):
        state = instance.event_log_storage.get_asset_check_state([(key, tenants)])[key]
    return {s.value for s, sub in state.subsets.items() if TENANT in sub.subset_value.get_partition_keys()}


def _latest(instance, key: AssetCheckKey):
    return instance.event_log_storage.get_asset_check_execution_history(key, limit=1)[0]


def _said_not_run(instance, key: AssetCheckKey, run_id: str) -> dict:
    rec = _latest(instance, key)
    data = rec.event.dagster_event.event_specific_data
    assert (rec.run_id, rec.status, rec.partition) == (run_id, Status.FAILED, TENANT), rec
    assert not data.passed and data.severity == AssetCheckSeverity.WARN
    said = data.metadata["not_run"].value
    assert said.startswith("not run by this run") and "verify_tenant" in said and f"migrate verify {TENANT}" in said, said
    assert data.metadata["tokens"].value == 0 and data.metadata["requests"].value == 0
    assert _shown(instance, key) == {"FAILED"}, _shown(instance, key)  # Warning in the tab, not Skipped
    return data.metadata


def test_asset_graph_materialize_says_the_proof_was_not_run(instance, db_url, db):
    instance.add_dynamic_partitions("tenants", [TENANT])
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        defs = _defs(_resources(db_url, sb.base_url))
        implicit = defs.get_repository_def().get_implicit_global_asset_job_def()
        keys = implicit.asset_layer.asset_graph.get_all_asset_keys()
        phase = next(k for k in keys if k.path[-1].startswith("phase_1_"))
        both = [phase, next(k for k in keys if k.path[-1].endswith("_catchup"))]  # the whole run of `users`
        proof = AssetCheckKey(phase, MATCHES_SOURCE)
        assert proof in implicit.asset_layer.asset_graph.asset_check_keys  # Dagster puts it in every asset-graph launch

        graph = implicit.execute_in_process(asset_selection=both, partition_key=TENANT, instance=instance,
                                            raise_on_error=False)
        assert graph.success
        md = _said_not_run(instance, proof, graph.run_id)
        assert md["latest_proof"].value.startswith("none yet"), md

        proved = defs.resolve_job_def(VERIFY_JOB).execute_in_process(partition_key=TENANT, instance=instance,
                                                                 raise_on_error=False)
        assert proved.success  # verify_tenant still proves it
        rec = _latest(instance, proof)
        assert rec.run_id == proved.run_id and rec.status in (Status.SUCCEEDED, Status.FAILED)
        assert rec.event.dagster_event.event_specific_data.metadata["tokens"].value > 0
        verdict = "passed" if rec.status == Status.SUCCEEDED else "failed"
        assert latest_proof(instance, proof, TENANT).startswith(f"{verdict}, Dagster run {proved.run_id[:8]}")

        # the same launch again: refused (the tenant's latest run succeeded), the check's step skipped
        again = implicit.execute_in_process(asset_selection=both, partition_key=TENANT, instance=instance,
                                            raise_on_error=False)
        assert instance.get_run_by_id(again.run_id).status.value == "CANCELED"
        md = _said_not_run(instance, proof, again.run_id)
        assert md["latest_proof"].value.startswith(f"{verdict}, Dagster run {proved.run_id[:8]}"), md


def test_the_tenant_job_plans_no_proof(instance, db_url, db):
    from migration_pipeline.definitions import build_definitions

    project = build_definitions("pipedrive")  # its launchpad, its asset graph's Materialize and `migrate run` launch it
    for name in (TENANT_JOB, SYNC_JOB):
        planned = project.resolve_job_def(name).asset_layer.asset_graph.asset_check_keys
        assert len(planned) == 36 and not [k for k in planned if k.name == MATCHES_SOURCE], name
    instance.add_dynamic_partitions("tenants", [TENANT])
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        job = _defs(_resources(db_url, sb.base_url)).resolve_job_def(TENANT_JOB)
        assert not [k for k in job.asset_layer.asset_graph.asset_check_keys if k.name == MATCHES_SOURCE]
        result = job.execute_in_process(partition_key=TENANT, instance=instance, raise_on_error=False)
        assert result.success
    planned = instance.get_records_for_run(result.run_id, of_type={DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED}).records
    names = {r.event_log_entry.dagster_event.event_specific_data.asset_check_key.name for r in planned}
    assert names == {"ledger_matches_target", "no_duplicate_claims", "kinds_add_up", "all_rows_landed"}, names
