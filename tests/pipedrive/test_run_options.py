"""A Pipedrive run's options are checked before the run exists (`provider.check_options`, called by
`runs.start_run`): the launchpad's `options_json` does not go through `migrate run`'s checks, and a
bad value stored with a run failed every one of its tasks, while every relaunch joined that run."""
from __future__ import annotations

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.errors import ConfigError
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.pipedrive.settings import OPTIONS


@pytest.mark.parametrize("options, message", [
    ({"burst_limit": "abc"}, "burst_limit must be an integer"),
    ({"fetch_threads": 0}, "fetch_threads must be at least 1"),
    ({"burst_limit": 80, "typo_limit": 5}, "unknown option 'typo_limit'"),
    ({"overwrite_matched": "sometimes"}, "overwrite_matched must be true or false"),
    ({"snapshot_margin_seconds": "soon"}, "snapshot_margin_seconds must be a number of seconds"),
    ({"token": "x"}, "never from run options"),
])
def test_a_bad_option_starts_no_run(db_url, options, message):
    provider = PipedriveProvider(base_url="http://127.0.0.1:9", token="tok")  # nothing is sent
    with dbmod.Database(db_url, max_size=2) as db:
        with pytest.raises(ConfigError, match=message):
            runs.start_run(db, provider, "theta", options=options)
        assert db.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == 0


def test_every_option_the_provider_takes_passes_with_a_good_value():
    good = {"base_url": "http://127.0.0.1:9", "burst_limit": 80, "fetch_threads": 2, "detect_deletes": "false",
            "overwrite_matched": True, "snapshot_margin_seconds": 0}
    assert set(good) == set(OPTIONS)
    PipedriveProvider(base_url="http://127.0.0.1:9", token="tok").check_options(good)


# A fresh user's NaN, Infinity (Python's json reads both) and 1e400 (read as inf) ended in a
# traceback (timedelta, int()); `burst_limit: true` was read as 1 and `fetch_threads: 1.5` cut to 1.
@pytest.mark.parametrize("options, message", [
    ({"snapshot_margin_seconds": float("nan")}, "snapshot_margin_seconds must be a number of seconds, got nan"),
    ({"snapshot_margin_seconds": float("inf")}, "snapshot_margin_seconds must be a number of seconds, got inf"),
    ({"snapshot_margin_seconds": -float("inf")}, "snapshot_margin_seconds must be a number of seconds"),
    ({"snapshot_margin_seconds": 1e15}, "snapshot_margin_seconds must be at most 31536000"),
    ({"burst_limit": float("inf")}, "burst_limit must be an integer, got inf"),
    ({"burst_limit": float("nan")}, "burst_limit must be an integer, got nan"),
    ({"burst_limit": True}, "burst_limit must be an integer, got True"),
    ({"fetch_threads": 1.5}, "fetch_threads must be an integer, got 1.5"),
    ({"fetch_threads": False}, "fetch_threads must be an integer, got False"),
    ({"fetch_threads": 65}, "fetch_threads must be at most 64, got 65"),
])
def test_a_number_that_is_not_a_sound_value_is_one_line(options, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        PipedriveProvider(base_url="http://127.0.0.1:9", token="tok").check_options(options)


def test_integral_floats_and_digit_strings_are_integers():
    from engine_core.providers.pipedrive.settings import SourceConfig

    cfg = SourceConfig.load({"burst_limit": 40.0, "fetch_threads": "4"}, {}, base_url="http://127.0.0.1:9", token="tok")
    assert (cfg.burst_limit, cfg.fetch_threads) == (40, 4)
    assert "64" in OPTIONS["fetch_threads"]


def test_a_base_url_option_serves_only_where_the_deployment_has_none_and_is_refused_when_it_disagrees():
    # A fresh user's --options base_url was ignored where PIPEDRIVE_BASE_URL was set (the Dagster
    # resource passes it as base_url=); made to win instead, it started runs whose identity was read
    # from the variable's company while the workers reached the option's, and stopped each of them
    # (SourceMismatch) for good. The workers reach the deployment's source; a disagreeing option is
    # refused before the run exists.
    from engine_core.models import Run
    from engine_core.providers.pipedrive.settings import ENV_BASE_URL, SourceConfig

    env = {ENV_BASE_URL: "http://env.example"}
    assert SourceConfig.load({"base_url": "http://option.example"}, {}, token="tok").base_url == "http://option.example"
    assert SourceConfig.load({"base_url": "http://option.example"}, env, token="tok").base_url == "http://env.example"
    assert SourceConfig.load({}, env, base_url="http://resource.example", token="tok").base_url == "http://resource.example"
    run = Run(1, "t", "pipedrive", "", "running", 0, (), {"base_url": "http://option.example"}, False, False)
    assert PipedriveProvider(run, token="tok", env={}).config().base_url == "http://option.example"

    refused = "the option base_url .http://option.example/api. disagrees with PIPEDRIVE_BASE_URL .http://env.example."
    with pytest.raises(ConfigError, match=refused):
        PipedriveProvider(token="tok", env=env).check_options({"base_url": "http://user:secret@option.example/api"})
    with pytest.raises(ConfigError, match="disagrees with PIPEDRIVE_BASE_URL .http://resource.example."):
        PipedriveProvider(base_url="http://resource.example", token="tok", env={}).check_options(
            {"base_url": "http://option.example"})
    PipedriveProvider(token="tok", env=env).check_options({"base_url": "http://env.example/"})  # the same one
    PipedriveProvider(token="tok", env={}).check_options({"base_url": "http://option.example"})  # nothing configured
    # a bad value is named where it came from, its credentials and query not shown
    with pytest.raises(ConfigError, match="^the option base_url must be an http"):
        SourceConfig.load({"base_url": "ftp://x"}, {}, token="tok")
    with pytest.raises(ConfigError, match="^the option base_url must be a base URL without a query") as info:
        PipedriveProvider(token="tok", env={}).check_options({"base_url": "http://127.0.0.1:9?api_token=leak123"})
    assert "leak123" not in str(info.value)


def test_a_burst_limit_beyond_any_the_budget_row_holds_is_one_line():
    # 1e20 was stored with the run and failed every task (integer out of range in the budget's row)
    with pytest.raises(ConfigError, match="^burst_limit must be at most 1000000, got 100000000000000000000"):
        PipedriveProvider(base_url="http://127.0.0.1:9", token="tok").check_options({"burst_limit": 1e20})
