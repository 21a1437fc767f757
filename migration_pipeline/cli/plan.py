"""`migrate plan TENANT`: what a full run will cost at the source before it starts - requests,
tokens and days of the daily budget per kind, the total, the wall time, and each opt-in kind's
price. The wall time is the longer of the burst floor and the round trips the plan's own requests
measured (`Estimate.wall_seconds`). The figures are the provider's (`PipedriveProvider.estimate`);
this module only shows them."""
from __future__ import annotations

import textwrap

import json
from collections.abc import Sequence
from typing import Any

import click

from engine_core import db as dbmod
from engine_core import ledger_reads, runs, runs_reads
from engine_core.coverage import coverage
from engine_core.errors import ConfigError
from engine_core.plan import choose_kinds, plan_number
from engine_core.providers.registry import provider_for
from engine_core.source import opt_in_kinds
from migration_pipeline.cli.options import KINDS_HELP, kinds_choice
from migration_pipeline.cli.output import emit, fail, open_db
from migration_pipeline.launch.checks import check_source_token, check_tenant, unlinked_kinds


def _days(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _wall(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def wall_line(est: Any) -> str:
    """The wall time line: about the longer of the round trips (at the medians the plan's own
    requests measured, `est.round_trips`, over the requests a run keeps in flight) and the burst
    floor, with both said."""
    trips = est.round_trips
    measured = ", ".join(f"{name} {trips[key]:.2f} s" for key, name in
                         (("list", "a list page"), ("single", "a record by id"), ("body", "a mail body"))
                         if key in trips)
    return (f"wall time: about {_wall(est.wall_seconds)} (round trips as this plan measured them: {measured}; "
            f"about {est.in_flight:.0f} requests in flight: {_wall(est.trip_seconds)}; "
            f"the burst limit, {est.burst_limit} per 2 s: {_wall(est.burst_seconds)})")


def plan_lines(est: Any, opt_in: bool = True) -> list[str]:
    """The plan as lines of text: a row per kind, the total, the burst floor, the opt-in kinds
    (not with `opt_in` False: a run that is resumed keeps its kinds, no --kinds adds one)."""
    lines = [f"{'kind':<16}{'rows':>10}  {'requests':>9}{'tokens':>11}{'days':>8}"]
    for k in est.kinds:
        rows = f"{'' if k.exact else '~'}{k.rows:,}"
        unit = getattr(k, "unit", "rows")  # a count of something else than rows says what it counts
        lines.append(f"{k.kind:<16}{rows:>10}  {k.requests:>9,}{k.tokens:>11,}{_days(k.days):>8}"
                     + ("" if unit == "rows" else f"  ({k.rows:,} {unit}: the run counts the definitions in them)"))
    lines.append(f"{'total':<16}{'':>10}  {est.requests:>9,}{est.tokens:>11,}{_days(est.days):>8}")
    limit = (f"{est.daily_limit:,} tokens a day (x-daily-ratelimit-token-limit) x {est.share:.0%} share"
             if est.daily_limit else "no daily token limit reported by the source: days not known")
    lines.append(f"budget: {limit}")
    lines.append(wall_line(est))
    for k in est.opt_in if opt_in else ():
        days = (f"+{k.days:.2f} days" if k.days is not None else "days unknown without the account's daily limit")
        lines.append(f"opt-in {k.kind}: +{k.requests:,} requests, +{k.tokens:,} tokens, {days} "
                     f"(add with --kinds +{k.kind})")
    lines.append(f"this plan asked {est.spent.get('requests', 0)} requests ({est.spent.get('tokens', 0)} tokens) "
                 "to count; ~ marks an estimated count")
    return lines


def next_is_sync(tenant: str, provider: Any, chosen: list[str] | None, missing: str | None) -> dict[str, Any] | None:
    """When `tenant`'s next run is a sync - its succeeded full runs (no dry run) already took the
    kinds asked for (`chosen`; None: the defaults; `runs.migrated_by`), so `migrate run` would
    refuse it - {"kinds": the kinds a sync takes (`runs.synced_kinds`), "by": the id of the run
    that migrated it, "last_sync": {"run_id", "requests", "tokens"} of its latest sync or None};
    else None (a tenant not migrated yet: its next run is a full run). `missing`: `missing_embedded()`
    as the command read it once - no embedded database under MIGRATE_HOME: nothing was migrated
    there, and none is made (initdb) or started to say so."""
    if missing:
        return None
    with open_db() as db:
        by = runs.migrated_by(db, tenant, provider, {"kinds": chosen, "dry_run": False})
        if by is None:
            return None
        latest = runs.latest_run(db, tenant, provider.source)
        last = ({"run_id": latest.id, **runs_reads.run_cost(db, latest.id)} if latest.mode == "sync" else None)
        return {"kinds": runs.synced_kinds(db, tenant, provider) or list(by.kinds), "by": by.id, "last_sync": last}


def next_covers(tenant: str, provider: Any, chosen: list[str] | None, missing: str | None) -> Any:
    """When the tenant's succeeded full runs took some of the kinds asked for (`chosen`; None: the
    defaults) and not all: the `coverage.Coverage` by which `migrate run` takes only the others
    (`runs.attach`), so the plan prices only those (`Coverage.lacking`); else None. `missing`: as
    `next_is_sync`'s."""
    if missing:
        return None
    with open_db() as db:
        covered = coverage(db, tenant, provider, {"kinds": chosen, "dry_run": False})
    return covered if covered is not None and covered.partial else None


def next_is_existing(tenant: str, provider: Any, missing: str | None) -> Any:
    """The run `tenant`'s next `migrate run` works on instead of starting one, as the launch decides
    it (`runs.existing_attachment`: its live run, joined, else its latest run when that was stopped
    - resumed - or failed - retried; with --new-run and --kinds alike, which a stopped or failed run
    ignores), as an `Attached`; None when the next run is a new one. `missing`: as `next_is_sync`'s."""
    if missing:
        return None
    with open_db() as db:
        return runs.existing_attachment(db, tenant, provider.source)


def kinds_left(run: Any, skip: tuple[str, ...] = ("catchup",), from_phase: int | None = None) -> list[str]:
    """The kinds of `run`'s phases that have not closed (its current phase and those after it:
    `run.current_phase`, 0-based, over `run.plan`; `from_phase` 0: every phase's), each once,
    without the `skip` kinds (the catch-up, which `migrate plan` prices as its own line): what
    resuming the run still reads."""
    start = run.current_phase if from_phase is None else from_phase
    left = [k for group in run.plan[start:] for k in group if k not in skip]
    return list(dict.fromkeys(left))


def existing_words(tenant: str, existing: Any, left: list[str], phases: Sequence[Sequence[str]] = ()) -> list[str]:
    """The plan's headline for a tenant whose next launch works on an existing run (`next_is_existing`):
    which run, what the launch does with it (joins, resumes, retries), that --new-run and --kinds do
    not change that, and what the figures below are (the kinds of its phases not closed yet). The
    phase is numbered in the provider's whole plan (`phases`, `plan.plan_number`), as the phase
    assets and `migrate status` number it; without `phases`, in the run's own plan."""
    run = existing.run
    command = f"migrate sync {tenant}" if run.is_sync else f"migrate run --tenant {tenant}"
    # numbered as the phase assets and `migrate status` number it ("phase 7 of 9", not "7 of 8" for
    # a run without the opt-in phase)
    groups = [g for g in phases if g] or run.plan
    at = f"at phase {plan_number(groups, run, min(run.current_phase, len(run.plan) - 1))} of {len(groups)}"
    does = {"joined": f"joins the running run #{run.id} ({at})",
            "rerun": (f"resumes the stopped run #{run.id} where it stopped ({at}, each task from its checkpoint)"
                      if run.status in ("stopped", "stopping") else
                      f"retries the failed run #{run.id}'s failed tasks and goes on ({at})")}[existing.action]
    dry = "; a dry run: it writes nothing" if run.dry_run else ""
    lines = [f"plan for {tenant}: the next `{command}` {does}{dry}; --new-run and --kinds do not change "
             f"that: a run is started anew only once run #{run.id} has succeeded"]
    if left:
        lines.append(f"what is left of it: the kinds of its phases not closed yet ({', '.join(left)}), each "
                     "counted whole below (the checkpoints of the phase it is in make that phase's part less), "
                     "with a run's start and catch-up")
    else:
        lines.append("what is left of it: its catch-up; the figures below are a run's start and catch-up")
    return lines


def run_words(entries: list[str] | None, planned: list[str]) -> str:
    """What a run of `--kinds` `entries` takes, in words, each kind said once: "the default kinds"
    (no entries), "the default kinds and deal_history, without notes" (+kind/-kind), "every kind"
    (all), else the
    `planned` kinds themselves ("persons, deals")."""
    if entries is None:
        return f"the default kinds ({len(planned)} kinds; the opt-in kinds below are left out)"
    if entries == ["all"]:
        return f"every kind ({len(planned)} kinds)"
    if all(e[:1] in "+-" for e in entries):
        added = [e[1:] for e in entries if e[0] == "+"]
        removed = [e[1:] for e in entries if e[0] == "-"]
        return ("the default kinds" + (f" and {', '.join(added)}" if added else "")
                + (f", without {', '.join(removed)}" if removed else "") + f" ({len(planned)} kinds)")
    return ", ".join(planned)


@click.command("plan")
@click.argument("tenant")
@click.option("--kinds", default=None, help=KINDS_HELP)
@click.option("--json", "as_json", is_flag=True)
def plan_cmd(tenant: str, kinds: str | None, as_json: bool) -> None:
    """What migrating TENANT will cost at the source (Pipedrive, from the environment's settings),
    before any run: per kind the rows, requests, tokens and days of the daily budget, the total,
    and the wall time (round trips and burst limit); opt-in kinds with their price. A tenant whose
    next `migrate run` works on an existing run (stopped: resumed, failed: retried, running:
    joined; --new-run and --kinds alike) gets that run named and what is left of it priced; one
    migrated for some of the kinds asked for gets the line `migrate run` gives and only the kinds
    it lacks priced (`next_covers`)."""
    check_tenant(tenant, "TENANT")
    provider = provider_for("pipedrive")
    phases = [k for group in provider.phases() for k in group if k != "catchup"]
    try:
        chosen = choose_kinds([phases], kinds_choice(kinds), opt_in_kinds(provider))
    except ConfigError as e:  # as `migrate run` says it (`launch.checks.check_kinds`)
        fail(f"--kinds: {e}")
    planned = chosen if chosen is not None else phases
    missing = dbmod.missing_embedded()  # read once: nothing migrated under MIGRATE_HOME, and no database made to say so
    migrated = next_is_sync(tenant, provider, chosen, missing)
    if migrated is not None:  # the next run is the sync, of the kinds the tenant's runs took
        planned = migrated["kinds"]
    # a run the next launch works on (stopped: resumed, failed: retried, running: joined): what is left of it
    existing = next_is_existing(tenant, provider, missing) if migrated is None else None
    # some kinds asked for are migrated: the run takes only the others, and the plan prices those
    covers = next_covers(tenant, provider, chosen, missing) if migrated is None and existing is None else None
    if covers is not None:
        planned = list(covers.lacking)
    walked = None  # the kinds the catch-up walks: a resumed run's catch-up walks every list of the run
    if existing is not None:
        planned, walked = kinds_left(existing.run), kinds_left(existing.run, from_phase=0)
    provider.config()  # a missing or bad setting: one line naming it (ConfigError)
    check_source_token(provider)  # a refused token: the line `migrate run` and `migrate verify` give
    if not as_json:  # the counting is paced to half the burst: under real latency it takes half a minute
        click.echo("asking the source for its counts (a few cheap requests, paced to half the burst limit) ...",
                   err=True)
    try:
        est = provider.estimate(planned, walked=walked)
    except Exception as e:  # noqa: BLE001 - the source's own errors: one line, never a traceback
        fail(f"plan {tenant!r}: the pipedrive source failed: {type(e).__name__}: {e}")
    payload = {"tenant": tenant, "requests": est.requests, "tokens": est.tokens, "days": est.days,
               "wall_seconds": est.wall_seconds,
               "burst_seconds": est.burst_seconds, "trip_seconds": est.trip_seconds,
               "round_trips": est.round_trips, "in_flight": est.in_flight, "daily_limit": est.daily_limit, "share": est.share,
               "burst_limit": est.burst_limit, "spent": est.spent,
               "kinds": [vars(k) for k in est.kinds], "opt_in": [vars(k) for k in est.opt_in],
               "next": "full run"}
    lonely = None
    if migrated is None and existing is None and kinds_choice(kinds):  # what `migrate run` would say of these kinds' parents
        if missing:
            lonely = unlinked_kinds(provider, kinds_choice(kinds), [])
        else:
            with open_db() as db:
                lonely = unlinked_kinds(provider, kinds_choice(kinds), ledger_reads.ledger_kinds(db, tenant))
        payload["note"] = lonely
    if migrated is not None:
        floor = est.sync_floor
        payload.update(next="sync", sync={"requests": floor.requests, "tokens": floor.tokens, "days": floor.days,
                                          "last": migrated["last_sync"]}, migrated_by=migrated["by"])
    if covers is not None:
        payload.update(covered=list(covers.covered), kinds_lacking=list(covers.lacking))
    if existing is not None:  # the figures are what is left of that run: the kinds of its phases not closed yet
        r = existing.run
        payload.update(next={"joined": "join", "rerun": "resume" if r.status in ("stopped", "stopping") else "retry"}
                       [existing.action], run={"run_id": r.id, "status": r.status, "phase": r.current_phase + 1,
                                               "phases": len(r.plan), "kinds_left": planned, "dry_run": r.dry_run})

    def render() -> None:
        if migrated is not None:
            floor, last = est.sync_floor, migrated["last_sync"]
            said = (f"; the last sync, run #{last['run_id']}, cost {last['requests']:,} requests, {last['tokens']:,} "
                    "tokens" if last else "")
            click.echo(f"plan for {tenant}: already migrated by run #{migrated['by']}; the next run is a sync "
                       f"(`migrate sync {tenant}`) of the kinds its runs took: at least {floor.requests:,} requests, "
                       f"{floor.tokens:,} tokens{'' if floor.days is None else f', {floor.days:.2f} days'} (the field "
                       f"lists and one walk of every list), more as more changed{said}")
            click.echo(f"a full run again from scratch (`migrate run --tenant {tenant} --new-run`) would be:")
        elif existing is not None:
            for line in existing_words(tenant, existing, planned, provider.phases()):
                click.echo(line)
        elif covers is not None:
            click.echo(f"plan for {tenant}: {covers.line(tenant)}")
        else:
            click.echo(f"plan for {tenant}: a full run of {run_words(kinds_choice(kinds), planned)}")
        if lonely:  # read before the figures it qualifies, wrapped at a clause, not one long line
            for line in textwrap.wrap(lonely, width=100, subsequent_indent="  ", break_on_hyphens=False):
                click.echo(line)
        for line in plan_lines(est, opt_in=existing is None):
            click.echo(line)

    emit(as_json, payload, render)
