"""A Pipedrive token typed literally into the launchpad's run config is refused at launch, before the
run exists, so it is never stored (the run's config is kept in Dagster's `runs` table and shown under
"View tags and config"): the source resource's `api_token` takes only `{env: VAR}`
(`resources.EnvOnlyStringSource`), and `new_run`'s `options_json` is judged by the provider's
`check_options` there (`resources.CheckedOptionsJson`), which refuses a token among the options. The launch goes through the UI's launchRun (GraphQL against a code
server); the refusal is one line naming the field, never the token, with no stack trace beneath it. `{env: VAR}` with VAR unset
is one line naming the field and the variable (`resources.UnsetSecretVariable`). `{env: PIPEDRIVE_API_TOKEN}`, the
default, still launches, and a PipedriveSource built in Python with a token (as tests do) still works."""
from __future__ import annotations

from pathlib import Path

import pytest
from dagster import Definitions, EnvVar, job, op
from dagster._config import field_utils, validate_config, validate_config_from_snap
from dagster._config.post_process import post_process_config
from dagster._core.snap import JobSnap
from dagster_shared.serdes import deserialize_value, serialize_value
from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql, infer_job_selector

from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import SYNC_JOB, TENANT_JOB, VERIFY_JOB
from migration_pipeline.resources import LiteralSecret, PipedriveSource, new_run_options
from tests.dagster.support import tmpfs_instance

DEFINITIONS = Path(__file__).resolve().parents[2] / "migration_pipeline" / "definitions.py"
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
            ... on RunConfigValidationInvalid { errors { message } } ... on PythonError { message stack } } }"""
SECRET = "customer-secret-7f3a"
LINE = ("resources.source.config.api_token: give the environment variable that holds the token "
        "({env: PIPEDRIVE_API_TOKEN}), not the token itself: a run's config is stored and shown")

UNSET = ("resources.source.config.api_token: the environment variable NOPE_VAR is not set where the code server "
         "runs (`migrate ui`'s environment); set it there, or give {env: PIPEDRIVE_API_TOKEN}")


def _source(token: object) -> dict:
    return {"resources": {"source": {"config": {
        "api_token": token, "base_url": {"env": "PIPEDRIVE_BASE_URL"}, "source": "pipedrive"}}}}


def _launch(context, job: str, token: object) -> dict:
    params = {"selector": infer_job_selector(context, job), "runConfigData": _source(token),
              "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "acme"}]}}
    return execute_dagster_graphql(context, LAUNCH, variables={"params": params}).data["launchRun"]


def test_the_launchpad_refuses_a_literal_token_before_any_run_exists(monkeypatch):
    monkeypatch.setenv("MIGRATE_SOURCE", "pipedrive")
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PIPEDRIVE_API_TOKEN", "sandbox-token")
    with tmpfs_instance() as instance, \
            define_out_of_process_context(str(DEFINITIONS), "defs", instance) as context:
        outs = {job: _launch(context, job, SECRET) for job in (VERIFY_JOB, TENANT_JOB, SYNC_JOB, "__ASSET_JOB")}
        unset = _launch(context, TENANT_JOB, {"env": "NOPE_VAR"})
        in_options = {"selector": infer_job_selector(context, TENANT_JOB),
                      "runConfigData": {"resources": {"new_run": {"config": {"options_json": f'{{"api_token": "{SECRET}"}}'}}}},
                      "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "acme"}]}}
        options = execute_dagster_graphql(context, LAUNCH, variables={"params": in_options}).data["launchRun"]
        assert instance.get_runs_count() == 0
        assert SECRET not in repr(instance.get_runs())
    for job, out in outs.items():
        assert out["__typename"] == "PythonError", (job, out)
        assert out["message"] == LINE, (job, out["message"])
    assert options["__typename"] == "PythonError" and SECRET not in options["message"], options
    # the launchpad shows a PythonError's stack beneath its message: each refusal is its one line alone
    assert [out["stack"] for out in (*outs.values(), unset, options)] == [[]] * (len(outs) + 2)
    # a variable that is not set: one line naming it, not StringSource's PostProcessingError and its stack trace
    assert unset["__typename"] == "PythonError", unset
    assert UNSET in unset["message"] and len(unset["message"].strip().splitlines()) == 1, unset["message"]
    assert "PostProcessingError" not in unset["message"] and "Traceback" not in unset["message"], unset["message"]
    assert ("resources.new_run.config.options_json: the API token comes from PIPEDRIVE_API_TOKEN, never from run "
            "options (found option 'api_token')") in options["message"], options["message"]


def test_every_job_taking_the_source_refuses_a_literal_token_and_takes_an_env_var(monkeypatch):
    """What the code server does while it plans any job's run, for every job of the definitions
    that has the source resource (schedules, sensors and the CLI launch these same jobs)."""
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PIPEDRIVE_API_TOKEN", "sandbox-token")
    defs = build_definitions("pipedrive")
    jobs = [j for j in defs.resolve_all_job_defs() if "source" in j.resource_defs]
    assert {VERIFY_JOB, TENANT_JOB, SYNC_JOB} <= {j.name for j in jobs}
    for job in jobs:
        schema = job.run_config_schema.config_type
        source = schema.fields["resources"].config_type.fields["source"].config_type
        with pytest.raises(LiteralSecret) as info:
            post_process_config(source, {"config": _source(SECRET)["resources"]["source"]["config"]})
        assert str(info.value) == LINE, (job.name, str(info.value))
        good = post_process_config(source, {"config": _source({"env": "PIPEDRIVE_API_TOKEN"})["resources"]["source"]["config"]})
        assert good.success and good.value["config"]["api_token"] == "sandbox-token", (job.name, good)
        default = post_process_config(source, None)
        assert default.success and default.value["config"]["api_token"] == "sandbox-token", (job.name, default)
        new_run = schema.fields["resources"].config_type.fields["new_run"].config_type
        for options in ('{"burst_limit": 40, "detect_deletes": false}', "{}", None):  # good options launch
            taken = post_process_config(new_run, {"config": {"options_json": options}})
            assert taken.success and taken.value["config"]["options_json"] == options, (job.name, taken)


def test_the_ui_sees_the_same_fields_and_python_built_sources_keep_their_token():
    """The UI validates a launch against the job's serialized snapshot: the checked fields keep
    StringSource's type there, and every Shape the snapshot names is in it (the checked Shapes are
    copies of Shapes whose snapshot Dagster may have cached already, here on purpose)."""
    for plain in (new_run_options("pipedrive")(), PipedriveSource(base_url=EnvVar("A"), api_token=EnvVar("B"))):
        assert plain._config_schema.config_type.snapshot  # noqa: SLF001
    tenant_job = build_definitions("pipedrive").resolve_job_def(TENANT_JOB)
    for resource in ("new_run", "source"):  # Dagster's message for a bad entry walks the checked Shapes' snapshots
        result = validate_config(tenant_job.run_config_schema.config_type,
                                 {"resources": {resource: {"config": {"no_such_field": 1}}}})
        assert 'unexpected config entry "no_such_field"' in result.errors[0].message, result.errors
    snap = JobSnap.from_job_def(tenant_job)
    snap = deserialize_value(serialize_value(snap), JobSnap)
    types = {t.key: t for t in snap.config_schema_snapshot.all_config_snaps_by_key.values()}
    assert "StringSourceType" in types and not any("EnvOnly" in k or "Checked" in k for k in types)
    config = {**_source(SECRET), "resources": {**_source(SECRET)["resources"],
                                               "new_run": {"config": {"options_json": '{"api_token": "x"}'}}}}
    result = validate_config_from_snap(snap.config_schema_snapshot, snap.mode_def_snaps[0].root_config_key, config)
    assert result.success, result.errors  # the UI passes it on; the code server refuses it (above)
    built = PipedriveSource(base_url="http://127.0.0.1:9", api_token=SECRET)
    field = built._config_schema.as_field()  # noqa: SLF001
    out = post_process_config(field.config_type, field.default_value)
    assert out.success and out.value["api_token"] == SECRET


def test_a_source_built_elsewhere_with_the_same_defaults_does_not_unguard_the_definitions(monkeypatch):
    """Dagster memoizes a config Shape by a key made of its fields' keys and defaults: a plain
    PipedriveSource with the same EnvVar defaults, built first in the process, must not lend its
    unchecked Shape to the project's jobs."""
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setattr(field_utils, "FIELD_HASH_CACHE", {})  # as in a fresh process
    plain = PipedriveSource(base_url=EnvVar("PIPEDRIVE_BASE_URL"), api_token=EnvVar("PIPEDRIVE_API_TOKEN"))

    @op(required_resource_keys={"source"})
    def touch(context) -> None:
        """Needs the source, so the job's run config has it."""

    @job
    def plain_job() -> None:
        """One op on the plain source."""
        touch()

    Definitions(jobs=[plain_job], resources={"source": plain}).resolve_job_def("plain_job").run_config_schema
    verify = build_definitions("pipedrive").resolve_job_def(VERIFY_JOB)
    source = verify.run_config_schema.config_type.fields["resources"].config_type.fields["source"].config_type
    with pytest.raises(LiteralSecret):
        post_process_config(source, {"config": _source(SECRET)["resources"]["source"]["config"]})
