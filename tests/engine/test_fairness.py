"""Sharing the lane: slots are split max-min fairly over the runs' demands, and a run's demand is its
in-flight pool (enqueued + running, which top-up caps at MAX_INFLIGHT), at most the lane width."""
from __future__ import annotations

import pytest

from engine_core import runs
from engine_core.fairness import fair_shares, run_demands
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST


def test_two_tenants_that_want_the_whole_lane_get_half_each() -> None:
    assert fair_shares({"a": 4, "b": 4}, 4) == {"a": 2, "b": 2}
    assert fair_shares({"a": 8, "b": 8, "c": 8}, 4, order=["b", "c", "a"]) == {"b": 2, "c": 1, "a": 1}


def test_what_one_tenant_cannot_use_goes_to_the_others() -> None:
    assert fair_shares({"a": 4, "b": 1}, 4) == {"a": 3, "b": 1}
    assert fair_shares({"a": 1, "b": 1}, 4) == {"a": 1, "b": 1}
    assert fair_shares({"a": 0, "b": 4}, 4) == {"a": 0, "b": 4}
    assert fair_shares({"a": 3}, 4) == {"a": 3}
    assert fair_shares({}, 4) == {}


def test_shares_never_exceed_the_lane_or_a_demand() -> None:
    for a in range(7):
        for b in range(7):
            for c in range(7):
                demands = {"a": a, "b": b, "c": c}
                shares = fair_shares(demands, 4)
                assert sum(shares.values()) == min(4, a + b + c)
                assert all(shares[t] <= demands[t] for t in demands)
                # max-min: no tenant below its demand has two fewer slots than another
                for t in demands:
                    if shares[t] < demands[t]:
                        assert all(shares[o] <= shares[t] + 1 for o in demands)


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="lane width"):
        fair_shares({"a": 1}, -1)
    with pytest.raises(ValueError, match="'a'"):
        fair_shares({"a": -2}, 4)


def test_demand_is_the_in_flight_pool_capped_at_the_width(db) -> None:
    big = runs.start_run(db, provider_for("counter"), "big", kinds=["k0"], options={"tasks": 20}, settings=FAST)
    small = runs.start_run(db, provider_for("counter"), "small", kinds=["k0"], options={"tasks": 1}, settings=FAST)
    stopped = runs.start_run(db, provider_for("counter"), "stopped", kinds=["k0"], options={"tasks": 20}, settings=FAST)
    runs.stop(db, stopped.id)
    found = {d.tenant_id: d for d in run_demands(db, FAST)}
    assert set(found) == {"big", "small"}
    assert found["big"].enqueued == FAST.max_inflight and found["big"].slots(FAST.lane_width) == FAST.lane_width
    assert found["small"].slots(FAST.lane_width) == 1
    assert found["big"].run_id == big.id and found["small"].run_id == small.id
