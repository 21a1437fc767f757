"""Issue 10, what a fresh user still met in the Dagster UI:

1. "Materialize all" (or relaunching the tenant job) on a tenant whose latest engine run succeeded
   started a whole new full run (~83% of a migration's source tokens, writing nothing). Now the
   first phase step refuses in one line naming the succeeded run and the sync, and the run ends
   CANCELED (a FAILURE would mark the tenant's phases failed); a launch tagged
   `migration/new_run=true` starts a new run; a launch asking for kinds the run did not cover starts
   one too (the engine's policy, `runs.attach` / `runs.migrated_by`).
2. Phase materialisations said `engine_run_status: running` on every phase but the last; they say
   `phase_status: closed` and `engine_run_status_at_close`.
3. A terminate ended the phase step with DagsterExecutionInterruptedError's stack trace: now a
   one-line Failure saying how to resume, the run CANCELED, the engine run stopped.
"""
from __future__ import annotations

import _thread
import json
import threading
import time

import pytest
from dagster import AssetKey, DagsterRunStatus, RunsFilter, materialize
from dagster._core.storage.partition_status_cache import get_and_update_asset_status_cache_value

from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import drain_threads
from migration_pipeline.assets.phases import NEW_RUN_TAG, build_phase_assets
from migration_pipeline.partitions import tenants
from migration_pipeline.resources import NewRunOptions
from tests.dagster.support import SMALL, materialize_tenant, resources
from tests.engine.support import FAST

pytestmark = pytest.mark.timeout(180)
TINY = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def _failures(result) -> dict[str, object]:
    return {e.step_key: e.step_failure_data for e in result.all_events if e.event_type_value == "STEP_FAILURE"}


def _runs_of(db, tenant: str) -> list[int]:
    return [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = %(t)s ORDER BY id", {"t": tenant})]


def test_relaunching_a_migrated_tenant_refuses_in_one_line_unless_a_new_run_is_asked_for(instance, engine_url, db):
    first = materialize_tenant(instance, "done", resources(engine_url, options=TINY), raise_on_error=True)
    (run_id,) = _runs_of(db, "done")
    name = runs.get_run(db, run_id).name

    # 2. what a phase materialisation says of itself and of the engine run
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in first.get_asset_materialization_events()}
    assert "engine_run_status" not in md["phase_1_companies"]
    assert md["phase_1_companies"]["phase_status"].value == "closed"
    assert md["phase_1_companies"]["engine_run_status_at_close"].value == "running"
    assert md["phase_5_notes"]["phase_status"].value == "closed"
    assert md["phase_5_notes"]["engine_run_status_at_close"].value == "succeeded"

    # 1. "Materialize all" again: refused in one line, nothing started
    again = materialize_tenant(instance, "done", resources(engine_url, options=TINY))
    assert not again.success
    failures = _failures(again)
    assert list(failures) == ["example__phase_1_companies"], failures
    message = failures["example__phase_1_companies"].user_failure_data.description
    assert "\n" not in message
    assert f"{name} already succeeded" in message
    assert "sync_tenant" in message and "`migrate sync done`" in message and f"{NEW_RUN_TAG}=true" in message
    assert _runs_of(db, "done") == [run_id], "no new engine run was started"
    # CANCELED, not FAILURE: Dagster would count the tenant's partition of every phase the run planned
    # as failed (red in the UI) over a refusal, and run retries would relaunch it
    assert instance.get_run_by_id(again.run_id).status == DagsterRunStatus.CANCELED
    for name in ("phase_1_companies", "phase_3_deals"):
        status = get_and_update_asset_status_cache_value(instance, AssetKey(["example", name]), tenants)
        assert "done" not in status.deserialize_failed_partition_subsets(tenants).get_partition_keys(), name
        assert "done" in status.deserialize_materialized_partition_subsets(tenants).get_partition_keys(), name

    # asked for explicitly (launchpad: Edit tags): a new run
    assets = build_phase_assets("example")  # with their ledger checks
    explicit = materialize(assets, partition_key="done", instance=instance,
                           resources=resources(engine_url, options=TINY), tags={NEW_RUN_TAG: "true"})
    assert explicit.success
    assert len(_runs_of(db, "done")) == 2 and runs.latest_run(db, "done", "example").status == "succeeded"
    # or in the launchpad's config (resources.new_run.config.start_new)
    configured = {**resources(engine_url, options=TINY),
                  "new_run": NewRunOptions(options_json=json.dumps(TINY), start_new=True)}
    assert materialize(assets, partition_key="done", instance=instance, resources=configured).success
    assert len(_runs_of(db, "done")) == 3


def test_a_launch_asking_for_kinds_the_succeeded_run_did_not_cover_starts_a_new_run(db):
    provider = provider_for("example")
    limited = runs.start_run(db, provider, "partly", kinds=["companies"], options=SMALL, settings=FAST)
    drain_threads(db, limited.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, limited.id).status == "succeeded"
    with pytest.raises(runs.AlreadyMigrated):
        runs.attach(db, provider, "partly", start_kwargs={"kinds": ["companies"], "options": SMALL})
    wider = runs.attach(db, provider, "partly", start_kwargs={"options": SMALL})  # every kind
    assert wider.action == "started" and wider.run.id != limited.id


def _terminate_while_draining(instance, db, tenant: str, kind: str, done: threading.Event) -> None:
    """The UI's Terminate, as the run coordinator and the local launcher do it: the run is marked
    CANCELING, then the run worker's main thread is interrupted - while `kind` is being written."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not done.is_set():
        rows = db.sql("SELECT 1 FROM migration_records r JOIN migrations m ON m.id = r.migration_id"
                      " WHERE m.tenant_id = %(t)s AND r.kind = %(k)s LIMIT 1", {"t": tenant, "k": kind})
        if rows:
            (dagster_run,) = instance.get_runs(filters=RunsFilter(statuses=[DagsterRunStatus.STARTED]))
            instance.report_run_canceling(dagster_run)
            _thread.interrupt_main()
            return
        time.sleep(0.05)


def test_a_terminate_ends_the_phase_step_with_one_line_not_a_stack_trace(instance, engine_url, db):
    done = threading.Event()
    terminator = threading.Thread(target=_terminate_while_draining, args=(instance, db, "halted", "contacts", done))
    terminator.start()
    try:
        slow_contacts = {"page_size": 20, "counts": {**TINY["counts"], "contacts": 70}, "row_delay": 0.05}
        result = materialize_tenant(instance, "halted", resources(engine_url, options=slow_contacts))
    finally:
        done.set()
        terminator.join()
    assert instance.get_run_by_id(result.run_id).status == DagsterRunStatus.CANCELED
    (run_id,) = _runs_of(db, "halted")
    assert runs.get_run(db, run_id).status in ("stopping", "stopped")
    failures = _failures(result)
    assert list(failures) == ["example__phase_2_contacts"], failures
    data = failures["example__phase_2_contacts"]
    assert data.error.cls_name == "Failure", data.error.cls_name  # not DagsterExecutionInterruptedError
    assert data.user_failure_data.description == f"stopped by a terminate request; relaunch resumes engine run {run_id}"

    db.sql("UPDATE migrations SET options = options - 'row_delay' WHERE id = %(r)s", {"r": run_id})  # fast now
    relaunch = materialize_tenant(instance, "halted", resources(engine_url, options=SMALL), raise_on_error=True)
    assert relaunch.success and _runs_of(db, "halted") == [run_id]
    assert runs.get_run(db, run_id).status == "succeeded"


def test_a_dry_runs_row_failures_are_grouped_as_failed_and_a_waiting_row_as_waiting(db):
    """A dry run's reasons come from its log, whose row failures are "error" notes: they are grouped
    as `failed` (the reasons table's "what" said `error`), a task's error stays the log's level; a
    ledger placeholder that waits for the catch-up's walk is grouped as `waiting`, not skipped."""
    from engine_core import rollup
    from engine_core.rows import WAITS_FOR_WALK

    log = [{"level": "error", "kind": "persons", "reason": "MalformedRow: no name", "count": 2, "samples": ["7", "9"]},
           {"level": "error", "kind": "deals", "reason": "boom", "count": 1, "samples": ["task 3"]}]
    got = {(g["kind"], g["action"]) for g in rollup.grouped_reasons(db, 0, log, dry_run=True)}
    assert got == {("persons", "failed"), ("deals", "error")}, got
    assert rollup.outcome_of("skipped", f"org 3 is not here, {WAITS_FOR_WALK}") == "waiting"
    assert rollup.outcome_of("skipped", "org 3 is not here") == "skipped"


def test_skip_reasons_are_grouped_by_their_shape_with_a_count_and_example_ids(db):
    """4. A group of rows skipped for the same cause, each reason naming its own ids: one group
    labelled with the shape (ids as placeholders), every row counted, a few source ids as examples
    (the label used to be one row's reason, and small ids split the group in one per id)."""
    from engine_core import rollup
    from engine_core.runlog import RunLog
    from migration_pipeline.assets.metadata import reasons_table

    opts = {**SMALL, "dangling": {"deals": list(range(1, 13))}}
    run = runs.start_run(db, provider_for("example"), "shapes", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    # what a provider with words for its references writes: each row names its own ids
    db.sql("UPDATE migration_records SET reason = 'person ' || source_id || ' references org '"
           " || (source_id::int %% 5 + 1) || ' which is missing' WHERE migration_id = %(r)s AND action = 'skipped'",
           {"r": run.id})

    groups = [g for g in rollup.grouped_reasons(db, run.id) if g["kind"] == "deals"]
    assert len(groups) == 1, groups
    (g,) = groups
    assert (g["action"], g["reason"], g["count"]) == ("skipped", "person {n} references org {n} which is missing", 12)
    assert len(g["samples"]) == 5 and set(g["samples"]) <= {str(i) for i in range(1, 13)}
    assert g["example"].startswith("person ") and "{n}" not in g["example"]

    table = reasons_table([g])
    assert "| deals | skipped | 12 | person {n} references org {n} which is missing |" in table

    # the run log groups a task's notes by the same shape; HTTP statuses still tell causes apart
    log = RunLog(run.id)
    for i in (1, 2, 30):
        log.note("warning", "notes", f"note {i}: HTTP 500 from /v1/notes/{i}", subject=i)
    log.note("warning", "notes", "note 4: HTTP 404 from /v1/notes/4", subject=4)
    assert sorted((e["count"], e["samples"]) for e in log.groups.values()) == [(1, ["4"]), (3, ["1", "2", "30"])]


def test_a_run_limited_to_some_kinds_claims_no_success_for_the_phases_out_of_its_plan(instance, engine_url):
    """5. A run limited to contacts: the phases after its plan are not materialised (no event, the
    partition stays as it was; Dagster shows their steps skipped); companies, before a planned
    phase, must yield for Dagster to run that phase and says it was not planned, with no counts;
    the run succeeds."""
    from migration_pipeline.resources import NewRunOptions

    res = resources(engine_url, options=SMALL)
    res["new_run"] = NewRunOptions(kinds=["contacts"], options_json=res["new_run"].options_json)
    result = materialize_tenant(instance, "limited", res, raise_on_error=True)
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert set(md) == {"phase_1_companies", "phase_2_contacts"}, md.keys()
    assert md["phase_2_contacts"]["phase_status"].value == "closed"
    before = md["phase_1_companies"]
    assert before["phase_status"].value == "not in this run's plan" and "imported" not in before
    assert "nothing migrated" in before["note"].value
    # said first, in words, so the partition does not read as a migrated phase with every figure missing
    assert list(before)[0] == "run_kinds", list(before)
    assert before["run_kinds"].value.startswith("no kind of this phase in the run: companies not among "), before
    steps: dict[str, set[str]] = {}
    for e in result.all_events:
        if e.step_key and e.event_type_value in ("STEP_SUCCESS", "STEP_SKIPPED", "STEP_FAILURE"):
            steps.setdefault(e.event_type_value, set()).add(e.step_key)
    assert "STEP_FAILURE" not in steps
    # phase 3 ran and materialised nothing; Dagster skips the steps after it (shown as skipped, not green)
    assert "example__phase_3_deals" in steps["STEP_SUCCESS"]
    assert {"example__phase_4_activities", "example__phase_5_notes"} <= steps["STEP_SKIPPED"]
    # its checks (evaluated in the phase's own op since issue 11) say nothing of a phase not materialised
    checked = {e.asset_key.path[-1] for e in result.get_asset_check_evaluations()}
    assert checked == {"phase_1_companies", "phase_2_contacts"}, checked
