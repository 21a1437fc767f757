"""Materialising a tenant partition runs the migration through the engine: every phase asset
reconciles exactly with its metadata's counts; a phase that closes with failed tasks fails its
asset with the reasons; rerunning the partition after the cause is gone is the engine's retry and
writes nothing twice; a run limited to some kinds does not materialise the phases after its plan.

Issue 10, item 4 and the UI's "what happened to row X": a phase's metadata carries its grouped
skip and failure reasons (from the ledger, every row counted) and a capped table of its skipped
and failed rows with their reasons. Issue 8: the `kinds_add_up` check fails when a phase's kinds
do not add up (a lost ledger row), never silently."""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import pytest
from dagster import AssetCheckSeverity, DagsterInstance

from engine_core import db as dbmod
from engine_core import runs
from engine_core.ledger_reads import tenant_row_counts
from engine_core.providers import example
from migration_pipeline.instance import to_url
from tests.conftest import _with_dbname
from tests.dagster.support import SMALL, materialize_tenant, resources, tmpfs_instance

KINDS = ["companies", "contacts", "deals", "activities", "notes"]


def _target_counts(db, tenant: str) -> dict[str, int]:
    rows = db.sql("SELECT kind, count(*) AS n FROM example_items WHERE tenant_id = %(t)s GROUP BY kind", {"t": tenant})
    return {r["kind"]: r["n"] for r in rows}


def _ledger_counts(db, tenant: str) -> dict[str, int]:
    rows = db.sql("SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = %(t)s AND action = 'created'"
                  " GROUP BY kind", {"t": tenant})
    return {r["kind"]: r["n"] for r in rows}


@dataclass
class Migrated:
    """Tenant "acme" materialised once (every phase, SMALL) on a database and instance of the module's own."""

    instance: DagsterInstance
    engine_url: str
    db: dbmod.Database
    result: Any  # the first materialisation's ExecuteInProcessResult
    run: runs.Run  # the engine run it succeeded (runs.latest_run after it)


@pytest.fixture(scope="module")
def acme(server_url, clones):
    """One full materialisation shared by the tests that read it (each took ~11 s at load 5): the
    reconciliation, the asset checks on a tampered copy (which puts the rows back after), and a
    second run finding everything already here - last in the file: the checks read the tenant's
    latest run, which that second run replaces."""
    name = clones.take()
    url = _with_dbname(server_url, name)
    try:
        with tmpfs_instance() as instance, dbmod.Database(url, max_size=20) as db:
            engine_url = to_url(url)
            result = materialize_tenant(instance, "acme", resources(engine_url, options=SMALL), raise_on_error=True)
            yield Migrated(instance, engine_url, db, result, runs.latest_run(db, "acme", "example"))
    finally:
        clones.give_back(name)


def test_materialize_all_phases_reconciles_and_reports_per_kind_counts(acme):
    instance, db, result, run = acme.instance, acme.db, acme.result, acme.run
    assert result.success

    expected = SMALL["counts"]
    assert _target_counts(db, "acme") == expected
    assert _ledger_counts(db, "acme") == expected
    assert run.status == "succeeded"

    by_asset = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert list(by_asset) == ["phase_1_companies", "phase_2_contacts", "phase_3_deals", "phase_4_activities", "phase_5_notes"]
    for kind, md in zip(KINDS, by_asset.values()):
        assert md["imported"].value == expected[kind]
        assert md[f"{kind}/imported"].value == expected[kind]
        assert md[f"{kind}/failed"].value == 0
        assert md["failed_tasks"].value == 0
        assert md["engine_run_id"].value == run.id
        assert "succeeded" in md["tasks"].value
        assert md["rows_per_second"].value > 0
        assert "| kind |" in md["duration_by_payload"].value
        assert md["per_kind"].value.records[0].data["kind"] == kind

    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert len(checks) == 20 and all(checks.values()), checks

    # the Dagster run remembers the engine run it worked on
    assert instance.get_run_by_id(result.run_id).tags["migration/run_id"] == str(run.id)


def test_failed_tasks_fail_the_phase_and_a_rerun_retries_without_writing_twice(instance, engine_url, db):
    example.WRITE_CALLS.clear()
    failing = {**SMALL, "fail_pages": {"contacts": [20]}}
    first = materialize_tenant(instance, "acme", resources(engine_url, options=failing))
    assert not first.success
    failures = [e for e in first.all_events if e.event_type_value == "STEP_FAILURE"]
    assert [e.step_key for e in failures] == ["example__phase_2_contacts"]
    message = str(failures[0].step_failure_data.user_failure_data.description)
    assert "1 failed task" in message and "injected failure on contacts page at 20" in message
    materialized = {e.asset_key.path[-1] for e in first.get_asset_materialization_events()}
    assert materialized == {"phase_1_companies"}  # later phases did not run

    run = runs.latest_run(db, "acme", "example")
    assert run.status == "failed" and run.current_phase == 1  # the engine run failed at that phase too

    # the cause goes away (the page is fixed at the source), then the partition is rerun
    db.sql("UPDATE migrations SET options = options - 'fail_pages' WHERE id = %(id)s", {"id": run.id})
    written_before = collections.Counter(example.WRITE_CALLS)
    second = materialize_tenant(instance, "acme", resources(engine_url, options=SMALL), raise_on_error=True)
    assert second.success
    assert runs.get_run(db, run.id).status == "succeeded"  # the same engine run, retried
    assert _target_counts(db, "acme") == SMALL["counts"]

    rerun_writes = collections.Counter(example.WRITE_CALLS) - written_before
    failed_page = {("contacts", str(i)) for i in range(21, 41)}
    assert failed_page <= set(rerun_writes)
    assert not set(rerun_writes) & set(written_before), "the rerun wrote nothing the first run had written"
    assert {k for k, _ in rerun_writes} == {"contacts", "deals", "activities", "notes"}
    assert max(example.WRITE_CALLS.values()) == 1, "no row was written twice"


def test_a_run_limited_to_some_kinds_leaves_the_phases_after_its_plan_unmaterialised(instance, engine_url, db):
    from migration_pipeline.resources import NewRunOptions

    res = resources(engine_url, options=SMALL)
    res["new_run"] = NewRunOptions(kinds=["companies", "contacts"], options_json=res["new_run"].options_json)
    result = materialize_tenant(instance, "beta", res, raise_on_error=True)
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert md["phase_2_contacts"]["imported"].value == SMALL["counts"]["contacts"]
    assert "phase_5_notes" not in md  # issue 10: out of the plan, no success claimed
    assert _target_counts(db, "beta") == {"companies": 45, "contacts": 70}


def test_the_asset_checks_fail_on_a_write_outside_the_ledger_and_a_lost_target_row(acme):
    from migration_pipeline.assets.checks import duplicates_check, ledger_check

    db = acme.db
    assert all(e.passed for e in acme.result.get_asset_check_evaluations())
    assert ledger_check(db, "acme", "example", ["companies"])[0] and duplicates_check(db, "acme", "example", ["contacts"])[0]
    # a contact written again without its claim, and a company whose target row disappeared (both
    # undone after)
    (dup,) = db.sql("INSERT INTO example_items (tenant_id, kind, source_id, payload)"
                    " SELECT tenant_id, kind, source_id, payload FROM example_items"
                    " WHERE tenant_id = 'acme' AND kind = 'contacts' AND source_id = '7' RETURNING id")
    (lost,) = db.sql("DELETE FROM example_items WHERE tenant_id = 'acme' AND kind = 'companies' AND source_id = '3'"
                     " RETURNING id, tenant_id, kind, source_id, parent_id, payload::text AS payload")
    try:
        passed, md = ledger_check(db, "acme", "example", ["companies"])
        assert not passed and md["companies/target_rows"].value == 44 and md["companies/ledger_created"].value == 45
        assert ledger_check(db, "acme", "example", ["contacts"])[0]
        passed, md = duplicates_check(db, "acme", "example", ["contacts"])
        assert not passed
        assert md["unclaimed_target_rows"].value == 1 and md["source_ids_written_twice"].value == 1
        assert duplicates_check(db, "acme", "example", ["deals"])[0]
    finally:  # the module's tenant as it was
        db.sql("DELETE FROM example_items WHERE id = %(id)s", {"id": dup["id"]})
        db.sql("INSERT INTO example_items (id, tenant_id, kind, source_id, parent_id, payload)"
               " VALUES (%(id)s, %(tenant_id)s, %(kind)s, %(source_id)s, %(parent_id)s, %(payload)s::jsonb)", lost)


def test_materialising_again_as_a_new_run_finds_everything_already_here(acme):
    # a new run after a succeeded one must be asked for (issue 10: tests/dagster/test_ui_leftovers.py)
    from dagster import materialize

    from migration_pipeline.assets.phases import NEW_RUN_TAG, build_phase_assets

    assert acme.result.success and runs.latest_run(acme.db, "acme", "example").status == "succeeded"
    again = materialize(build_phase_assets("example"), partition_key="acme",
                        instance=acme.instance, resources=resources(acme.engine_url, options=SMALL),
                        tags={NEW_RUN_TAG: "true"})
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in again.get_asset_materialization_events()}
    assert md["phase_2_contacts"]["already_here"].value == SMALL["counts"]["contacts"]
    assert md["phase_2_contacts"]["imported"].value == 0
    assert _target_counts(acme.db, "acme") == SMALL["counts"]


def _terminated(*args, **kwargs):  # type: ignore[no-untyped-def]
    from dagster._core.errors import DagsterExecutionInterruptedError

    raise DagsterExecutionInterruptedError("terminated from the UI")


def test_a_termination_before_draining_begins_still_stops_the_engine_run(instance, engine_url, db, monkeypatch):
    """Terminate lands while the op prepares the engine run (before drain_in_slot, which handles it
    from then on): the engine run is stopped, so no drainer carries on what the user stopped."""
    from migration_pipeline.assets import phases

    monkeypatch.setattr(phases, "prepare_run", _terminated)
    result = materialize_tenant(instance, "early", resources(engine_url, options=SMALL))
    assert not result.success
    (run,) = [runs.get_run(db, r["id"]) for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'early'")]
    assert run.cancel_requested and run.status in ("stopping", "stopped"), run


def test_a_termination_between_starting_the_engine_run_and_tagging_it_stops_that_run(instance, engine_url, db, monkeypatch):
    original = runs.start_or_join

    def started_then_terminated(*args, **kwargs):  # type: ignore[no-untyped-def]
        original(*args, **kwargs)
        _terminated()

    monkeypatch.setattr(runs, "start_or_join", started_then_terminated)
    result = materialize_tenant(instance, "earlier", resources(engine_url, options=SMALL))
    assert not result.success
    (run,) = [runs.get_run(db, r["id"]) for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'earlier'")]
    assert run.cancel_requested and run.status in ("stopping", "stopped"), run


def test_a_partition_the_cli_could_never_name_is_refused_in_one_line_before_anything_is_written(instance, engine_url,
                                                                                                 db):
    """The UI's "Add a partition" takes "café"; the phase op refuses it by the CLI's rule, naming
    the characters, and no engine run is started for it."""
    result = materialize_tenant(instance, "café", resources(engine_url, options=SMALL))
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"][:1]
    message = failure.event_specific_data.error.message
    assert "'café' is not a valid tenant name" in message and "ASCII letters (A-Z, a-z)" in message, message
    assert "nothing was written" in message and "\n" not in message.strip(), message
    assert db.sql("SELECT id FROM migrations WHERE tenant_id = 'café'") == []
    # removed as it is refused: a partition left behind showed every phase and check failed in the UI
    assert "the partition is removed" in message, message
    assert "café" not in instance.get_dynamic_partitions("tenants")


def test_phase_metadata_carries_grouped_reasons_and_a_capped_table_of_skipped_and_failed_rows(instance, engine_url, db):
    from migration_pipeline.assets import metadata

    options = {**SMALL, "malformed": {"contacts": [4, 9]}, "dangling": {"deals": list(range(1, 61))}}
    result = materialize_tenant(instance, "why", resources(engine_url, options=options), raise_on_error=True)
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}

    deals = md["phase_3_deals"]
    assert deals["skipped"].value == 50
    assert "| deals | skipped | 50 | not linked to any record |" in deals["reasons"].value  # every skip, counted
    table = deals["rows_not_imported"].value.records
    assert len(table) == metadata.ROWS_CAP == 50
    assert {r.data["reason"] for r in table} == {"not linked to any record"}
    assert deals["rows_not_imported_listed"].value.startswith("50 of 50")

    contacts = md["phase_2_contacts"]
    rows = [(r.data["source_id"], r.data["action"]) for r in contacts["rows_not_imported"].value.records]
    assert rows == [("4", "failed"), ("9", "failed")]
    assert "| contacts | failed | 2 |" in contacts["reasons"].value
    assert contacts["complete"].value is True

    # bad rows show where success does: the grouped reasons come first on the materialization, and
    # the all_rows_landed check fails (WARN) on each phase with skipped or failed rows, by the
    # counts `migrate rows` gives
    assert list(deals)[0] == "reasons" and list(contacts)[0] == "reasons"
    checks = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    for asset, kind, skipped, failed in (("phase_2_contacts", "contacts", 0, 2), ("phase_3_deals", "deals", 50, 0)):
        landed = checks[(asset, "all_rows_landed")]
        assert not landed.passed and landed.severity == AssetCheckSeverity.WARN, landed
        rows = tenant_row_counts(db, "why", kind)
        assert (landed.metadata["skipped"].value, landed.metadata["failed"].value) == (skipped, failed)
        assert (rows["skipped"], rows["failed"]) == (skipped, failed)
    assert checks[("phase_1_companies", "all_rows_landed")].passed
    # and `migrate status`'s tenants overview carries them beside "succeeded", by the same count
    from migration_pipeline.cli.inspect import tenant_overview

    (why,) = [o for o in tenant_overview(db) if o["tenant"] == "why"]
    every = tenant_row_counts(db, "why")
    assert (why["status"], why["skipped"], why["failed"]) == ("succeeded", every["skipped"], every["failed"]), why
    assert every["skipped"] >= 50 and every["failed"] == 2, every


def test_kinds_add_up_fails_as_an_asset_check_when_a_ledger_row_is_lost(instance, engine_url, db, monkeypatch):
    """A ledger row of deals disappears once phase 3 has closed (tampered in the test database):
    the phase's `kinds_add_up` check, evaluated in the same Dagster run, fails and names it."""
    from migration_pipeline.assets import phases

    original = phases.LaunchLanes.stop

    def stop_then_lose_a_row(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        # the op's threads stopped once phase 3 has closed, before the op reads its rollup and its
        # checks' snapshot is taken
        stopped = original(self, *args, **kwargs)
        if self.phase == 2:
            self.db.sql("DELETE FROM migration_records WHERE tenant_id = 'lost' AND kind = 'deals' AND source_id = '7'")
        return stopped

    monkeypatch.setattr(phases.LaunchLanes, "stop", stop_then_lose_a_row)
    result = materialize_tenant(instance, "lost", resources(engine_url, options=SMALL))
    checks = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    failed = checks[("phase_3_deals", "kinds_add_up")]
    assert failed.passed is False and failed.severity.value == "ERROR"
    assert "50 imported or matched in the task stats but 49 claimed in the ledger" in failed.metadata["problems"].value
    assert checks[("phase_2_contacts", "kinds_add_up")].passed
