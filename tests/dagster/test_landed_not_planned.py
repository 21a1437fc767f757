"""A phase's `all_rows_landed` check on a phase the tenant's latest run does not plan says so first,
as `kinds_add_up` and the phase's materialisation do (`not_planned_entries`: `run_kinds` starting
"no kind of this phase in the run", `phase_status` "not in this run's plan"), instead of a bare
pass of 0 skipped, 0 failed that read as the phase's rows all landed in this run."""
from __future__ import annotations

from migration_pipeline.assets.metadata import NO_KIND_IN_RUN
from migration_pipeline.resources import NewRunOptions
from tests.dagster.support import materialize_tenant, resources, tmpfs_instance


def _evaluations(result) -> dict[tuple[str, str], object]:
    return {(e.event_specific_data.asset_key.path[-1], e.event_specific_data.check_name): e.event_specific_data
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


def test_all_rows_landed_says_the_phase_was_not_in_the_run(db_url):
    with tmpfs_instance() as instance:
        assert materialize_tenant(instance, "acme", resources(db_url)).success
        res = resources(db_url)
        res["new_run"] = NewRunOptions(kinds=["companies", "contacts"], start_new=True)
        limited = materialize_tenant(instance, "acme", res)
        assert limited.success
        got = _evaluations(limited)
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
