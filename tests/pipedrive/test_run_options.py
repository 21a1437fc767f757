"""A Pipedrive run's options are checked before the run exists (`provider.check_options`, called by
`runs.start_run`): the launchpad's `options_json` does not go through `migrate run`'s checks, and a
bad value stored with a run failed every one of its tasks, while every relaunch joined that run."""
from __future__ import annotations

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.errors import ConfigError
from engine_core.providers.pipedrive.provider import OPTIONS, PipedriveProvider


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
