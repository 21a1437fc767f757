"""Issue 10 (5): "Materialize all" must not spend source tokens on the `matches_source` proof.

The UI's "Materialize all" launches `__ASSET_JOB` with the selected assets and every check of them
whose job names include it (dagster-webserver's `getAssetCheckHandleInputs`) - `matches_source`
included, since the implicit asset job holds every check. Here that launch is replayed on the
project's own Definitions against a tiny sandbox tenant (one phase: the run is limited to `users`):
the phase materialises, the cheap checks evaluate, and `matches_source` is not run - no request to
the source for it, one evaluation saying so (test_proof_not_skipped.py). Asked for on its own (the check's page: the check selected, no
asset), it proves the phase and reports the tokens it spent (its verdict is not the point here).
"""
from __future__ import annotations

import json

import pytest
from dagster import AssetCheckKey, Definitions

from migration_pipeline.assets.checks import MATCHES_SOURCE, build_source_checks, proof_requested
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, PipedriveSource
from tests.pipedrive.support import UNLIMITED, sandbox

pytestmark = pytest.mark.timeout(300)

TOKEN = "sandbox-tok-5e0c1a2b3d4f6789"
TENANT = "acme"


def _evaluations(result) -> dict[str, object]:
    return {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def test_proof_requested_only_for_a_run_of_the_check_alone():
    from dagster import AssetKey, DagsterRun

    key = AssetCheckKey(AssetKey(["pipedrive", "phase_1_fields_users_pipelines"]), MATCHES_SOURCE)
    other = AssetCheckKey(key.asset_key, "kinds_add_up")
    run = lambda **kw: DagsterRun(job_name="__ASSET_JOB", **kw)  # noqa: E731
    assert proof_requested(run(asset_selection=frozenset(), asset_check_selection=frozenset({key})), key)
    assert proof_requested(run(asset_selection=frozenset(), asset_check_selection=frozenset({key, other})), key)
    assert proof_requested(run(asset_selection=frozenset(), asset_check_selection=None), key)  # a job of checks
    assert not proof_requested(run(asset_selection=frozenset({key.asset_key}), asset_check_selection=frozenset({key})), key)
    assert not proof_requested(run(asset_selection=None, asset_check_selection=None), key)  # the whole job
    # a launch of the check alone (with its tenant partition): Dagster stores no asset selection
    assert proof_requested(run(asset_selection=None, asset_check_selection=frozenset({key})), key)
    assert not proof_requested(run(asset_selection=frozenset(), asset_check_selection=frozenset({other})), key)


def test_materialize_all_skips_matches_source_and_the_checks_page_runs_it(instance, db_url, db):
    def implicit_job(res):  # the project's assets and checks with this test's resources
        defs = Definitions(assets=build_phase_assets("pipedrive"), resources=res,
                           asset_checks=build_source_checks("pipedrive"))
        return defs.get_repository_def().get_implicit_global_asset_job_def()

    from migration_pipeline.definitions import build_definitions

    implicit = build_definitions("pipedrive").get_repository_def().get_implicit_global_asset_job_def()
    phase = next(k for k in implicit.asset_layer.asset_graph.get_all_asset_keys() if k.path[-1].startswith("phase_1_"))
    # what the UI puts in a "Materialize all" run: the assets, and every check of theirs in __ASSET_JOB
    checks = {k for k in implicit.asset_layer.asset_graph.asset_check_keys if k.asset_key == phase}
    proof = AssetCheckKey(phase, MATCHES_SOURCE)
    assert proof in checks and len(checks) == 5
    instance.add_dynamic_partitions("tenants", [TENANT])
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        res = {"database": MigrationDatabase(url=to_url(db_url), max_size=8),
               "source": PipedriveSource(base_url=sb.base_url, api_token=TOKEN),
               "lane": LaneSettings(heartbeat_seconds=0.0),
               "new_run": NewRunOptions(kinds=["users"], options_json=json.dumps({"burst_limit": UNLIMITED}))}
        implicit = implicit_job(res)
        everything = implicit.execute_in_process(asset_selection=[phase], partition_key=TENANT, instance=instance,
                                                 raise_on_error=False)
        assert everything.success and everything.dagster_run.asset_selection == {phase}
        got = _evaluations(everything)
        assert set(got) == {"ledger_matches_target", "no_duplicate_claims", "kinds_add_up", "all_rows_landed", MATCHES_SOURCE}, got
        assert not got[MATCHES_SOURCE].passed and got[MATCHES_SOURCE].metadata["tokens"].value == 0  # said not run: no proof
        before = sb.stats()["requests_total"]

        alone = implicit.get_subset(asset_selection=set(), asset_check_selection={proof})
        proved = alone.execute_in_process(partition_key=TENANT, instance=instance, raise_on_error=False)
        assert proved.success
        evaluation = _evaluations(proved)[MATCHES_SOURCE]
        assert evaluation.partition == TENANT and "verify acme" in evaluation.metadata["verdict"].value  # evaluated
        assert evaluation.metadata["tokens"].value > 0
        assert sb.stats()["requests_total"] > before  # the proof alone asked the source

        # a ledger check run on its own (its page's "Execute"): the phase asset's op evaluates that
        # check and nothing else - no drain, no materialisation, no request to the source
        before = sb.stats()["requests_total"]
        ledger = AssetCheckKey(phase, "no_duplicate_claims")
        checked = implicit.get_subset(asset_selection=set(), asset_check_selection={ledger}).execute_in_process(
            partition_key=TENANT, instance=instance, raise_on_error=False)
        assert checked.success and set(_evaluations(checked)) == {"no_duplicate_claims"}
        assert _evaluations(checked)["no_duplicate_claims"].passed
        assert not checked.get_asset_materialization_events()
        assert sb.stats()["requests_total"] == before

        # the checks tab's "Execute" sends no partition: one line saying so, not Dagster's invariant error
        for key in (ledger, proof):
            bare = implicit.get_subset(asset_selection=set(), asset_check_selection={key}).execute_in_process(
                instance=instance, raise_on_error=False)
            failure = next(e for e in bare.all_events if e.event_type_value == "STEP_FAILURE")
            assert failure.step_failure_data.user_failure_data.description.startswith("no tenant partition"), key
        assert sb.stats()["requests_total"] == before

        # a ledger check on its own on a tenant never migrated: one line saying so, not a pass of 0 = 0
        instance.add_dynamic_partitions("tenants", ["never"])
        empty = implicit.get_subset(asset_selection=set(), asset_check_selection={ledger}).execute_in_process(
            partition_key="never", instance=instance, raise_on_error=False)
        failure = next(e for e in empty.all_events if e.event_type_value == "STEP_FAILURE")
        assert failure.step_failure_data.user_failure_data.description.startswith(
            "tenant 'never' has no pipedrive run"), failure.step_failure_data.user_failure_data.description
        assert not _evaluations(empty)
