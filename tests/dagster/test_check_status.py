"""What a phase asset's Checks tab shows for a tenant partition: each ledger check's latest
evaluation, as Dagster's instance stores and resolves it (`get_asset_check_state`, the per-partition
status the tab reads; `get_asset_check_execution_history`, the check's history). A run that planned
the checks and ended without materialising the phase (a refused relaunch, a phase out of the run's
plan) evaluates them too, so they show the real result, not "Skipped"."""
from __future__ import annotations

from dagster import AssetCheckKey
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from migration_pipeline.assets.checks import LEDGER_CHECKS
from migration_pipeline.assets.metadata import NO_KIND_IN_RUN
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import NewRunOptions
from tests.dagster.support import materialize_tenant, resources, tmpfs_instance


def statuses(instance, keys: list[AssetCheckKey], tenant: str) -> dict[str, set[str]]:
    """check key -> the resolved statuses whose partitions hold `tenant` (what the tab shows)."""
    with partition_loading_context(dynamic_partitions_store=instance):
        states = instance.event_log_storage.get_asset_check_state([(k, tenants) for k in keys])
    return {f"{k.asset_key.path[-1]}/{k.name}": {s.value for s, sub in states[k].subsets.items()
                                                  if tenant in sub.subset_value.get_partition_keys()} for k in keys}


def ledger_check_keys(names=None) -> list[AssetCheckKey]:
    return [k for a in build_phase_assets("example") for k in a.check_keys
            if k.name in LEDGER_CHECKS and (names is None or k.asset_key.path[-1] in names)]


def latest(instance, key: AssetCheckKey):
    return instance.event_log_storage.get_asset_check_execution_history(key, limit=1)[0]


def test_refused_relaunch_leaves_each_check_its_result(db_url):
    with tmpfs_instance() as instance:
        assert materialize_tenant(instance, "acme", resources(db_url)).success
        keys = ledger_check_keys()
        assert set(map(frozenset, statuses(instance, keys, "acme").values())) == {frozenset({"SUCCEEDED"})}
        again = materialize_tenant(instance, "acme", resources(db_url))  # refused: the latest run succeeded
        assert instance.get_run_by_id(again.run_id).status.value == "CANCELED"
        assert set(map(frozenset, statuses(instance, keys, "acme").values())) == {frozenset({"SUCCEEDED"})}
        for key in keys:  # evaluated by the refused run, of the materialisation it did not replace
            rec = latest(instance, key)
            assert (rec.run_id, rec.status, rec.partition) == (again.run_id, AssetCheckExecutionRecordStatus.SUCCEEDED, "acme")
            assert "evaluated_by" in rec.event.dagster_event.event_specific_data.metadata


def test_phase_out_of_plan_keeps_each_check_its_result(db_url):
    with tmpfs_instance() as instance:
        assert materialize_tenant(instance, "acme", resources(db_url)).success
        res = resources(db_url)
        res["new_run"] = NewRunOptions(kinds=["companies", "contacts"], start_new=True)
        limited = materialize_tenant(instance, "acme", res)
        assert limited.success
        assert "phase_5_notes" not in {e.asset_key.path[-1] for e in limited.get_asset_materialization_events()}
        keys = ledger_check_keys({"phase_3_deals", "phase_4_activities", "phase_5_notes"})
        assert keys
        shown = statuses(instance, keys, "acme")
        assert not [k for k, s in shown.items() if s != {"SUCCEEDED"}], shown
        assert all(latest(instance, k).run_id == limited.run_id for k in keys)
        # all_rows_landed on a phase out of the plan says so first, as kinds_add_up and the phase's
        # materialisation do (`not_planned_entries`), not a bare pass of 0 skipped, 0 failed
        got = {(e.event_specific_data.asset_key.path[-1], e.event_specific_data.check_name): e.event_specific_data
               for e in limited.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
        for name in ("all_rows_landed", "kinds_add_up"):
            said = got[("phase_3_deals", name)]
            assert said.passed, said
            assert list(said.metadata)[:2] == ["run_kinds", "phase_status"], (name, list(said.metadata))
            assert said.metadata["run_kinds"].value.startswith(f"{NO_KIND_IN_RUN}: deals not among "), said.metadata
            assert said.metadata["phase_status"].value == "not in this run's plan"
        landed = got[("phase_3_deals", "all_rows_landed")]
        assert landed.description.startswith(NO_KIND_IN_RUN) and "earlier runs" in landed.metadata["counts_of"].value
        planned = got[("phase_1_companies", "all_rows_landed")]  # a phase of the run: no such line
        assert "run_kinds" not in planned.metadata and planned.description is None, planned
