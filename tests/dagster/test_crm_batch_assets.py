"""Deal products, files and (asked for) file contents through the Dagster face: a tiny account's
phase assets materialise with the new kinds' counts in their metadata, and every asset check
passes but `all_rows_landed` of the phase that holds file_contents, which warns - a private and a
purged file kept as metadata with their reason are bad rows in sight, not a green phase.

Rows a walk left to the catch-up's walk (`waiting`) are accounted for at their phase's close: that
phase's `all_rows_landed` passes showing them, and the catch-up's own `all_rows_landed` passes only
because nothing waits once it ran (`landed_check` with `catchup`: it fails on a row still waiting)."""
from __future__ import annotations

import json

from engine_core import runs
from engine_core.rows import WAITS_FOR_WALK
from migration_pipeline.assets.checks import evaluate_ledger_checks, landed_check, ledger_check_specs
from migration_pipeline.assets.specs import phase_specs
from migration_pipeline.resources import NewRunOptions
from tests.dagster.test_pipedrive import TENANT, TOKEN, _materialize, _resources
from tests.pipedrive.support import UNLIMITED, sandbox


def test_the_phase_assets_carry_deal_products_files_and_their_contents(instance, db_url, db):
    with sandbox(token=TOKEN, burst_limit=UNLIMITED) as sb:
        res = {**_resources(db_url, sb.base_url),
               "new_run": NewRunOptions(options_json=json.dumps({"burst_limit": UNLIMITED}), kinds=["+file_contents"])}
        result = _materialize(instance, res)
        lines = sum(map(len, sb.truth("deal_products")["deal_products"].values()))
        files = sb.truth("files")["files"]
    assert result.success
    run = runs.latest_run(db, TENANT, "pipedrive")
    assert run.status == "succeeded" and "file_contents" in run.kinds
    metadata = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert metadata["phase_5_activities_deal_products"]["deal_products/imported"].value == lines
    assert metadata["phase_6_notes_files"]["files/imported"].value == len(files)
    contents = metadata["phase_7_emails_file_contents"]
    stored = sum(1 for f in files if f["download"] == 200)
    assert (contents["file_contents/imported"].value, contents["file_contents/skipped"].value) == (stored, len(files) - stored)
    failed = {(e.asset_key.path[-1], e.check_name) for e in result.get_asset_check_evaluations() if not e.passed}
    assert failed == {("phase_7_emails_file_contents", "all_rows_landed")}, failed
    # the phases' metadata agrees with itself: rows listed are never more than counted, a waiting row
    # is listed as waiting (not skipped), and the catch-up's reasons are of the kinds it walked
    for name, md in metadata.items():
        if "rows_not_imported_listed" not in md:  # a phase not in the run's plan
            continue
        listed, _, of = md["rows_not_imported_listed"].value.partition(" of ")
        assert int(listed) <= int(of.split()[0]), (name, md["rows_not_imported_listed"].value)
        if md["skipped"].value + md["failed"].value:
            assert not md["reasons"].value.startswith("No rows"), (name, md["reasons"].value)
    persons = [r.data for r in metadata["phase_3_persons"]["rows_not_imported"].records]
    assert persons and {r["action"] for r in persons} == {"waiting"}, persons
    # frozen at the phase's close, the waiting count says the catch-up settles them after it
    assert "catch-up" in metadata["phase_3_persons"]["waiting_note"].value, metadata["phase_3_persons"]
    assert "waiting_note" not in metadata["phase_9_catchup"], metadata["phase_9_catchup"]
    landed = {e.asset_key.path[-1]: e.metadata for e in result.get_asset_check_evaluations()
              if e.check_name == "all_rows_landed"}
    assert landed["phase_3_persons"]["waiting"].value > 0, landed["phase_3_persons"]  # at its close
    assert "catch-up settles" in landed["phase_3_persons"]["waiting_note"].value
    assert landed["phase_9_catchup"]["waiting"].value == 0, landed["phase_9_catchup"]
    # the catch-up's check is the one that fails while a row still waits (here: one made to wait again)
    db.sql("UPDATE migration_records SET action = 'skipped', reason = %(r)s"
           " WHERE tenant_id = %(t)s AND kind = 'persons' AND source_id = '1' RETURNING 1",
           {"r": f"organization 1 is not here, {WAITS_FOR_WALK}", "t": TENANT})
    (catchup,) = [spec for spec in phase_specs("pipedrive") if spec.name == "phase_9_catchup"]
    (result,) = evaluate_ledger_checks(db, TENANT, catchup, {"all_rows_landed"})
    assert not result.passed and result.metadata["persons/waiting"].value == 1, result
    assert "Nothing still waits" in next(c.description for c in ledger_check_specs(catchup)
                                         if c.name == "all_rows_landed")
    assert landed_check(db, TENANT, ["persons"])[0], "a waiting row fails its data phase's check"
