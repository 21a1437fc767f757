"""SandboxConfig parsing: option strings are validated and errors name the option and the value.

Pins the latency syntax (`none` | `realistic` | `realistic:<factor>`), the faults syntax (comma
list of `kind:rate`), the CLI round trip (`to_cli_args` -> `python -m pipedrive_sandbox` parser),
that run-time changes are limited to faults/latency/limits, and that the token is not in repr.
"""
from __future__ import annotations

import pytest

from pipedrive_sandbox import SandboxConfig
from pipedrive_sandbox.__main__ import build_parser, config_from_args
from pipedrive_sandbox.config import parse_faults, parse_latency


def test_defaults() -> None:
    c = SandboxConfig()
    assert (c.scale, c.seed, c.token, c.latency, c.faults) == ("tiny", 1, "sandbox-token", "none", "")
    assert (c.burst_limit, c.daily_budget, c.day_seconds, c.big_deal_messages, c.page_limit_max) == (80, None, 86400.0, None, 500)
    assert c.slow_seconds == 30.0


def test_from_options_parses_strings() -> None:
    c = SandboxConfig.from_options(
        scale="small", seed="42", latency="realistic:0.1", faults="503:0.05, drop:0.01,badrow:0.002",
        burst_limit="40", daily_budget="30000", day_seconds="60", big_deal_messages="1564",
    )
    assert c.seed == 42 and c.burst_limit == 40 and c.daily_budget == 30000 and c.day_seconds == 60.0
    assert c.latency_spec.profile == "realistic" and c.latency_spec.factor == pytest.approx(0.1)
    assert c.fault_spec.rate("503") == 0.05 and c.fault_spec.rate("badrow") == 0.002
    assert c.fault_spec.request_rates == (("503", 0.05), ("drop", 0.01))
    assert c.big_deal_messages == 1564
    assert SandboxConfig.from_options(daily_budget="none").daily_budget is None


@pytest.mark.parametrize(
    "options,needle",
    [
        ({"scale": "huge"}, "scale"),
        ({"seed": "x"}, "seed"),
        ({"latency": "fast"}, "latency"),
        ({"latency": "realistic:-1"}, "latency"),
        ({"latency": "realistic:abc"}, "latency"),
        ({"faults": "504:0.1"}, "faults"),
        ({"faults": "500"}, "faults"),
        ({"faults": "500:1.5"}, "faults"),
        ({"faults": "500:0.6,503:0.6"}, "faults"),
        ({"faults": "500:0.1,500:0.2"}, "faults"),
        ({"burst_limit": "0"}, "burst_limit"),
        ({"daily_budget": "-5"}, "daily_budget"),
        ({"day_seconds": "0"}, "day_seconds"),
        ({"page_limit_max": "abc"}, "page_limit_max"),
        ({"token": ""}, "token"),
        ({"token": "a b"}, "token"),
    ],
)
def test_bad_options_name_option_and_value(options: dict[str, str], needle: str) -> None:
    with pytest.raises(ValueError) as exc:
        SandboxConfig.from_options(**options)
    message = str(exc.value)
    assert needle in message
    value = next(iter(options.values()))
    if needle != "token" and value:
        assert value.split(",")[0].split(":")[0] in message


def test_latency_and_fault_parsers() -> None:
    assert str(parse_latency("none")) == "none"
    assert str(parse_latency("realistic")) == "realistic"
    assert str(parse_latency("realistic:0.25")) == "realistic:0.25"
    assert str(parse_faults("")) == "" and str(parse_faults("none")) == ""
    assert str(parse_faults("badjson:0.1,500:0.2")) == "500:0.2,badjson:0.1"


def test_cli_round_trip_and_runtime_changes() -> None:
    c = SandboxConfig.from_options(scale="small", seed=3, token="t0k", latency="realistic:0.5", faults="slow:0.1", daily_budget=100, big_deal_messages=7)
    ns = build_parser().parse_args(["--port", "0", *c.to_cli_args()])
    assert config_from_args(ns) == c
    changed = c.with_changes({"faults": "", "burst_limit": 5})
    assert changed.faults == "" and changed.burst_limit == 5 and changed.scale == "small"
    with pytest.raises(ValueError, match="scale"):
        c.with_changes({"scale": "tiny"})


def test_token_not_in_repr() -> None:
    c = SandboxConfig(token="very-secret-token")
    assert "very-secret-token" not in repr(c)
    assert "token" not in c.public_dict()
