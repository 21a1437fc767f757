"""Deal products, files and (asked for) file contents through the Dagster face: a tiny account's
phase assets materialise with the new kinds' counts in their metadata, and every asset check
passes but `all_rows_landed` of the phase that holds file_contents, which warns - a private and a
purged file kept as metadata with their reason are bad rows in sight, not a green phase."""
from __future__ import annotations

import json

from engine_core import runs
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
