"""A phase is numbered as its asset is, in every line a run says of it: a run that leaves a phase
of the provider's plan out (the opt-in phase, or kinds not chosen) has fewer phases of its own, and
its catch-up's progress line had said "phase 8" beside the asset phase_9_catchup and `migrate
status`'s 9/9. The phase op's lines (progress, barrier, failures) and the engine's resume and retry
lines number by the provider's whole plan (`engine_core.plan.plan_number`)."""
from __future__ import annotations

from engine_core.models import Run
from engine_core.plan import plan_number
from engine_core.providers.registry import provider_for
from migration_pipeline.resources import NewRunOptions
from tests.dagster.support import SMALL, materialize_tenant, resources


def test_plan_number_is_the_assets_number():
    phases = provider_for("pipedrive").phases()
    run = Run(id=1, tenant_id="acme", source="pipedrive", source_account="a", status="running", current_phase=1,
              plan=(("users",), ("catchup",)), options={}, dry_run=False, cancel_requested=False)
    assert len([g for g in phases if g]) == 9
    assert [plan_number(phases, run, i) for i in range(2)] == [1, 9]
    assert plan_number([], run, 1) == 2  # a plan that does not hold the kinds: the run's own


def test_progress_lines_number_the_phase_as_its_asset(instance, engine_url, db, monkeypatch):
    from migration_pipeline.assets import phases

    monkeypatch.setattr(phases, "PROGRESS_SECONDS", 0.2)
    monkeypatch.setenv("MIGRATE_LAUNCH_THREADS", "1")  # one lane thread: the phase reports while it runs
    res = resources(engine_url, options={**SMALL, "row_delay": 0.02})
    res["new_run"] = NewRunOptions(kinds=["companies", "deals"], options_json=res["new_run"].options_json)
    result = materialize_tenant(instance, "numbered", res, raise_on_error=True,
                                selection=["example/phase_1_companies", "example/phase_2_contacts",
                                           "example/phase_3_deals"])
    lines = [r.user_message for r in instance.all_logs(result.run_id) if r.user_message.startswith("progress: phase")]
    deals = [ln for ln in lines if "(deals)" in ln]
    assert deals and all(ln.startswith("progress: phase 3 (deals)") for ln in deals), lines  # the run's 2nd phase
