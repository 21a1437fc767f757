"""A launchpad config giving only some fields of the Pipedrive source resource is a valid run config:
each field left out falls back to the variable the definitions bind (`PIPEDRIVE_BASE_URL`,
`PIPEDRIVE_API_TOKEN`), on its own, not all-or-nothing (Dagster's defaults for a resource built with
values sit on its whole `config`). With `PIPEDRIVE_BASE_URL` unset the URL is left to the provider's
rule (the variable, the run's `base_url` option, else one line naming the variable); with
`PIPEDRIVE_API_TOKEN` unset the launch is refused in one line naming it. The token's default is
`{env: PIPEDRIVE_API_TOKEN}`, so the job's snapshot (what the UI shows) never holds the token."""
from __future__ import annotations

import pytest
from dagster import Definitions, job, op, validate_run_config
from dagster._config import validate_config_from_snap
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.snap import JobSnap
from dagster_shared.serdes import serialize_value

from engine_core.errors import ConfigError
from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import SYNC_JOB, TENANT_JOB, VERIFY_JOB
from migration_pipeline.resources import LiteralSecret, PipedriveSource, UnsetSecretVariable, source_resource

URL, TOKEN, OTHER = "http://127.0.0.1:9", "sandbox-token-51c2", "other-account-token-9d04"


def _source(config: dict) -> dict:
    return {"resources": {"source": {"config": config}}}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", URL)
    monkeypatch.setenv("PIPEDRIVE_API_TOKEN", TOKEN)
    monkeypatch.setenv("OTHER_PIPEDRIVE_TOKEN", OTHER)
    return monkeypatch


def test_one_field_given_takes_the_other_from_its_variable(env):
    """Every job of the definitions that has the source: the code server's validation and
    resolution (`validate_run_config`) and the UI's (the job's serialized snapshot)."""
    defs = build_definitions("pipedrive")
    jobs = [j for j in defs.resolve_all_job_defs() if "source" in j.resource_defs]
    assert {VERIFY_JOB, TENANT_JOB, SYNC_JOB} <= {j.name for j in jobs}
    for one in jobs:
        snap = JobSnap.from_job_def(one)
        root = snap.mode_def_snaps[0].root_config_key
        for given, want in (({"api_token": {"env": "OTHER_PIPEDRIVE_TOKEN"}}, (URL, OTHER)),
                            ({"base_url": "http://127.0.0.1:10"}, ("http://127.0.0.1:10", TOKEN)),
                            ({}, (URL, TOKEN))):
            assert validate_config_from_snap(snap.config_schema_snapshot, root, _source(given)).success, (one.name, given)
            config = validate_run_config(one, _source(given))["resources"]["source"]["config"]
            assert (config["base_url"], config["api_token"]) == want, (one.name, given)
        with pytest.raises(LiteralSecret):  # a token typed alone is still refused
            validate_run_config(one, _source({"api_token": OTHER}))
        assert TOKEN not in serialize_value(snap) and OTHER not in serialize_value(snap)


@op(required_resource_keys={"source"})
def reach(context):  # noqa: ANN001 - Dagster reads the annotations, which are strings here
    """The base URL and rate-limit account (host and token fingerprint) the provider would use."""
    cfg = context.resources.source.provider().config()
    return cfg.base_url, cfg.account


@job
def reach_job() -> None:
    """One op on the project's source resource."""
    reach()


def _reach(run_config: dict) -> tuple[str, str]:
    defs = Definitions(jobs=[reach_job], resources={"source": source_resource("pipedrive")})
    result = defs.resolve_job_def("reach_job").execute_in_process(run_config=run_config)
    return result.output_for_node("reach")


def test_a_run_given_only_the_token_reaches_the_base_url_of_the_environment(env):
    other = PipedriveSource(base_url=URL, api_token=OTHER).provider().config().account
    assert _reach(_source({"api_token": {"env": "OTHER_PIPEDRIVE_TOKEN"}})) == (URL, other)
    mine = PipedriveSource(base_url="http://127.0.0.1:10", api_token=TOKEN).provider().config().account
    assert _reach(_source({"base_url": "http://127.0.0.1:10"})) == ("http://127.0.0.1:10", mine)


def test_unset_variables_leave_the_url_to_the_provider_and_refuse_the_token(env):
    env.delenv("PIPEDRIVE_BASE_URL")
    tenant = build_definitions("pipedrive").resolve_job_def(TENANT_JOB)
    config = validate_run_config(tenant, _source({"api_token": {"env": "OTHER_PIPEDRIVE_TOKEN"}}))
    source = PipedriveSource(**config["resources"]["source"]["config"])
    assert source.base_url is None
    with pytest.raises(ConfigError, match="^PIPEDRIVE_BASE_URL is not set"):
        source.provider().config()
    with pytest.raises(UnsetSecretVariable, match="base_url: the environment variable NOPE_URL is not set"):
        validate_run_config(tenant, _source({"base_url": {"env": "NOPE_URL"}}))  # a named variable never falls back
    env.delenv("PIPEDRIVE_API_TOKEN")
    with pytest.raises(UnsetSecretVariable) as info:
        validate_run_config(tenant, _source({"base_url": URL}))
    assert "PIPEDRIVE_API_TOKEN is not set" in str(info.value) and len(str(info.value).splitlines()) == 1
    with pytest.raises(DagsterInvalidConfigError):  # fields still typed: a number is no URL
        validate_run_config(tenant, _source({"base_url": 5}))
