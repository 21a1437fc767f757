"""What the run shows while the budget waits: `waiting_state(db, account)` says why the
account's workers are not calling the source and until when - our share of the daily token budget
used, the daily budget spent (a daily 429), or a burst 429's pause - and `migrate status` prints it
(and `--json` carries it) while the run is live. A bad MIGRATE_DAILY_TOKEN_SHARE fails at start-up
naming the variable.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from engine_core import runs
from engine_core.budget import Budget
from engine_core.budget_waiting import waiting_state
from engine_core.config import ConfigError, check_environment, daily_token_share
from engine_core.db import Database
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST


def test_waiting_state_names_the_reason_and_the_time(db: Database) -> None:
    assert waiting_state(db, "nobody") == (None, None)  # no row yet
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, daily_share=0.8)
    budget.acquire()
    assert waiting_state(db, "acct") == (None, None)

    budget.note_rate_limited("burst", 30.0)
    state = waiting_state(db, "acct")
    assert state.kind == "burst" and "burst" in state.reason
    assert timedelta(seconds=25) < state.until - datetime.now(timezone.utc) <= timedelta(seconds=31)

    budget.note_rate_limited("share", 3600.0)  # the daily one wins: it is the longer wait
    state = waiting_state(db, "acct")
    assert state.kind == "daily_share" and "80% share" in state.reason
    assert timedelta(minutes=59) < state.until - datetime.now(timezone.utc) <= timedelta(minutes=61)


def test_migrate_status_shows_the_budget_waiting_and_until_when(db: Database, db_url: str, monkeypatch) -> None:
    from click.testing import CliRunner

    from migration_pipeline.cli.main import main
    from migration_pipeline.instance import to_url

    run = runs.start_run(db, provider_for("example"), "waiting-tenant", settings=FAST)
    budget = Budget(db, run.source, run.source_account, burst_limit=80)
    budget.acquire()
    budget.note_rate_limited("daily", 7200.0)
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    out = CliRunner().invoke(main, ["status", "waiting-tenant", "--json"])
    assert out.exit_code == 0, out.output
    waiting = json.loads(out.output)["budget_waiting"]
    assert "daily token budget" in waiting["reason"]
    until = datetime.fromisoformat(waiting["until"])
    assert timedelta(minutes=119) < until - datetime.now(timezone.utc) <= timedelta(minutes=121)
    text = CliRunner().invoke(main, ["status", "waiting-tenant"])
    assert text.exit_code == 0 and "waiting on the daily token budget" in text.output and "UTC" in text.output


@pytest.mark.parametrize("raw", ["0", "1.5", "eighty", "-0.2", "nan"])
def test_a_bad_daily_token_share_fails_at_start_up_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="MIGRATE_DAILY_TOKEN_SHARE"):
        check_environment({"MIGRATE_DAILY_TOKEN_SHARE": raw})
    assert daily_token_share({}) == 0.8
    assert daily_token_share({"MIGRATE_DAILY_TOKEN_SHARE": "1"}) == 1.0
