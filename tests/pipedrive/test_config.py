"""Configuration and the token: a missing variable fails at start-up with its name and admits no
run; the token is never in run options, the database, the logs, an exception or a repr - not after
a whole run, and not when the source rejects it."""
from __future__ import annotations

import logging
import os

import pytest

from engine_core import runs
from engine_core.errors import ConfigError
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN, SourceConfig
from tests.pipedrive.support import FAST, TOKEN, failed_tasks, migrate, sandbox

SECRET = "pd-SECRET-token-5c2e9a71b0d4"


def test_a_missing_variable_fails_at_start_up_with_its_name(db, monkeypatch) -> None:
    monkeypatch.delenv(ENV_BASE_URL, raising=False)
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    with pytest.raises(ConfigError, match=ENV_BASE_URL):
        runs.start_run(db, PipedriveProvider(), "acme", settings=FAST)
    monkeypatch.setenv(ENV_BASE_URL, "http://127.0.0.1:9")
    with pytest.raises(ConfigError, match=ENV_TOKEN):
        runs.start_run(db, PipedriveProvider(), "acme", settings=FAST)
    assert db.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == 0
    # seeding and the plan need no configuration (the reaper and the Dagster face read them)
    assert PipedriveProvider(env={}).phases()


def test_the_token_never_comes_from_run_options() -> None:
    with pytest.raises(ConfigError, match="never from run options"):
        SourceConfig.load({"api_token": "x"}, {ENV_BASE_URL: "http://x", ENV_TOKEN: "y"})
    config = SourceConfig.load({}, {ENV_BASE_URL: "https://api.example", ENV_TOKEN: SECRET})
    assert SECRET not in repr(config) and SECRET not in config.account
    assert SECRET not in repr(PipedriveProvider(token=SECRET, base_url="https://api.example"))


def test_a_bad_value_is_named_where_it_came_from_and_shown_without_credentials() -> None:
    # a fresh user's PIPEDRIVE_BURST_LIMIT=0 said "burst_limit must be at least 2", and a base URL
    # without a scheme did not show the value
    env = {ENV_BASE_URL: "https://api.example", ENV_TOKEN: "y"}
    with pytest.raises(ConfigError, match="^PIPEDRIVE_BURST_LIMIT must be at least 2, got 0$"):
        SourceConfig.load({}, {**env, "PIPEDRIVE_BURST_LIMIT": "0"})
    with pytest.raises(ConfigError, match="^burst_limit must be at least 2, got 1$"):
        SourceConfig.load({"burst_limit": 1}, env)
    with pytest.raises(ConfigError, match="must be an http\\(s\\) URL, got 'not-a-url'$"):
        SourceConfig.load({}, {**env, ENV_BASE_URL: "not-a-url"})
    with pytest.raises(ConfigError) as e:
        SourceConfig.load({}, {**env, ENV_BASE_URL: f"user:{SECRET}@api.example"})
    assert SECRET not in str(e.value) and "api.example" in str(e.value)


def _database_text_with(db, needle: str) -> list[str]:
    tables = db.sql(
        "SELECT table_schema || '.' || table_name AS t FROM information_schema.tables"
        " WHERE table_schema IN ('public', 'crm') AND table_type = 'BASE TABLE'"
    )
    found = []
    for row in tables:
        n = db.sql(f"SELECT count(*) AS n FROM {row['t']} x WHERE x::text LIKE %(p)s", {"p": f"%{needle}%"})[0]["n"]
        if n:
            found.append(row["t"])
    return found


def test_the_token_is_stored_nowhere_after_a_run(db, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with sandbox(token=SECRET) as sb:
        run = migrate(db, sb, "acme")
    assert run.status == "succeeded"
    assert _database_text_with(db, SECRET) == []
    assert SECRET not in caplog.text


def test_a_rejected_token_fails_the_run_without_repeating_it(db, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with sandbox(token=TOKEN) as sb:
        os.environ[ENV_TOKEN] = SECRET  # not the sandbox's: every request is refused (restored on exit)
        run = migrate(db, sb, "acme", kinds=["users"])
    assert run.status == "failed"
    errors = [t["error"] for t in failed_tasks(db, run.id)]
    assert errors and all("AuthError" in e for e in errors)
    assert _database_text_with(db, SECRET) == []
    assert SECRET not in caplog.text


def test_a_worker_reaching_another_company_claims_nothing_and_a_rotated_token_carries_on(db) -> None:
    """The run records the company its token reaches (`/v1/users/me`). A worker whose settings reach
    another company - the environment's token, for a tenant launched with another customer's - claims
    nothing: its listings would put that company's rows in this tenant. A rotated token of the same
    company is another budget account but the same source, and the run carries on with it."""
    from engine_core.errors import SourceMismatch
    from engine_core.worker import Worker
    from pipedrive_sandbox import SandboxConfig, SandboxServer
    from tests.pipedrive.support import UNLIMITED, ledger, start

    with sandbox() as sb, SandboxServer(SandboxConfig(scale="tiny", seed=2, token=TOKEN, burst_limit=UNLIMITED)) as other:
        run = start(db, sb, "acme", kinds=["users", "organizations"])
        company = sb.client.get("/v1/users/me", headers={"x-api-token": TOKEN}).json()["data"]["company_id"]
        assert runs.get_run(db, run.id).source_identity == f"pipedrive company {company}"

        elsewhere = Worker(db, settings=FAST, providers=lambda r: PipedriveProvider(r, base_url=other.base_url, token=TOKEN))
        with pytest.raises(SourceMismatch) as info:
            elsewhere.drain(run.id)
        assert str(company) in str(info.value) and TOKEN not in str(info.value)
        assert set(other.stats()["requests"]) == {"/v1/users/me"}, "nothing but the question was asked of the other company"
        assert db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status <> 'pending'",
                      {"r": run.id})[0]["n"] == 0

        sb.configure(token="rotated-token")
        rotated = PipedriveProvider(run, base_url=sb.base_url, token="rotated-token")
        assert rotated.account() != PipedriveProvider(run, base_url=sb.base_url, token=TOKEN).account()
        result = Worker(db, settings=FAST, providers=lambda r: PipedriveProvider(r, base_url=sb.base_url, token="rotated-token")).drain(run.id)
        truth = sb.truth()
    assert result.reason == "succeeded", failed_tasks(db, run.id)
    assert set(ledger(db, "acme", "users")) == {str(i) for i in truth["ids"]["users"]}
