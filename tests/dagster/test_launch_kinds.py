"""A kind the launchpad's run config names that the source does not have is refused at launch, in
one line naming it and the kinds there are, not when phase 1 starts the engine run: the `new_run`
resource's `kinds` is typed with the source's kinds (`resources.kind_choices`), and the check is the
one the UI's launchRun makes (through its GraphQL against a code server, and
`validate_config_from_snap` on each job's serialized snapshot). Good choices (`+kind`, `-kind`,
plain names, `all`) pass and reach the engine as plain strings."""
from __future__ import annotations

from pathlib import Path

import pytest
from dagster._config import validate_config_from_snap
from dagster._core.snap import JobSnap
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql, infer_job_selector
from dagster_shared.serdes import deserialize_value, serialize_value

from engine_core.providers.registry import provider_for
from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import SYNC_JOB, TENANT_JOB
from migration_pipeline.launch.checks import pickable_kinds
from tests.dagster.support import tmpfs_instance

DEFINITIONS = Path(__file__).resolve().parents[2] / "migration_pipeline" / "definitions.py"
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
            ... on RunConfigValidationInvalid { errors { message } } ... on PythonError { message } } }"""


def _errors(source: str, job: str, kinds: list[str]) -> list[str]:
    snap = JobSnap.from_job_def(build_definitions(source).resolve_job_def(job))
    snap = deserialize_value(serialize_value(snap), JobSnap)  # as the UI holds it, from the code server
    result = validate_config_from_snap(snap.config_schema_snapshot, snap.mode_def_snaps[0].root_config_key,
                                       {"resources": {"new_run": {"config": {"kinds": kinds}}}})
    return [e.message for e in result.errors or ()]


@pytest.mark.parametrize("source, good, bad", [
    ("pipedrive", ["+deal_history", "-notes", "+all"], "histroy"),
    ("example", ["companies", "contacts"], "persons"),
])
@pytest.mark.parametrize("job", [TENANT_JOB, SYNC_JOB, "__ASSET_JOB"])
def test_an_unknown_kind_is_refused_at_launch_naming_it_and_the_kinds(source, good, bad, job):
    assert _errors(source, job, good) == []
    errors = _errors(source, job, [good[0], bad])
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert "kinds[1]" in errors[0] and errors[0].endswith(f"got {bad}"), errors[0]
    kinds = [k for group in pickable_kinds(provider_for(source)) for k in group]
    named = errors[0].split("(", 1)[1]
    assert all(f"{k}," in named or f"{k};" in named for k in kinds + ["all"]), errors[0]


def test_the_catch_up_is_no_kind_to_pick_at_launch():
    errors = _errors("pipedrive", TENANT_JOB, ["+catchup"])
    assert len(errors) == 1 and errors[0].endswith("got +catchup"), errors


def test_a_checked_choice_reaches_the_engine_as_plain_strings():
    options = build_definitions("pipedrive").resources["new_run"]
    typed = type(options)(kinds=["+deal_history", "-notes"])
    kinds = typed.start_kwargs()["kinds"]
    assert kinds == ["+deal_history", "-notes"] and all(type(k) is str for k in kinds), kinds


def test_the_launchpad_refuses_an_unknown_kind_before_any_run_exists(monkeypatch):
    monkeypatch.setenv("MIGRATE_SOURCE", "pipedrive")
    with tmpfs_instance() as instance, \
            define_out_of_process_context(str(DEFINITIONS), "defs", instance) as context:
        params = {"selector": infer_job_selector(context, TENANT_JOB),
                  "runConfigData": {"resources": {"new_run": {"config": {"kinds": ["persons", "histroy"]}}}},
                  "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "acme"}]}}
        out = execute_dagster_graphql(context, LAUNCH, variables={"params": params}).data["launchRun"]
        assert instance.get_runs_count() == 0
    assert out["__typename"] == "RunConfigValidationInvalid", out
    (error,) = [e["message"] for e in out["errors"]]
    assert "\n" not in error and error.endswith("got histroy") and "deal_history, all;" in error, error


def _launch(context, kinds: list[str]) -> dict:
    params = {"selector": infer_job_selector(context, TENANT_JOB),
              "runConfigData": {"resources": {"new_run": {"config": {"kinds": kinds}}}},
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "acme"}]}}
    return execute_dagster_graphql(context, LAUNCH, variables={"params": params}).data["launchRun"]


def test_the_launchpad_refuses_plain_kinds_mixed_with_plus_kinds_before_any_run_exists(monkeypatch):
    """Each entry alone is a good kind, so the UI's schema check passes; the code server judges the
    choice as a whole while it plans the run (`resources.KindsChoiceType`), before the run exists."""
    monkeypatch.setenv("MIGRATE_SOURCE", "pipedrive")
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PIPEDRIVE_API_TOKEN", "sandbox-token")
    with tmpfs_instance() as instance, \
            define_out_of_process_context(str(DEFINITIONS), "defs", instance) as context:
        mixed = _launch(context, ["persons", "+deal_history"])
        empty = _launch(context, ["-all"])
        assert instance.get_runs_count() == 0
    for out, line in ((mixed, "new_run kinds: kinds persons and +deal_history: give either plain kinds"),
                      (empty, "new_run kinds: kinds -all leave no kind to migrate")):
        assert out["__typename"] == "PythonError", out
        assert line in out["message"], out["message"]
