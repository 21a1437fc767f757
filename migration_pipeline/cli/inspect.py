"""The read commands over the engine's tables: `status`, `report`, `explain`, `rows`. They import no
Dagster (~2 s): they answer from the engine database alone."""
from __future__ import annotations

import json
import re
import sys
from typing import Any

import click
from rich.table import Table

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import row_story
from engine_core import runs, runs_reads
from engine_core.budget_waiting import waiting_state
from engine_core.config import check_environment
from engine_core.errors import EngineError
from engine_core.ledger_reads import (ROW_ACTIONS, bad_row_counts, bad_rows_by_run, explain_unreadable, source_listing,
                                      tenant_row_counts, tenant_rows)
from engine_core.progress import run_progress, status_line
from engine_core.providers.registry import provider_for
from engine_core.rollup_left import left_lines
from engine_core.rows import WAITS_FOR_WALK
from engine_core.source import catchup_kind, progress_weights
from engine_core.source_retries import source_retries
from engine_core.target import crm
from engine_core.verify import ledger_kind_of
from migration_pipeline.cli import remedy
from migration_pipeline.cli.output import console, emit, fail, open_db, reader_gone
from migration_pipeline.cli.tenants import known_tenant, tenant_run
from engine_core.plan import left_out_line
from migration_pipeline.cli.options import left_out_of
from migration_pipeline.cli.tables import (outcome_counts, phase_labels, phase_number, print_overview, print_rollup,
                                          reasons_table, rollup_doc)
from migration_pipeline.launch.checks import pickable_kinds


def _phase(r: Any) -> str:
    """The run's current phase as "N/M", numbered as its phase asset (`tables.phase_number`)."""
    if not r.plan:
        return "0/0"
    at = min(r.current_phase, len(r.plan) - 1)
    return "{}/{}".format(*phase_number(r.source, r.plan[at], at + 1, len(r.plan)))


def tenant_overview(db: dbmod.Database, source: str | None = None,
                    stale_after: float | None = None) -> list[dict[str, Any]]:
    """`migrate status` without a tenant: per tenant and source, its latest run (`runs.latest_runs`),
    as {"tenant", "source", "run_id", "mode", "status", "dry_run", "phase" ("3/8", the barrier's
    phase of the run's plan), "tasks" ({status: count}), "started_at", "finished_at",
    "idle_seconds" (a live run's seconds since anything worked on it, `run_idle_seconds`; else None),
    "unattended" (idle for longer than `stale_after` seconds, the stale-lock threshold: no worker
    drains it, as `migrate status TENANT` says; also at once when "no_live_worker_since" is set),
    "no_live_worker_since" (UTC, `rollup.no_live_worker_since`: every claimed task's worker process
    on this host is gone; else None), "source_failing" (a running run whose source failed every
    task that asked it since its tasks are retried: `source_retries`), "skipped", "waiting" (left to the catch-up's walk: a run
    stopped before its catch-up), "failed" (the tenant's rows now, as `migrate rows TENANT` counts
    them: a run that succeeded with bad rows is not plain "succeeded"; a dry run, which writes no
    ledger row, its own counts, as its table sums them: `tables.outcome_counts` - it had said 0 and 0
    beside a table of 58 skipped and 43 failed - its "waiting" 0 once its catch-up ran)}, by tenant."""
    overview = []
    for r, tasks in runs.latest_runs(db, source):
        if r.dry_run:
            own = outcome_counts(rollups.rollup(db, r.id))
            bad = [{"skipped": own["skipped"], "failed": own["failed"],
                    "waiting": 0 if r.status == "succeeded" else own["waiting"]}]
        else:
            bad = bad_row_counts(db, r.tenant_id).values()
        idle = (round(runs_reads.idle_seconds(db, r.id), 1)
                if r.status in ("running", "stopping") else None)
        dead_since = rollups.no_live_worker_since(db, r.id) if idle is not None else None
        overview.append({"tenant": r.tenant_id, "source": r.source, "run_id": r.id, "mode": r.mode, "status": r.status,
                         "dry_run": r.dry_run, "phase": _phase(r),
                         "tasks": tasks, "started_at": r.started_at, "finished_at": r.finished_at,
                         "idle_seconds": idle,
                         "unattended": dead_since is not None or (stale_after is not None and idle is not None
                                                                  and idle > stale_after),
                         "no_live_worker_since": dead_since,
                         "source_failing": _source_failing(db, r) if dead_since is None else False,
                         "skipped": sum(b["skipped"] for b in bad), "waiting": sum(b["waiting"] for b in bad),
                         "failed": sum(b["failed"] for b in bad)})
    return overview


def _source_failing(db: dbmod.Database, run: Any) -> bool:
    """Whether a running run's source has failed every task that asked it since its first retry
    (`source_retries`): the overview says so beside its status."""
    retrying = source_retries(db, run.id) if run.status == "running" else None
    return retrying is not None and retrying.failing_all


OVERVIEW_TIMES = ("started_at", "finished_at", "no_live_worker_since")


def overview_doc(overview: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tenant_overview` as `migrate status --json` writes it: its times in ISO 8601, as
    `migrate status TENANT --json` writes a run's (json's `default=str` would write "2026-12-07 13:47:05")."""
    return [{**o, **{key: o[key].isoformat() if o[key] else None for key in OVERVIEW_TIMES}} for o in overview]


def no_live_worker_line(progress: dict[str, Any]) -> str:
    """`status_line` for a run whose workers are all gone (`progress["no_live_worker_since"]`, UTC):
    "40% done; no live worker since 2026-12-03 21:10:04 UTC ...; phase 2 (...)", with no ETA."""
    since = progress["no_live_worker_since"]
    head, _, tail = status_line({**progress, "eta_seconds": None, "idle_seconds": None}).partition("% done")
    said = (f"no live worker since {since:%Y-%m-%d %H:%M:%S} UTC (the process that claimed its tasks is gone: a "
            "killed command or daemon)")
    return f"{head}% done; {said}{tail}" if head else said


@click.command()
@click.argument("tenant", required=False)
@click.option("--source", default=None, help="limit to one source")
@click.option("--json", "as_json", is_flag=True)
def status(tenant: str | None, source: str | None, as_json: bool) -> None:
    """The latest run of TENANT: phase, tasks, per-kind counts, grouped reasons. Without TENANT,
    an overview: every tenant's latest run (status, phase, tasks). TENANT's --json: the rollup, with
    every phase number from 1 in the run's own `phases` it lists (`current_phase`, `kinds[].phase`,
    `completeness[].phase`, `progress.phases[].phase`: `tables.rollup_doc`), `phase` ("2/2") in the same
    numbering, `phase_asset` ("9/9") and `phase_assets` (one a phase of `phases`) as the phase assets
    number them (as the table, its title and the progress lines number them),
    `waiting` the tenant's rows left to the catch-up's walk now (a number, 0 when none, as the
    overview counts them), `budget_waiting` what the account's budget waits on (or null) and
    `source_retrying` the tasks being retried after the source failed them (`source_retries`, or
    null): while the source fails every request the status says so, without an ETA, until the
    engine pauses the run."""
    if tenant is None:
        with open_db(create=False) as db:
            overview = tenant_overview(db, source, check_environment().stale_lock_seconds)
        emit(as_json, overview_doc(overview), lambda: print_overview(overview))
        return
    with open_db(create=False) as db:
        run = tenant_run(db, tenant, source)
        try:
            r = rollups.rollup(db, run.id)
        except EngineError as e:
            fail(e)

        stale_after = check_environment().stale_lock_seconds
        # percent and ETA (engine_core.progress), the phases weighed by what they cost the provider
        done = run_progress(db, r.run_id, stale_after, progress_weights(provider_for(run.source)))
        dead_since = rollups.no_live_worker_since(db, r.run_id)
        done = {**done, "no_live_worker_since": dead_since}
        for ph, label in zip(done["phases"], phase_labels(run.source, run.plan)):
            ph["label"] = label  # numbered as the phase assets and the progress lines are ("9/9")
        if dead_since is not None:  # no process works towards an ETA: what resumes it is what counts
            done.update(eta_seconds=None, unattended=True)
        # what the account's budget waits on (the daily token share, a burst 429), while the run is live
        waiting = waiting_state(db, run.source_account, run.source) if run.status == "running" else None
        wait_json = {"reason": waiting.reason, "until": waiting.until.isoformat()} if waiting and waiting.reason else None
        rows_waiting = sum(b["waiting"] for b in bad_row_counts(db, tenant).values())  # as the overview counts them
        # tasks the source failed, retried before the engine pauses the run: no ETA while it fails everything
        retrying = source_retries(db, run.id) if run.status == "running" and dead_since is None else None
        if retrying is not None and retrying.failing_all:
            done.update(eta_seconds=None)
        unattended = done["unattended"]

        left = left_out_of(run, db)  # the kinds the tenant has not: opt-in ones, or not chosen

        def render() -> None:
            print_rollup(r)
            if left:
                console.print(left_out_line(left), highlight=False, markup=False)  # `kinds: [a, b]` is no markup tag
            console.print(("a dry run (nothing is written): " if run.dry_run else "")
                          + (no_live_worker_line(done) if dead_since is not None else status_line(done, stale_after)))
            if unattended:
                console.print(f"[yellow]`migrate run --tenant {tenant}` resumes it here; `migrate ui` (a daemon) "
                              "runs it in the background[/yellow]")
            if wait_json is not None:
                console.print(f"[yellow]{waiting.reason}, until {waiting.until:%Y-%m-%d %H:%M:%S} UTC[/yellow]")
            if retrying is not None:
                console.print(f"[yellow]{retrying.line(tenant)}[/yellow]", highlight=False)

        # every phase number from 1, read against the `phases` the JSON lists ("2/2" for a run of users alone)
        progress_doc = {**done, "phases": [{**ph, "phase": ph["phase"] + 1} for ph in done["phases"]]}
        emit(as_json, {**rollup_doc(r), "left_to_catchup": left_lines(r), "left_out": left, "progress": progress_doc,
                       "waiting": rows_waiting, "budget_waiting": wait_json,
                       "source_retrying": retrying.as_dict() if retrying else None}, render)


@click.command()
@click.argument("tenant")
@click.option("--kind", default=None)
@click.option("--stat", default="imported", show_default=True, help="the payload stat to group by")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--run", "run_id", default=None, type=click.IntRange(min=1),
              help="an earlier run of TENANT (its number, as `migrate status` and `explain` name it); default: the latest")
@click.option("--json", "as_json", is_flag=True)
def report(tenant: str, kind: str | None, stat: str, top: int, run_id: int | None, as_json: bool) -> None:
    """Task duration grouped by the task's own payload (group by payload before blaming anything).
    The latest run of TENANT (as `migrate status TENANT` shows it: its title says so), or --run N:
    after a sync the latest run is the sync, so --run is how the full run before it is reached.
    With --kind, the rows of the kind the run's catch-up took (`by catch-up`) are said beside the
    kind's own counts; without --run, the tenant's skipped and failed rows of the kind now (every
    run, as the status overview and `migrate rows` count them) and the runs that left them.
    --json: `latest`, `run_mode`, `caught_up` and `tenant_now` ({"counts", "by_run"}) too."""
    with open_db(create=False) as db:
        if kind is not None:  # an unknown kind is one line naming the kinds, not an empty table
            check_explain(db, tenant, kind)
        if run_id is None:  # --run N names its own tenant when it is not TENANT
            known_tenant(db, tenant)
        try:
            run = runs.latest_run(db, tenant) if run_id is None else runs.get_run(db, run_id)
        except EngineError as e:
            fail(e)
        if run.tenant_id != tenant:
            fail(f"run #{run.id} belongs to tenant {run.tenant_id!r}, not to tenant {tenant!r}")
        check_stat(db, run, kind, stat)
        rows = rollups.duration_by_payload(db, run.id, kind=kind, stat=stat, top=top)
        reasons = [g for g in rollups.grouped_reasons(db, run.id) if kind is None or g["kind"] == kind]
        rolled = rollups.rollup(db, run.id)
        counts = outcome_counts(rolled, kind)
        unlisted = left_lines(rolled, kind)  # rows never listed, left to the catch-up with their parents
        caught = caught_up_counts(rolled, kind)
        now = tenant_now(db, run, kind) if run_id is None else None
        latest = ", the tenant's latest run" if run_id is None else ""

        def render() -> None:
            if run_id is None:  # which run this is, when the user did not pick one
                what = "a sync" if run.mode == "sync" else ("a dry run" if run.dry_run else "a full run")
                console.print(f"reporting {run.name}, the tenant's latest run ({what}); --run N reports another "
                              "(`migrate status` and `explain` name them)", highlight=False)
            # "waiting" is what the phases left to the catch-up, as the status table's column says:
            # the catch-up's own count says what became of them (none waits after it ran)
            named = {"waiting": "left to catch-up"}
            console.print(f"{run.name}{latest}: " + ", ".join(f"{v} {named.get(k, k.replace('_', ' '))}" for k, v in counts.items()))
            if caught.get("seen"):
                console.print(f"{kind} rows its catch-up took (`by catch-up`, counted in its catchup row): "
                              + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in caught.items() if v), highlight=False)
            for line in unlisted:
                console.print(line, highlight=False)
            if now is not None:
                console.print(now_line(tenant, kind, now), highlight=False)
            t = Table(title=f"{run.name}{latest}: duration by {stat}" + (f" ({kind})" if kind else ""))
            for col in (stat, "tasks", "avg seconds", "max seconds"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(str(r["payload"]), str(r["tasks"]), str(r["avg_seconds"]), str(r["max_seconds"]))
            console.print(t)
            if reasons:
                console.print(reasons_table(reasons, tenant), soft_wrap=False)

        emit(as_json, {"run_id": run.id, "run_mode": run.mode, "latest": run_id is None, "counts": counts,
                       "caught_up": caught, "tenant_now": now, "left_to_catchup": unlisted, "durations": rows,
                       "reasons": reasons}, render)


def caught_up_counts(r: Any, kind: str | None) -> dict[str, int]:
    """What the run's catch-up did with `kind`'s rows (`KindRollup.caught_up`'s row outcomes:
    {"seen", "imported", ...}, the `by catch-up` column); {} without a kind (the catch-up's own
    row counts them once) or when it took none."""
    k = next((k for k in r.kinds if k.kind == kind), None) if kind else None
    if k is None or not k.caught_up.get("seen"):
        return {}
    return {c: int(k.caught_up.get(c, 0)) for c in ("seen", *rollups.COUNTERS)}


def tenant_now(db: dbmod.Database, run: Any, kind: str | None) -> dict[str, Any]:
    """The tenant's skipped, waiting and failed rows of `kind` now (its ledger kind; every kind
    without one), as the status overview and `migrate rows` count them: {"counts": {"skipped",
    "waiting", "failed"}, "by_run": {run id: counts}} (the run that last wrote each)."""
    ledger = None if kind is None else [ledger_kind_of(provider_for(run.source))(kind)]
    by_run = bad_rows_by_run(db, run.tenant_id, ledger)
    counts = {c: sum(v[c] for v in by_run.values()) for c in ("skipped", "waiting", "failed")}
    return {"counts": counts, "by_run": by_run}


def now_line(tenant: str, kind: str | None, now: dict[str, Any]) -> str:
    """`report`'s line of the tenant's rows now, e.g. "the tenant's emails now (every run, as `migrate
    status` and `migrate rows` count them): 0 skipped, 3 failed; left by run #2 (3 failed): `--run N`
    reports that run, `migrate rows acme --kind emails` lists them"."""
    what = f"{kind} rows" if kind else "rows"
    counts = ", ".join(f"{n} {c}" for c, n in now["counts"].items() if n or c != "waiting")
    line = f"the tenant's {what} now (every run, as `migrate status` and `migrate rows` count them): {counts}"
    if not now["by_run"]:
        return line
    runs_said = "; ".join(f"run #{rid} ({', '.join(f'{n} {c}' for c, n in v.items() if n)})" for rid, v in now["by_run"].items())
    rows_cmd = f"`migrate rows {tenant}" + (f" --kind {kind}`" if kind else "`")
    return f"{line}; left by {runs_said}: `--run N` reports that run, {rows_cmd} lists them"


def check_stat(db: dbmod.Database, run: Any, kind: str | None, stat: str) -> None:
    """Before `migrate report` groups by `stat`: a stat none of the run's succeeded tasks (of `kind`)
    counts is one line naming the stats they do count (exit 2), rather than every task grouped
    under 0. The default, "imported", always passes (a kind that imports nothing is all 0)."""
    stats = runs_reads.task_stat_keys(db, run.id, kind)
    if stat not in stats and stat != "imported":
        of = f" {kind}" if kind else ""
        fail(f"unknown --stat {stat!r}: {run.name}'s succeeded{of} tasks count "
              f"{', '.join(stats) if stats else 'nothing yet'}")


# ignore_unknown_options: an id such as "-1" is the id, not an unknown option
@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("tenant")
@click.argument("kind")
@click.argument("source_id")
@click.option("--json", "as_json", is_flag=True)
def explain(tenant: str, kind: str, source_id: str, as_json: bool) -> None:
    """What happened to one source row, from the ledger. SOURCE_ID is taken without the spaces
    around it (a pasted " 42" had not been found) and in the form the ledger keys it
    (`explain_id`); the text as given is looked up too when that finds nothing. An archived deal or
    lead says so after its product row (", archived"; --json: `archived`, null for a kind without
    the flag): its ledger kind is the unarchived one's (`deals_archived` rows are kept as `deals`).
    Then what later runs did to the row and where it stands now (`since_lines`); --json: `history`,
    `last_run_id`, `deleted_by_run` (`row_story.explain`)."""
    raw = source_id.strip()
    if not raw:
        fail("SOURCE_ID is empty: give the source row's id, e.g. `migrate explain TENANT persons 42`")
    source_id = explain_id(raw)
    with open_db(create=False) as db:
        kind = folded(kind, check_explain(db, tenant, kind, ledger=True), "explaining", f" {source_id}")
        asked = source_id
        story = row_story.explain(db, tenant, kind, source_id)
        if story is None and raw != source_id:
            asked, story = raw, row_story.explain(db, tenant, kind, raw)
        if story is not None and story.get("unreadable") and story.get("matches", 1) > 1:
            story["others"] = served_alike(db, tenant, kind, asked, story["source_id"])
        if story is None:
            listing = source_listing(db, tenant, kind, source_id)
            said = "" if listing is None else (
                f"; run #{listing['run_id']}'s catch-up listed it at the source" if listing["has"] else
                f"; nor did the source list it (run #{listing['run_id']}'s catch-up listed {listing['listed']} "
                f"{kind} ids, not this one)")
            unread = row_story.unreadable_count(db, tenant, kind)
            if unread is not None:  # the row asked for may be one of them: served without its id
                said += (f"; {unread['rows']} {kind} record(s) are kept without a readable id (latest in run "
                         f"#{unread['run_id']}: rows served without one{', or mail of deals served without one' if unread['deals'] else ''}"
                         f"): `migrate rows {tenant} --kind {kind}` lists their keys, which explain takes")
            form = KEYED_BY.get(kind)
            if form is not None and ":" not in raw:  # a bare id of a kind keyed by a pair
                said += (f"; {kind} rows are keyed {form[0]}, not by a bare id (e.g. `migrate explain {tenant} {kind} "
                         f"{raw}:{form[1]}`); {form[2].format(tenant=tenant, id=raw)}")
            # a list no run of the tenant took may serve it alone: said instead of "no run has ..."
            why = remedy.for_absent(db, tenant, kind, source_id) or (
                DRY_ONLY.format(tenant=tenant) if runs_reads.only_dry_runs(db, tenant)
                else "no run has written, skipped or failed it")
            emit(as_json, None, lambda: console.print(
                f"{kind} {source_id} of tenant {tenant!r} is not in the ledger: {why}{said}", highlight=False))
            sys.exit(1)

        waits = story["action"] == "skipped" and WAITS_FOR_WALK in (story["reason"] or "")
        story["outcome"] = "waiting" if waits else story["action"]
        story["next"] = next_for_placeholder(db, tenant, story) if story["action"] == "skipped" else None
        story["remedy"] = remedy.for_row(db, tenant, story)  # what brings it, when a run can still bring it
        # the product row's archived flag (deals, leads; else None): archived rows share their kind's ledger
        story["archived"] = crm.archived(db, story.get("record_type"), story.get("record_id"))

        def render() -> None:
            verb = {"created": "imported", "matched": "matched to an existing record", "skipped": "skipped",
                    "failed": "failed", "waiting": "waiting for the catch-up's walk, left"}[story["outcome"]]
            line = f"{kind} {source_id}: {verb} by run #{story['run_id']} at {story['at']}"
            if story["record_id"]:
                line += f" -> {story['record_type']} {story['record_id']}" + (", archived" if story["archived"] else "")
            if story["reason"]:
                line += f" ({story['reason']})"
            console.print(line)
            for said in since_lines(kind, story):  # what later runs did to the row, then where it stands
                console.print(said, highlight=False)
            for then in (story["next"], story["remedy"]):
                if then:
                    console.print(then, highlight=False)
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

        emit(as_json, story, render)


def since_lines(kind: str, story: dict[str, Any]) -> list[str]:
    """`explain`'s lines after the claim: one per change a later run made to the row (`story`'s
    `history`: "then updated by sync run #4 at ...: stage_id, value changed"), then, when there was
    any, where the row stands now ("now: crm.deals 17, source version ..., last changed by sync run
    #4"). A deletion says a merge reads the same: Pipedrive answers a merged id as a deleted one,
    and the ledger keeps no survivor."""
    lines = []
    for h in story.get("history") or []:
        by = f"{'sync ' if h['run_mode'] == 'sync' else ''}run #{h['run_id']} at {h['at']}"
        if h["action"] == "updated":
            changed = f": {', '.join(h['changed'])} changed" if h["changed"] else ""
            lines.append(f"then updated by {by}{changed} (source version {h['version_before']} -> {h['version_after']})")
        elif h["action"] == "deleted":
            lines.append(f"then found gone from the source by {by}: deleted, or merged into another record "
                         "(Pipedrive answers a merged id as a deleted one; the ledger keeps no survivor)")
        else:
            lines.append(f"then seen at the source again by {by}: restored")
    if not lines:
        return []
    where = f"{story['record_type']} {story['record_id']}" if story.get("record_id") else "no product row"
    gone = (f", deleted at the source since {story['deleted_at_source']} (the product row is kept, marked)"
            if story.get("deleted_at_source") else "")
    archived = "" if story.get("archived") is None else (", archived" if story["archived"] else ", not archived")
    last = story["history"][-1]
    lines.append(f"now: {where}{archived}, source version {story.get('source_version')}{gone}; last changed by "
                 f"{'sync ' if last['run_mode'] == 'sync' else ''}run #{last['run_id']}")
    return lines


def next_for_placeholder(db: dbmod.Database, tenant: str, story: dict[str, Any]) -> str | None:
    """What becomes of a skipped or waiting row (`explain`'s `story`) while the run that left it has
    not closed its catch-up: that catch-up takes placeholders over (a waiting row is settled by its
    walk; a skipped one is listed or asked again and written if its parent is there now). One line
    saying so - the catch-up is still ahead, or the run stopped (or failed) before it and
    `migrate run --tenant T` resumes it - or None: the catch-up closed, the run is a dry run, or its
    source has no catch-up (a skip there is final until a later run)."""
    try:
        run = runs.get_run(db, int(story["run_id"]))
        kind = catchup_kind(provider_for(run.source))
    except Exception:  # noqa: BLE001 - a run or source that no longer loads: nothing to foretell
        return None
    at = next((i for i, group in enumerate(run.plan) if kind in group), None)
    if run.dry_run or at is None or run.status == "succeeded" or run.current_phase > at:
        return None
    then = "settles it" if story["outcome"] == "waiting" else "retries it (written if its parent is there by then)"
    if run.status in ("stopped", "failed"):
        return (f"not final: run #{run.id} {run.status} before its catch-up, which {then}: "
                f"`migrate run --tenant {tenant}` resumes it")
    return f"not final: run #{run.id} has not closed its catch-up yet, which {then}"


EXPLAIN_OTHERS = 10  # other rows served with an unreadable row's id that `explain` lists by key


def served_alike(db: dbmod.Database, tenant: str, kind: str, asked: str, told: str) -> list[str]:
    """The raw keys of the rows without a readable id that `explain`'s `asked` also finds (served
    with the same id, another content) besides the one it tells (`told`), the latest first, at
    most EXPLAIN_OTHERS: `row_story.explain` counts them ("N other row(s) were served with this id"),
    and this names them; each key is one `explain` takes."""
    rows = explain_unreadable(db, tenant, kind, asked, None)
    return [r["raw_key"] for r in rows if r["raw_key"] != told][:EXPLAIN_OTHERS]


_UUID_TEXT = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


# Kinds whose ledger id is a pair, not the source's own id: the form, its second half's name, and
# where to find the ids of one parent (`{tenant}`, `{id}`: the bare id given).
KEYED_BY = {
    "deal_history": ("DEAL_ID:CHANGE_HASH (the deal's id and a hash of the change)", "CHANGE_HASH",
                     "deal {id}'s changes and their keys: psql \"$(migrate db url)\" -c \"SELECT source_id, reason, action FROM "
                     "migration_records WHERE tenant_id = '{tenant}' AND kind = 'deal_history' AND source_id LIKE "
                     "'{id}:%'\""),
}


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


def check_explain(db: dbmod.Database, tenant: str, kind: str | None, *, ledger: bool = False) -> str | None:
    """Before `explain` (and `report --kind`, `rows`) reads the ledger: a tenant no run has
    migrated, or a kind none of the tenant's sources has (their providers' kinds without the
    catch-up phase), is one line naming it and what there is (exit 2), not "not in the ledger".
    `kind` None: the tenant alone is checked. Returns the kind to read: with `ledger`, the ledger
    kind it folds into (`verify.ledger_kind_of`: Pipedrive keeps `deals_archived` under `deals`),
    and the kinds named on refusal are ledger kinds; without, `kind` itself (task kinds, `report`)."""
    known_tenant(db, tenant)
    if kind is None:
        return None
    sources = runs_reads.tenant_sources(db, tenant)
    kinds: dict[str, str] = {}  # plan kind -> the ledger kind it is kept under
    for source in sources:
        try:
            provider = provider_for(source)
        except Exception:  # noqa: BLE001 - a source that no longer loads: its kinds are not judged
            return kind
        fold = ledger_kind_of(provider) if ledger else (lambda k: k)
        kinds.update({k: fold(k) for group in pickable_kinds(provider) for k in group})
    if kind not in kinds:
        fail(f"unknown kind {kind!r} (kinds: {', '.join(dict.fromkeys(kinds.values()))})")
    return kinds[kind]


def folded(kind: str, ledger_kind: str | None, verb: str, rest: str) -> str:
    """The kind to read the ledger by: `ledger_kind` (from `check_explain(..., ledger=True)`), said
    in one line on stderr when it is not the kind asked for ("note: deals_archived rows are kept in
    the ledger under deals: explaining deals 396", `verb` and `rest` around the kind), so an
    archived deal's id asked under `deals_archived` is answered, not "not in the ledger"."""
    if ledger_kind is None or ledger_kind == kind:
        return kind
    click.echo(f"note: {kind} rows are kept in the ledger under {ledger_kind}: {verb} {ledger_kind}{rest}", err=True)
    return ledger_kind


def row_line(row: dict[str, Any]) -> str:
    """One `migrate rows` line: "KIND ID ACTION run #N: REASON", flagged when the row has no
    readable id, was found deleted at the source, or was written by a dry run."""
    flags = [*(["no readable id"] if row["unreadable"] else []),
             *(["deleted at source"] if row.get("deleted_at_source") else []),
             *(["dry run"] if row.get("dry_run") else [])]
    reason = " ".join((row["reason"] or "no reason recorded").split())
    return (f"{row['kind']} {row['id']} {row['action']} run #{row['run_id']}"
            + (f" ({', '.join(flags)})" if flags else "") + f": {reason}")


# What `explain` and `rows` say of a tenant whose runs are all dry runs (nothing in the ledger).
DRY_ONLY = ("the tenant's runs are dry runs, which write nothing to the ledger (`migrate status {tenant}` has "
            "their counts; `migrate run --tenant {tenant}` writes the rows explain and rows tell of)")


@click.command("rows")
@click.argument("tenant")
@click.option("--kind", default=None, help="only this kind's rows")
@click.option("--action", type=click.Choice(["skipped", "waiting", "failed", "all"]), default="all", show_default=True,
              help="skipped rows, rows waiting for the catch-up, failed rows (those without a readable id too), or all")
@click.option("--run", "run_id", default=None, type=click.IntRange(min=1),
              help="only the rows run N (as `migrate status` names it) wrote last")
@click.option("--limit", default=None, type=click.IntRange(min=1), help="at most N rows (default: all)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per row and line (JSON Lines)")
def rows_command(tenant: str, kind: str | None, action: str, run_id: int | None, limit: int | None,
                 as_json: bool) -> None:
    """Every skipped, waiting or failed row of TENANT, as the ledger holds it now (every run of the
    tenant, not only the latest: each line says the run that last wrote the row; waiting: left to the
    catch-up's walk, which settles it - a run stopped before its catch-up settles it when resumed), and the rows that came
    without a readable id (failed, their id as served): one line each, sorted by kind, action and
    id, then a count. `status` and `report` show five samples per reason; this lists them all, for
    `migrate explain` to take one by one. --json: JSON Lines on stdout, the count on stderr."""
    actions = ROW_ACTIONS if action == "all" else (action,)
    with open_db(create=False) as db:
        if kind is not None:
            kind = folded(kind, check_explain(db, tenant, kind, ledger=True), "listing", " rows")
        else:
            check_explain(db, tenant, None)
        if run_id is not None:
            try:
                run = runs.get_run(db, run_id)
            except EngineError as e:
                fail(e)
            if run.tenant_id != tenant:
                fail(f"run #{run.id} belongs to tenant {run.tenant_id!r}, not to tenant {tenant!r}")
        counts = tenant_row_counts(db, tenant, kind, actions, run_id)
        dry = runs_reads.only_dry_runs(db, tenant)
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
    total = counts["skipped"] + counts["waiting"] + counts["failed"]
    summary = (f"{total} row{'' if total == 1 else 's'}: {counts['skipped']} skipped, "
               + (f"{counts['waiting']} waiting for the catch-up, " if counts["waiting"] else "")
               + f"{counts['failed']} failed ({counts['unreadable']} without a readable id)")
    if shown < total:
        summary += f"; {shown} shown (--limit {limit})"
    if not total and dry:
        summary += f"; {DRY_ONLY.format(tenant=tenant)}"
    click.echo(summary, err=as_json)
