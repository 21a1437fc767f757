"""Option types and option values of the command line: a finite number above 0 (`--timeout`,
`--live`), and `--options` with its numbers typed."""
from __future__ import annotations

import math
import re
from typing import Any

import click

from engine_core import runs_reads
from engine_core.plan import kinds_left_out, left_out
from engine_core.source import catchup_kind, opt_in_kinds
from engine_core.providers.registry import provider_for
from migration_pipeline.cli.output import fail


class AboveZero(click.ParamType):
    """A float option that must be finite and above 0 (`--timeout` seconds, `--live` changes per
    second): anything else - 0, -1, nan, inf, 1e400 (read as inf), "abc" - is one line naming the
    option and the value (`fail`: exit 2), at parse time, before anything is launched. click's
    FloatRange(min=0, min_open=True) refuses 0 and negatives but lets nan and inf through, and its
    refusal is click's usage block; `migrate run --timeout 0` (or -1) launched the run and at once
    cancelled it, leaving the tenant stopped, and `--timeout nan` never timed out. `what` names the
    unit in the message: "a number of seconds", "a rate ... changes per second"."""

    name = "float"

    def __init__(self, what: str = "a number of seconds above 0") -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The value as a float; `fail` (one line, exit 2) unless it is finite and above 0."""
        opt = param.opts[0] if param is not None and param.opts else "the value"
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            fail(f"{opt} must be {self.what}, got {value!r}")
        return number


SECONDS = AboveZero()
RATE = AboveZero("a rate above 0 changes per second")
_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def typed_options(options: dict[str, Any]) -> dict[str, Any]:
    """`--options` with every top-level value that is a string of a plain decimal number ("40",
    " 2.5 ", "-1") as that number (int, else float); everything else as given. The engine's checks
    already read such a string as its number (the provider's `burst_limit` and `fetch_threads`, the
    booleans' "1"/"0", `runs.margin_option`), so nothing changes for the run but what is stored:
    `{"burst_limit":"40"}` had been kept as the string "40" in the run's options.
    Not a number ("4a", "1e3", "nan") is left to those checks, which name the option."""
    typed: dict[str, Any] = {}
    for key, value in options.items():
        text = value.strip() if isinstance(value, str) else None
        if text is not None and _NUMBER_TEXT.fullmatch(text):
            value = float(text) if "." in text else int(text)
        typed[key] = value
    return typed


KINDS_HELP = ("which kinds a new run takes: nothing = the defaults (every kind but the opt-in ones); "
              "+kind/-kind = the defaults with kinds added or removed, e.g. +deal_history,+participants; "
              "plain names = exactly those, e.g. persons,deals; all = every kind. The catch-up phase always "
              "runs last; it is not a kind to pick")


def kinds_choice(value: str | None) -> list[str] | None:
    """`--kinds` as a list of entries (`engine_core.plan.choose_kinds` judges them), None when it
    was not given; `fail` (one line) when it names nothing (`--kinds ""` must not mean the
    defaults)."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if not entries:
        fail(f"--kinds names no kind ({value!r}); leave it out to migrate the default kinds")
    return entries


def left_out_of(run: Any, db: Any = None) -> dict[str, str]:
    """The kinds left out, each with why ("opt-in" or "not chosen"; `engine_core.plan.left_out`),
    by `run`'s source's provider: with `db`, the tenant's - the kinds neither `run` nor any
    succeeded run or sync of its tenant took (`runs_reads.kinds_taken`: a kind run alone on a
    migrated tenant leaves nothing out that the tenant has); without, `run`'s own. {} when the
    provider no longer loads."""
    try:
        provider = provider_for(run.source)
    except Exception:  # noqa: BLE001 - a source that no longer loads: nothing to say about it
        return {}
    if db is None:
        return kinds_left_out(provider, run)
    taken = set(run.kinds) | runs_reads.kinds_taken(db, run.tenant_id, run.source, succeeded_only=True)
    ck = catchup_kind(provider)
    phases = [[k for k in group if k != ck] for group in provider.phases()]
    return left_out(phases, taken, opt_in_kinds(provider))
