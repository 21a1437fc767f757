"""The plan is data: a provider declares its phases as an ordered list of kind groups.

Some kinds are opt-in (a provider's `opt_in_kinds`): their cost grows with the account (one call
per deal, per record, per file), so a run takes them only when asked. What a run is asked for is
a kinds choice (`choose_kinds`):

* nothing: the default kinds - every kind but the opt-in ones;
* `+name` / `-name` entries: the defaults with those kinds added or removed (`+deal_history`);
* plain names: exactly those kinds (an opt-in kind named is taken);
* `all`: every kind, the opt-in ones too.

Plain names and `+`/`-` entries do not mix: "persons,+deal_history" could mean either.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from engine_core.errors import ConfigError
from engine_core.models import Run
from engine_core.source import catchup_kind, opt_in_kinds

ALL = "all"
OPT_IN = "opt-in"
NOT_CHOSEN = "not chosen"


def plan_for(phases: Sequence[Sequence[str]], kinds: Iterable[str] | None = None) -> list[list[str]]:
    """The phases a run needs: the provider's groups limited to `kinds`, empty groups dropped."""
    if kinds is None:
        return [list(group) for group in phases if group]
    wanted = list(dict.fromkeys(kinds))
    known = {k for group in phases for k in group}
    unknown = [k for k in wanted if k not in known]
    if unknown:
        raise ConfigError(f"unknown kinds {unknown}; this source has {sorted(known)}")
    limited = [[k for k in group if k in wanted] for group in phases]
    return [group for group in limited if group]


def choose_kinds(phases: Sequence[Sequence[str]], choice: Iterable[str] | None,
                 opt_in: Collection[str] = ()) -> list[str] | None:
    """The kinds a run takes, in plan order, for a kinds `choice` (see the module: None, `+`/`-`
    entries, plain names, `all`); None when that is every kind (no opt-in kind, nothing chosen).

    Raises ConfigError (one line) naming every unknown kind with the kinds there are (checked
    first: a typo is the thing to fix), or when plain names and `+`/`-` entries are mixed, or when a
    kind is both added and removed (`+x,-x`), or when the choice leaves no kind."""
    every = [k for group in phases for k in group]
    entries = [str(e).strip() for e in (choice or ()) if str(e).strip()]
    if not entries:
        return [k for k in every if k not in opt_in] if opt_in else None
    names = [e.lstrip("+-").strip() for e in entries]
    unknown = [n for n in dict.fromkeys(names) if n not in every and n != ALL]
    if unknown:
        shown = ", ".join(every + [ALL])
        raise ConfigError(f"unknown kind{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"this source has {shown}")
    signed = [e for e in entries if e[0] in "+-"]
    if signed and len(signed) != len(entries):
        plain = [e for e in entries if e[0] not in "+-"]
        raise ConfigError(f"kinds {', '.join(plain)} and {', '.join(signed)}: give either plain kinds (exactly those) "
                          "or +kind/-kind (the defaults with those added or removed), not both")
    added = {n for e, n in zip(entries, names) if e[0] == "+"}
    both = [n for e, n in zip(entries, names) if e[0] == "-" and n in added]
    if both:
        raise ConfigError(f"{', '.join(dict.fromkeys(both))} {'is' if len(set(both)) == 1 else 'are'} both added and removed")
    if not signed:
        chosen = set(every) if ALL in names else set(names)
    else:
        chosen = {k for k in every if k not in opt_in}
        for entry, name in zip(entries, names):
            group = set(every) if name == ALL else {name}
            chosen = chosen | group if entry[0] == "+" else chosen - group
    if not chosen:
        raise ConfigError(f"kinds {', '.join(entries)} leave no kind to migrate")
    return [k for k in every if k in chosen]


def left_out(phases: Sequence[Sequence[str]], taken: Iterable[str], opt_in: Collection[str] = ()) -> dict[str, str]:
    """The kinds of `phases` a run did not take (`taken`: its plan's kinds), in plan order, each
    with why: "opt-in" (a kind a run takes only when asked) or "not chosen" (the run named other
    kinds)."""
    have = set(taken)
    return {k: (OPT_IN if k in opt_in else NOT_CHOSEN) for group in phases for k in group if k not in have}


# The same choice where the Dagster UI takes it: the `migrate_tenant` job's launchpad config (the
# `new_run` resource's `kinds`, migration_pipeline/resources). Said beside `--kinds`: whoever reads
# a `left_out` in the UI launches from there, not from a shell.
LAUNCHPAD_WAY = "or in the Dagster launchpad"
LAUNCHPAD_KINDS = "resources.new_run.config.kinds"


def left_out_lines(left: dict[str, str]) -> list[str]:
    """`left_out` as lines for people: what was left out, then how to add the opt-in kinds, from
    the command line and from the Dagster launchpad (its run config key), then how to add the kinds
    not chosen (a launch without kinds takes the default kinds the tenant lacks: `coverage`) and
    that links to them are owed until then (`owed_links`), e.g.
    ["left out: followers, participants (opt-in: taken only when asked); notes (not chosen)",
     "to add them: a run of those kinds alone, --kinds followers,participants",
     "or in the Dagster launchpad: resources.new_run.config.kinds: [followers, participants]",
     "to add notes: a run without --kinds (or the UI's Materialize) takes the default kinds the
     tenant lacks; links owed to them are filled by that run"];
    [] when nothing was left out.

    The lines are read after a run of the tenant, so they name the kinds alone (plain `--kinds`):
    the next run walks only them, and a sync keeps them from then on (`runs.synced_kinds`). `+kind`
    would walk every default kind again, every deal's mail listing included."""
    if not left:
        return []
    parts = []
    optional = [k for k, why in left.items() if why == OPT_IN]
    if optional:
        parts.append(f"{', '.join(optional)} ({OPT_IN}: taken only when asked)")
    others = [k for k, why in left.items() if why != OPT_IN]
    if others:
        parts.append(f"{', '.join(others)} ({NOT_CHOSEN})")
    lines = ["left out: " + "; ".join(parts)]
    if optional:
        lines.append(f"to add {'it' if len(optional) == 1 else 'them'}: a run of {'that kind' if len(optional) == 1 else 'those kinds'} "
                     f"alone, --kinds {','.join(optional)}")
        lines.append(f"{LAUNCHPAD_WAY}: {LAUNCHPAD_KINDS}: [{', '.join(optional)}]")
    if others:  # a launch without kinds takes the default kinds no succeeded run took (`coverage`)
        lines.append(f"to add {', '.join(others)}: a run without --kinds (or the UI's Materialize) takes the "
                     "default kinds the tenant lacks; links owed to them are "
                     "filled by that run")
    return lines


def left_out_line(left: dict[str, str]) -> str | None:
    """`left_out_lines` as one text of one to three lines (newline-separated: the command line prints
    it as is, the phase assets' `left_out` metadata holds it); None when nothing was left out."""
    return "\n".join(left_out_lines(left)) or None


def kinds_left_out(provider: object, run: Run, held: Collection[str] = ()) -> dict[str, str]:
    """The kinds of `provider` (its `phases()`) that `run` did not take, each with why (`left_out`);
    the catch-up kind is never left out, nor a kind in `held` (the tenant's other succeeded runs
    took it: `runs_reads.kinds_taken`; a run that took only the kinds its tenant lacked leaves none
    of them out)."""
    ck = catchup_kind(provider)
    phases = [[k for k in group if k != ck] for group in provider.phases()]  # type: ignore[attr-defined]
    return left_out(phases, [*run.kinds, *held], opt_in_kinds(provider))


def plan_number(phases: Sequence[Sequence[str]], run: Run, phase: int) -> int:
    """The number (from 1) of `run`'s phase `phase` (its index in the run's plan) in its provider's
    whole plan (`phases`: the provider's kind groups in order; empty ones are not phases), as the
    phase assets, `migrate status` and the progress lines number it: a run without the opt-in phase
    has 8 phases, and its catch-up is phase 9 (phase_9_catchup). `phase + 1` when no phase of
    `phases` holds its kinds."""
    kinds = set(run.plan[phase]) if 0 <= phase < len(run.plan) else set()
    groups = [g for g in phases if g]
    return next((i + 1 for i, group in enumerate(groups) if kinds & set(group)), phase + 1)
