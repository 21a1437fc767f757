"""The Pipedrive source through the Dagster face, against a `tiny` sandbox over a real socket:
materialising every phase asset for a tenant reconciles exactly with the sandbox's truth and the
metadata carries the per-kind counts, the asset checks pass, and the token appears in no event;
a phase whose tasks fail (a revoked token) fails its asset, and rerunning the partition once the
token is good again is the engine's retry: the sandbox served no listing or body twice. A Dagster run
of the first phases only asks nothing ahead for the phase after its last one."""
from __future__ import annotations

import json

from dagster import AssetKey

from engine_core import rollup, runs
from engine_core.providers.pipedrive.inventory import path_of
from engine_core.providers.pipedrive.kinds import CATCHUP_ORDER as ORDER
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.providers.pipedrive.prefetch import Prefetch
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, PipedriveSource
from tests.pipedrive.support import IDENTITY, TABLE, UNLIMITED, actions, ledger, ledger_truth, sandbox

TOKEN = "dagster-sandbox-tok-5e1b7d20c4"
TENANT = "acme"


def _resources(db_url: str, base_url: str, token: str = TOKEN) -> dict:
    return {
        "database": MigrationDatabase(url=to_url(db_url), max_size=8),
        "source": PipedriveSource(base_url=base_url, api_token=token),
        "lane": LaneSettings(heartbeat_seconds=0.0),
        "new_run": NewRunOptions(options_json=json.dumps({"burst_limit": UNLIMITED})),
    }


def _materialize(instance, res, selection=None):
    from dagster import materialize

    if TENANT not in instance.get_dynamic_partitions("tenants"):
        instance.add_dynamic_partitions("tenants", [TENANT])
    assets = build_phase_assets("pipedrive")  # with their ledger checks
    return materialize(assets, partition_key=TENANT, instance=instance, resources=res,
                       selection=selection, raise_on_error=False)


def _event_text(instance, run_id: str) -> str:
    return "\n".join(str(e.dagster_event or e.user_message) + e.user_message for e in instance.all_logs(run_id))


def test_a_tiny_account_reconciles_through_the_phase_assets(instance, db_url, db):
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        truth = sb.truth()
        result = _materialize(instance, _resources(db_url, sb.base_url))
    assert result.success
    run = runs.latest_run(db, TENANT, "pipedrive")
    assert run.status == "succeeded"

    metadata = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert len(metadata) == len(PHASES) + 1 == 9  # the data phases and the catch-up (issue 9)
    # the opt-in phase, not taken: materialised as not planned, saying what the run left out
    (opt_in,) = [md for name, md in metadata.items() if name.startswith("phase_8_")]
    assert opt_in["phase_status"].value == "not in this run's plan", opt_in
    assert opt_in["left_out"].value.startswith("left out: file_contents, participants, followers, deal_history (opt-in"), opt_in
    per_kind: dict[str, dict[str, float]] = {}
    for md in metadata.values():
        for key, value in md.items():
            if "/" in key:
                kind, counter = key.split("/")
                ledger_kind = IDENTITY.get(kind, kind)  # archived deals and leads: one identity
                counters = per_kind.setdefault(ledger_kind, {})
                if isinstance(value.value, (int, float)):
                    counters[counter] = counters.get(counter, 0) + value.value

    # a row a phase left waiting for the catch-up's walk is counted where it was settled: the
    # catch-up's per-kind counts (the rollup's `caught_up`, as support.settled_counts adds them)
    for k in rollup.rollup(db, run.id).kinds:
        if k.kind in per_kind:
            for counter in ("imported", "skipped", "failed"):
                per_kind[k.kind][counter] += k.caught_up.get(counter, 0)
    for kind, want in ledger_truth(truth).items():
        entries = ledger(db, TENANT, kind)
        assert set(entries) == want, f"{kind}: ledger ids differ from the source's"
        created, skipped = actions(entries, "created"), actions(entries, "skipped")
        assert created | skipped == set(entries)
        assert per_kind[kind]["imported"] == len(created) and per_kind[kind]["skipped"] == len(skipped), kind
        assert per_kind[kind]["failed"] == 0
    for table in set(TABLE.values()):
        rows = db.sql(f"SELECT source_id FROM crm.{table} WHERE tenant_id = %(t)s", {"t": TENANT})
        claimed = sum(len(actions(ledger(db, TENANT, k), "created", "matched")) for k, t in TABLE.items() if t == table)
        assert len(rows) == claimed, f"crm.{table}: target rows = created + matched"
        assert len({r["source_id"] for r in rows}) == len(rows), f"crm.{table} has duplicates"

    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    ledger_checks = {k: v for k, v in checks.items() if k[1] != "all_rows_landed"}
    assert len(ledger_checks) == 3 * 9 and all(ledger_checks.values()), checks  # 9 phases with the catch-up
    # all_rows_landed (WARN) fails exactly where the ledger holds skipped rows of the phase's kinds
    assert len(checks) == 4 * 9
    assert TOKEN not in _event_text(instance, result.run_id)
    assert TOKEN not in json.dumps(instance.get_run_by_id(result.run_id).run_config, default=str)


def test_a_failed_phase_is_retried_by_rerunning_the_partition_without_fetching_twice(instance, db_url, db, monkeypatch):
    keys = [AssetKey(["pipedrive", spec]) for spec in
            ("phase_1_fields_users_pipelines", "phase_2_organizations_products_stages", "phase_3_persons",
             "phase_4_deals_deals_archived_leads_leads_archived", "phase_5_activities_deal_products")]
    asked: list[str] = []
    real_ask = Prefetch.ask

    def ask(self, client, path, query, then=None, **kw):
        asked.append(path)
        return real_ask(self, client, path, query, then, **kw)

    monkeypatch.setattr(Prefetch, "ask", ask)
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        first = _materialize(instance, _resources(db_url, sb.base_url), selection=keys)
        assert first.success
        # phase 6 is not in this Dagster run: none of its lists is asked ahead for it (its page would
        # wait for a later run, and be asked again there once the store had dropped it)
        assert asked and not {"/v1/notes", "/v1/files"} & set(asked), sorted(set(asked))

        # the token is revoked while the notes phase runs: its tasks fail, so does its asset
        revoked = _materialize(instance, _resources(db_url, sb.base_url, token="revoked-token"))
        assert not revoked.success
        failed_steps = [e.step_key for e in revoked.all_events if e.event_type_value == "STEP_FAILURE"]
        assert failed_steps == ["pipedrive__phase_6_notes_files"]
        run = runs.latest_run(db, TENANT, "pipedrive")
        errors = db.sql("SELECT DISTINCT kind, split_part(error, ':', 1) AS e FROM migration_tasks"
                        " WHERE migration_id = %(r)s AND status = 'failed'", {"r": run.id})
        assert sorted(errors, key=lambda e: e["kind"]) == [{"kind": "files", "e": "AuthError"}, {"kind": "notes", "e": "AuthError"}]

        # a good token again, and the partition is rerun: the engine retries the failed tasks
        rerun = _materialize(instance, _resources(db_url, sb.base_url))
        assert rerun.success
        stats = sb.stats()
    assert runs.get_run(db, run.id).status == "succeeded"
    assert [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = %(t)s", {"t": TENANT})] == [run.id]
    # the catch-up phase (issue 9) walks each list once more, by design: once beyond that is twice
    catchup = {path_of(k) for k in ORDER}
    twice = {k: n for k, n in stats["listings"].items() if n > (2 if k.split("?")[0] in catchup else 1)}
    assert twice == {}, f"listings served twice: {twice}"
    assert stats["bodies_fetched"] and max(stats["bodies_fetched"].values()) == 1
    assert len(ledger(db, TENANT, "notes")) == 40


def test_the_launchpads_kinds_take_an_opt_in_kind_and_the_phase_says_what_it_left_out(instance, db_url, db):
    # the launchpad's run config: resources.new_run.config.kinds, the same choice as `--kinds`
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        res = {**_resources(db_url, sb.base_url),
               "new_run": NewRunOptions(options_json=json.dumps({"burst_limit": UNLIMITED}), kinds=["+deal_history"])}
        result = _materialize(instance, res)
        history = sb.truth("deal_history")["deal_history"]
    assert result.success
    run = runs.latest_run(db, TENANT, "pipedrive")
    assert run.status == "succeeded" and "deal_history" in run.kinds and "followers" not in run.kinds
    metadata = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    (phase,) = [md for name, md in metadata.items() if name.startswith("phase_8_")]
    assert phase["phase_status"].value == "closed" and phase["deal_history/imported"].value == sum(map(len, history.values()))
    assert phase["left_out"].value == ("left out: file_contents, participants, followers (opt-in: taken only when asked)\n"
                                       "to add them: a run of those kinds alone, --kinds file_contents,participants,followers\n"
                                       "or in the Dagster launchpad: resources.new_run.config.kinds: "
                                       "[file_contents, participants, followers]"), phase["left_out"].value
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert all(v for (name, check), v in checks.items() if name.startswith("phase_8_") and check != "all_rows_landed")
