"""`migrate run` imports Dagster with Python's cyclic collector paused (`cli.collector_paused`,
issue 11: ~0.85 s of collections per launch, measured with gc.callbacks); the collector must be on
again afterwards whatever happened, or a long run would never collect its cycles."""
from __future__ import annotations

import gc

import pytest

from migration_pipeline import cli


@pytest.fixture(autouse=True)
def _collector_restored():
    was_on = gc.isenabled()
    yield
    gc.unfreeze()
    if was_on:
        gc.enable()


def test_off_inside_on_after_with_what_was_made_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with cli.collector_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)


def test_on_again_after_an_error_and_nested_blocks_leave_it_to_the_outer_one():
    with pytest.raises(RuntimeError):
        with cli.collector_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()
    with cli.collector_paused():
        with cli.collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_launch_refused_before_dagster_leaves_the_collector_on():
    from engine_core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a valid tenant name"):
        cli.launch_through_dagster("not a tenant!", "pipedrive", {"resources": {}}, as_json=True)
    assert gc.isenabled()
