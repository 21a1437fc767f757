"""Bad configuration fails at start-up with the variable's name."""
from __future__ import annotations

import pytest

from engine_core.config import Settings
from engine_core.db import database_url
from engine_core.errors import ConfigError


@pytest.mark.parametrize("name,value", [("MIGRATE_LANE_WIDTH", "four"), ("MIGRATE_LANE_WIDTH", "0"),
                                        ("MIGRATE_STALE_LOCK_SECONDS", "soon"), ("MIGRATE_MAX_ATTEMPTS", "-1"),
                                        # 0 made every running task stale at once
                                        ("MIGRATE_STALE_LOCK_SECONDS", "0")])
def test_bad_settings_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: value})


def test_bad_database_url_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL"):
        database_url({"DATABASE_URL": "mysql://nope"})


def test_defaults() -> None:
    s = Settings.from_env({})
    assert (s.lane_width, s.max_inflight, s.stale_lock_seconds) == (4, 8, 120.0)


@pytest.mark.parametrize("name,value", [("MIGRATE_RETRY_BACKOFF_SECONDS", "nan"), ("MIGRATE_HEARTBEAT_SECONDS", "inf"),
                                        ("MIGRATE_LANE_INTERVAL_SECONDS", "0"), ("MIGRATE_QUEUE_TIMEOUT_SECONDS", "soon"),
                                        ("MIGRATE_SOURCE_DOWN_SECONDS", "abc"), ("MIGRATE_SOURCE_DOWN_SECONDS", "-1")])
def test_every_migrate_number_is_checked_with_its_name(name: str, value: str) -> None:
    from engine_core.config import check_environment

    with pytest.raises(ConfigError, match=name):
        check_environment({name: value})


@pytest.mark.parametrize("url", ["postgresql://u:secret@host:notaport/db", "postgresql://u:secret@[::1/db"])
def test_an_unparseable_database_url_names_the_variable_without_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match="DATABASE_URL") as caught:
        database_url({"DATABASE_URL": url})
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("value,expected", [("", True), ("1", True), ("On", True), ("0", False), ("false", False)])
def test_switches_read_one_and_zero(value: str, expected: bool) -> None:
    from engine_core.config import switch

    assert switch("MIGRATE_RUN_IN_PROCESS", {"MIGRATE_RUN_IN_PROCESS": value}) is expected


def test_a_bad_switch_fails_at_start_up_naming_the_variable() -> None:
    """Every command's start-up check (check_environment) refuses it, not only `migrate run`."""
    from engine_core.config import check_environment

    with pytest.raises(ConfigError, match=r"^MIGRATE_RUN_IN_PROCESS must be 1, true, yes or on \(.*\) or 0, false, no or off, got 'maybe'$"):
        check_environment({"MIGRATE_RUN_IN_PROCESS": "maybe"})
