"""The faces of issue 9: `migrate verify` / `migrate sync`, the Dagster sync job, its schedule and
the `matches_source` check.

* CLI: `migrate verify` and `migrate sync` of an unknown tenant, `migrate sync` of a tenant with
  no succeeded run, and `migrate verify` of a source without id listings end with one line and
  exit 2 (nothing launched); `migrate verify` of a clean
  tiny sandbox tenant exits 0 with the cost beside the verdict, and 1 naming the missing row once
  a product row is deleted (`--json` carries every id).
* `migrate sandbox --live RATE --live-max N` serves an account that changes at RATE and stops after
  N changes; `--live 0` and `--live-max` without `--live` are one line, exit 2.
* Definitions: the sync job is the phase assets tagged `migration/mode=sync`; the schedule is
  stopped by default and asks for the tenants whose latest run succeeded; `matches_source` (one per
  phase) is in neither the tenant job nor the sync job (it spends tokens), and not blocking.
* On a tiny sandbox tenant through Dagster: the phase assets launched with the sync tag start an
  engine sync that brings a change made at the source; its phase materialisations list the tenant's
  rows not imported (a deal an earlier run failed), not only the sync's, and say "no rows" of the sync
  alone; at each run's end every earlier phase is observed with `per_kind` as `migrate status` shows
  the run (`by_catchup` included); `matches_source`, run on its own, passes
  every phase with its tokens in the metadata, and fails naming a row deleted behind the ledger.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from dagster import AssetSelection, Definitions, build_schedule_context, materialize

from engine_core import runs
from engine_core.providers.registry import provider_for
from engine_core.providers.pipedrive.plan import PHASES
from migration_pipeline import tags
from migration_pipeline.assets.checks import MATCHES_SOURCE, build_source_checks
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import to_url
from migration_pipeline.jobs import VERIFY_JOB, verify_job
from migration_pipeline.resources import LaneSettings, MigrationDatabase, NewRunOptions, PipedriveSource
from tests.pipedrive.support import UNLIMITED, migrate, sandbox

pytestmark = pytest.mark.timeout(240)

MIGRATE = str(Path(sys.executable).parent / "migrate")
TOKEN = "sandbox-tok-7f3a9c1e55b2d840"
TENANT = "acme"


def _env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=to_url(db_url), **extra)
    return env


def _migrate(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`migrate ARGS` with exactly `env`'s MIGRATE_*, PIPEDRIVE_*, DAGSTER_* and DATABASE_URL, in
    this process (click's runner: the exit code, stdout and stderr a shell sees; a subprocess
    imported Dagster anew, ~3-7 s a call at load 5). The installed command's own refusals are
    tests/dagster/test_cli_errors.py's."""
    from tests.dagster.test_cli_errors import _migrate_in_process

    return _migrate_in_process(args, env)


def _one_line_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert "Traceback" not in out.stderr + out.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_verify_and_sync_of_an_unknown_tenant_or_one_never_succeeded_are_one_line(db_url, db):
    env = _env(db_url, MIGRATE_SOURCE="example")
    _one_line_error(_migrate(["verify", "nobody"], env), "no tenant 'nobody' (tenants: none")
    _one_line_error(_migrate(["sync", "nobody"], env), "no tenant 'nobody' (tenants: none")
    runs.start_run(db, provider_for("example"), "acme")  # running, never succeeded
    _one_line_error(_migrate(["sync", "acme"], env), "tenant 'acme' has no succeeded example run to sync from")
    _one_line_error(_migrate(["verify", "acme"], env), "the example source cannot list its ids")
    assert db.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == 1  # nothing launched or started


def test_migrate_sandbox_live(tmp_path):
    from migration_pipeline.stack import free_port

    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    for args, needle in ((["--live", "0"], "--live must be a rate above 0"),
                         (["--live-max", "3"], "--live-max needs --live RATE")):
        out = CliRunner().invoke(main, ["sandbox", *args])
        lines = out.output.strip().splitlines()
        assert out.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], out.output
    env = _env("dbname=unused")
    port = free_port()
    proc = subprocess.Popen([MIGRATE, "sandbox", "--port", str(port), "--scale", "tiny", "--live", "20", "--live-max", "3"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import time

        import httpx

        deadline, live = time.monotonic() + 60, {}
        while time.monotonic() < deadline and live.get("applied") != 3:
            try:
                live = httpx.get(f"http://127.0.0.1:{port}/_sandbox/live", timeout=5).json()
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert live.get("applied") == 3 and live.get("rate") == 20, live
        time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/_sandbox/live", timeout=5).json()["applied"] == 3  # capped
    finally:
        proc.terminate()
        proc.wait(15)


def test_migrate_verify_exit_codes_on_a_tiny_sandbox_tenant(db_url, db):
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        assert migrate(db, sb, TENANT).status == "succeeded"
        env = _env(db_url, PIPEDRIVE_API_TOKEN=TOKEN)
        clean = _migrate(["verify", TENANT], env)
        assert clean.returncode == 0, clean.stdout[-3000:] + clean.stderr[-2000:]
        last = clean.stdout.strip().splitlines()[-1]
        assert "PASSED" in last and "requests" in last and "tokens" in last

        gone = db.sql("SELECT source_id, record_id FROM migration_records WHERE tenant_id = %(t)s"
                      " AND kind = 'notes' AND action = 'created' ORDER BY record_id LIMIT 1", {"t": TENANT})[0]
        db.sql("DELETE FROM crm.notes WHERE id = %(id)s RETURNING id", {"id": gone["record_id"]})
        found = _migrate(["verify", TENANT, "--json"], env)
    assert found.returncode == 1, found.stdout[-3000:] + found.stderr[-2000:]
    verdict = json.loads(found.stdout)
    assert verdict["passed"] is False and verdict["differences"] == 1 and verdict["tokens"] > 0
    notes = next(k for k in verdict["kinds"] if k["kind"] == "notes")
    assert notes["missing"] == [gone["source_id"]]
    assert TOKEN not in found.stdout + found.stderr


def test_the_sync_job_schedule_and_the_proof_are_wired_as_documented(instance, db):
    from migration_pipeline.definitions import build_definitions

    defs = build_definitions("pipedrive")
    repo = defs.get_repository_def()
    sync = repo.get_job("sync_tenant")
    assert sync.tags.get(tags.MODE) == tags.SYNC and sync.partitions_def is not None
    proofs = {c.name for c in repo.asset_graph.asset_check_keys if c.name == MATCHES_SOURCE}
    assert proofs and len([c for c in repo.asset_graph.asset_check_keys if c.name == MATCHES_SOURCE]) == len(PHASES)
    assert repo.get_job(VERIFY_JOB).partitions_def is not None  # the proof alone, from the launchpad
    for name in ("migrate_tenant", "sync_tenant"):
        in_job = {c.name for c in repo.get_job(name).asset_layer.asset_graph.asset_check_keys}
        assert MATCHES_SOURCE not in in_job and "ledger_matches_target" in in_job, name
    assert all(not c.blocking for spec in build_source_checks("pipedrive") for c in spec.check_specs)

    schedule = repo.get_schedule_def("sync_tenants")
    assert schedule.default_status.value == "STOPPED"
    db.sql("INSERT INTO migrations (tenant_id, source, source_account, status, plan, finished_at) VALUES"
           " ('done', 'pipedrive', 'a', 'succeeded', '[]'::jsonb, now()),"
           " ('busy', 'pipedrive', 'a', 'running', '[]'::jsonb, NULL) RETURNING id")
    instance.add_dynamic_partitions("tenants", ["done", "busy", "new"])
    with build_schedule_context(instance=instance, resources={"database": MigrationDatabase(url=db.url)}, repository_def=repo,
                                scheduled_execution_time=datetime(2026, 12, 1, 3, tzinfo=timezone.utc)) as context:
        requests = list(schedule.evaluate_tick(context).run_requests or [])
    assert [r.partition_key for r in requests] == ["done"]


def _resources(db_url: str, base_url: str) -> dict:
    return {
        "database": MigrationDatabase(url=to_url(db_url), max_size=8),
        "source": PipedriveSource(base_url=base_url, api_token=TOKEN),
        "lane": LaneSettings(heartbeat_seconds=0.0),
        "new_run": NewRunOptions(options_json=json.dumps({"burst_limit": UNLIMITED})),
    }


def _prove(assets, checks, proofs, instance, res):
    """The verify_tenant job on a partition, as its launchpad runs it: matches_source per phase."""
    defs = Definitions(assets=assets, asset_checks=checks, resources=res, jobs=[verify_job()])
    return defs.get_job_def(VERIFY_JOB).execute_in_process(partition_key=TENANT, instance=instance, raise_on_error=False)


def _evaluations(result):
    return [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]


def _metadata(result) -> dict[str, dict]:
    """Each phase asset's materialisation metadata in a materialize() result, by asset name."""
    return {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}


def _run_end_observations(result) -> dict[str, dict]:
    """The last observation of each phase asset in a result that carries `per_kind` (the run's end)."""
    out = {}
    for e in result.all_events:
        if e.event_type_value == "ASSET_OBSERVATION":
            obs = e.event_specific_data.asset_observation
            if "per_kind" in obs.metadata:
                out[obs.asset_key.path[-1]] = obs.metadata
    return out


def _leave_a_deal_failed(db, first) -> str:
    """As if the full run `first` had failed one deal the source served in a shape the product cannot
    hold (a row a run left failed stays the tenant's until a run settles it: a sync that is not served
    it again does not touch it): its source id."""
    held = db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, action, reason)"
                  " VALUES (%(r)s, %(t)s, 'pipedrive', 'deals', '990001', 'failed', 'value: not a number')"
                  " RETURNING source_id", {"t": TENANT, "r": first.id})
    return held[0]["source_id"]


def _says_the_tenants_rows_and_the_runs_end(db, full, synced, first, sync, failed: str) -> None:
    """A sync's materialisation of a phase lists the tenant's rows not imported at its close (as
    `migrate rows` did then), not only the sync's, and its "no rows" sentence is the sync's alone; at
    the run's end each earlier phase is observed with per_kind as `migrate status` shows the same
    run, and with the tenant's rows then."""
    from engine_core import rollup
    from engine_core.ledger_reads import bad_row_counts

    deals = _metadata(synced)["phase_4_deals_deals_archived_leads_leads_archived"]
    table = [(r.data["kind"], r.data["source_id"], r.data["action"], r.data["run_id"])
             for r in deals["tenant_rows_not_imported"].value.records]
    assert ("deals", failed, "failed", first.id) in table, table  # the full run's row, at the sync's phase close
    held = sum(deals[f"tenant_{a}"].value for a in ("skipped", "waiting", "failed"))
    assert deals["tenant_failed"].value >= 1
    assert deals["tenant_rows_not_imported_listed"].value.startswith(f"{len(table)} of {held} "), deals
    # the sync itself skipped or failed nothing of these kinds: its sentence says so of the sync, and what the tenant holds
    assert not deals["rows_not_imported"].value.records
    assert deals["reasons"].value.startswith(f"No rows skipped, waiting or failed by this sync #{sync.id}, no task failed; "
                                             f"tenant {TENANT!r} still holds {held} "), deals["reasons"].value
    assert f"sync #{sync.id}" in deals["figures_of"].value and "tenant_rows_not_imported" in deals["figures_of"].value

    # per_kind: read at each phase's close (before the catch-up ran), then observed at the run's end with
    # the figures `migrate status` shows for the same run; the tenant's rows as the ledger holds them then
    now = bad_row_counts(db, TENANT, ["deals", "deals_archived", "leads", "leads_archived"])
    caught = 0
    for result, run in ((full, first), (synced, sync)):
        r = rollup.rollup(db, run.id)
        ended = _run_end_observations(result)
        phases = [name for name, md in _metadata(result).items()  # planned (the opt-in phase is not), before the last
                  if "per_kind" in md and not name.endswith("catchup")]
        assert sorted(ended) == sorted(phases), (sorted(ended), phases)
        for name in phases:
            shown = {rec.data["kind"]: (rec.data["by_catchup"], rec.data["deleted_at_source"])
                     for rec in ended[name]["per_kind"].value.records}
            status = {k.kind: (int(k.caught_up.get("seen", 0)), k.deleted_at_source) for k in r.kinds if k.kind in shown}
            assert shown == status, (name, shown, status)
            assert "before its catch-up" in _metadata(result)[name]["per_kind_as_of"].value
            caught += sum(n for n, _ in shown.values()) if run is sync else 0
    assert caught, "the sync's catch-up wrote the change made at the source: by_catchup is not 0 everywhere"
    deals_end = _run_end_observations(synced)["phase_4_deals_deals_archived_leads_leads_archived"]
    assert deals_end["tenant_failed"].value == sum(v["failed"] for v in now.values()), (deals_end, now)


def test_a_sync_through_the_phase_assets_then_the_proof_per_phase(instance, db_url, db):
    instance.add_dynamic_partitions("tenants", [TENANT])
    assets = build_phase_assets("pipedrive")
    proofs = build_source_checks("pipedrive")
    checks = proofs  # the ledger checks are the phase assets' own
    phases = AssetSelection.all() - AssetSelection.checks(*proofs)
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        res = _resources(db_url, sb.base_url)
        full = materialize([*assets, *checks], partition_key=TENANT, instance=instance, resources=res,
                           selection=phases, raise_on_error=False)
        assert full.success
        first = runs.latest_run(db, TENANT, "pipedrive")
        failed = _leave_a_deal_failed(db, first)
        sb.configure(live_mix="update:1")
        changed = sb.live_step(1)[0]

        synced = materialize([*assets, *checks], partition_key=TENANT, instance=instance, resources=res,
                             selection=phases, tags={tags.MODE: tags.SYNC}, raise_on_error=False)
        assert synced.success
        sync = runs.latest_run(db, TENANT, "pipedrive")
        assert sync.id != first.id and sync.status == "succeeded"
        assert db.sql("SELECT mode FROM migrations WHERE id = %(r)s", {"r": sync.id})[0]["mode"] == "sync"
        assert (synced.dagster_run.tags.get(tags.ENGINE_RUN)) == str(sync.id)
        _says_the_tenants_rows_and_the_runs_end(db, full, synced, first, sync, failed)

        proved = _prove(assets, checks, proofs, instance, res)
        assert proved.success
        evaluations = {e.asset_key.path[-1]: e for e in _evaluations(proved)}
        assert len(evaluations) == len(PHASES) and all(e.check_name == MATCHES_SOURCE and e.partition == TENANT
                                             for e in evaluations.values())
        assert all(e.passed for e in evaluations.values()), {k: e.metadata.get("verdict") for k, e in evaluations.items()}
        assert sum(e.metadata["tokens"].value for e in evaluations.values()) > 0
        assert not proved.get_asset_materialization_events()  # the proof materialises nothing

        notes = db.sql("SELECT source_id, record_id FROM migration_records WHERE tenant_id = %(t)s AND kind = 'notes'"
                       " AND action = 'created' ORDER BY record_id LIMIT 1", {"t": TENANT})[0]
        db.sql("DELETE FROM crm.notes WHERE id = %(id)s RETURNING id", {"id": notes["record_id"]})
        again = _prove(assets, checks, proofs, instance, res)
    failed = {e.asset_key.path[-1]: e for e in _evaluations(again) if not e.passed}
    assert list(failed) == ["phase_6_notes_files"]
    assert failed["phase_6_notes_files"].metadata["notes/missing"].value == 1
    assert notes["source_id"] in failed["phase_6_notes_files"].metadata["verdict"].value
    updated = db.sql("SELECT count(*) AS n FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                     " WHERE r.tenant_id = %(t)s AND r.source_id = %(s)s AND h.action = 'updated' AND h.migration_id = %(m)s",
                     {"t": TENANT, "s": str(changed["id"]).lower(), "m": sync.id})[0]["n"]
    assert updated == 1, changed  # the sync brought the change made at the source, in place


@pytest.mark.timeout(900)
def test_demo_live_prints_each_runs_own_cost_not_the_sandboxs_counters(db_url, tmp_path):
    """`migrate demo --live` (issue 10, a fresh user's find): the cost it prints for the full run
    and the sync is what each engine run's own tasks counted (`run_cost`), not the sandbox's
    whole counters (which also hold the launch's identity and clock requests, and the verify's)."""
    import re

    import psycopg

    from migration_pipeline.instance import STORAGE_URL_ENV

    env = _env(db_url, MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    out = subprocess.run([MIGRATE, "demo", "--live", "--scale", "tiny", "--live-rate", "2"], env=env,
                         capture_output=True, text=True, timeout=840)
    text = " ".join(out.stdout.split())
    found = re.search(r"full run #(\d+) \(while changing\): (\d+) requests, (\d+) tokens; "
                      r"sync #(\d+): (\d+) requests, (\d+) tokens", text)
    assert found, (out.returncode, out.stdout[-3000:], out.stderr[-2000:])
    full_id, full_req, full_tok, sync_id, sync_req, sync_tok = map(int, found.groups())
    # one "what now", at the end (after the sync and the verify), for the demo's named tenant
    assert text.count("what now:") == 1 and text.index("what now:") > found.end(), text[-3000:]
    assert f"what now: tenant 'demo-live': run #{full_id} succeeded, " in text and f"sync #{sync_id} succeeded, verify passed" in text
    with psycopg.connect(db_url) as c:
        def cost(run_id: int) -> tuple[int, int]:
            return tuple(int(v) for v in c.execute(
                "SELECT COALESCE(sum((stats->>'requests')::bigint), 0), COALESCE(sum((stats->>'tokens')::bigint), 0)"
                " FROM migration_tasks WHERE migration_id = %s", (run_id,)).fetchone())
        assert cost(full_id) == (full_req, full_tok) and full_req > 0
        assert cost(sync_id) == (sync_req, sync_tok) and sync_req > 0
        modes = dict(c.execute("SELECT id, mode FROM migrations WHERE id IN (%s, %s)", (full_id, sync_id)).fetchall())
    assert modes == {full_id: "full", sync_id: "sync"}
