"""A closed phase as Dagster metadata: the engine's rollup, formatted. Presentation only."""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from dagster import MetadataValue, RunsFilter, TableColumn, TableRecord, TableSchema

from engine_core import rollup as rollups
from engine_core import runs, runs_reads
from engine_core.rows_now import counts_now, rows_now
from engine_core.db import Database
from engine_core.progress import PhaseProgress
from engine_core.rollup_left import left_lines
from migration_pipeline import tags
from migration_pipeline.assets.specs import plan_of

COUNTS = ("imported", "matched", "already_here", "updated", "skipped", "waiting", "failed")
# per kind beside the row outcomes: rows marked deleted at the source by the run (ledger
# history, not rows seen) and rows of the kind the run's catch-up wrote (`KindRollup.caught_up`)
EXTRA = ("deleted_at_source", "by_catchup")
ROWS_CAP = 50  # skipped, waiting and failed rows listed in a phase's metadata (the counts above are whole)
ROW_OUTCOMES = ("skipped", "waiting", "failed")  # the grouped reasons' actions that are ledger rows
# A dry run's phase materialisation, first in its metadata: the phase ran and counted, but the
# counts under "imported", "updated", ... are what a real run would do (a reader took
# "materialized" for data written)
DRY_RUN_NOTE = ("dry run: nothing was written; the counts are what a real run would import, match and update "
                "(`migrate run --tenant TENANT` without --dry-run writes)")

# the tenant's rows not imported now (`rows_now`): beside ROWS_SCHEMA's, the run that last wrote each
TENANT_ROWS_SCHEMA = TableSchema(
    columns=[
        TableColumn("kind", "string"),
        TableColumn("source_id", "string"),
        TableColumn("action", "string"),
        TableColumn("run_id", "int"),
        TableColumn("reason", "string"),
    ]
)

ROWS_SCHEMA = TableSchema(
    columns=[
        TableColumn("kind", "string"),
        TableColumn("source_id", "string"),
        TableColumn("action", "string"),
        TableColumn("reason", "string"),
    ]
)

PER_KIND_SCHEMA = TableSchema(
    columns=[
        TableColumn("kind", "string"),
        TableColumn("imported", "int"),
        TableColumn("matched", "int"),
        TableColumn("already_here", "int"),
        TableColumn("updated", "int"),
        TableColumn("skipped", "int"),
        TableColumn("waiting", "int"),
        TableColumn("failed", "int"),
        TableColumn("deleted_at_source", "int"),
        TableColumn("by_catchup", "int"),
        TableColumn("seen", "int"),
        TableColumn("tasks", "string"),
    ]
)


def _tasks_text(tasks: dict[str, int]) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(tasks.items())) or "none"


def busy_windows(instance: Any, run_id: int) -> list[tuple[float, float]]:
    """When Dagster runs worked on engine run `run_id` (tagged `migration/run_id` with it): each
    run's (start, end) in epoch seconds, the end now for a run still in progress; runs that never
    started are left out. The time outside them is time the engine run was stopped or paused."""
    now = time.time()
    return sorted((rec.start_time, rec.end_time or now)
                  for rec in instance.get_run_records(RunsFilter(tags={tags.ENGINE_RUN: str(run_id)}))
                  if rec.start_time is not None)


def _covered(start: float, end: float, windows: list[tuple[float, float]]) -> float:
    """Seconds of [start, end] inside the union of `windows` (sorted by start)."""
    total, reach = 0.0, start
    for a, b in windows:
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def _inside(t: float, windows: list[tuple[float, float]], slack: float = 5.0) -> bool:
    return any(a - slack <= t <= b + slack for a, b in windows)


def phase_seconds(db: Database, run_id: int, kinds: set[str],
                  windows: list[tuple[float, float]] | None = None) -> float | None:
    """From the phase's first task start to its last finish (the engine's rollup_tasks rows), less
    the time no Dagster run worked on the engine run (`windows`, `busy_windows`: a stop or pause
    and its resume), so rows/s is over the time the phase was worked on. Without windows, or when
    the phase began or ended outside them (drained by the engine's own command), the whole span."""
    starts: list[datetime] = []
    ends: list[datetime] = []
    for r in runs_reads.task_groups(db, run_id):
        if r["kind"] in kinds:
            if r["first_started"]:
                starts.append(r["first_started"])
            if r["last_finished"]:
                ends.append(r["last_finished"])
    if not starts or not ends:
        return None
    first, last = min(starts).timestamp(), max(ends).timestamp()
    if windows and _inside(first, windows) and _inside(last, windows):
        return max(0.0, _covered(first, last, windows))
    return max(0.0, last - first)


def duration_table(db: Database, run_id: int, kinds: list[str]) -> str:
    """Task durations of run `run_id` per kind, grouped by imported rows a task, as a markdown table
    (| kind | imported per task | tasks | avg seconds | max seconds |); one empty row when none."""
    lines = ["| kind | imported per task | tasks | avg seconds | max seconds |", "|---|---:|---:|---:|---:|"]
    for kind in kinds:
        for r in rollups.duration_by_payload(db, run_id, kind=kind, stat="imported"):
            lines.append(f"| {kind} | {r['payload']} | {r['tasks']} | {r['avg_seconds']} | {r['max_seconds']} |")
    if len(lines) == 2:
        lines.append("| - | - | 0 | - | - |")
    return "\n".join(lines)


def reasons_table(reasons: list[dict[str, Any]], none: str = "No rows skipped, waiting or failed, no task failed.") -> str:
    """Grouped reasons (`rollup.grouped_reasons`) as a markdown table, biggest first, 30 at most: the
    reason's shape (ids and numbers as `{id}` / `{n}`), the rows or tasks of that shape, one reason
    as written ("e.g.", when it differs from the shape) and a few example source ids. Without
    reasons, `none`: the sentence saying so, of whatever the reasons were read from."""
    if not reasons:
        return none

    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| kind | what | count | reason | e.g. | example ids |", "|---|---|---:|---|---|---|"]
    for g in reasons[:30]:
        example = g.get("example") or ""
        example = "" if example == g["reason"] else example
        samples = ", ".join(str(s) for s in g.get("samples", []))
        lines.append(f"| {g['kind']} | {g.get('action', '')} | {g['count']} | {cell(g['reason'])} | {cell(example)[:200]} "
                     f"| {samples} |")
    if len(reasons) > 30:
        lines.append(f"| | | | {len(reasons) - 30} more group(s) | | |")
    return "\n".join(lines)


def phase_rows(db: Database, run_id: int, kinds: list[str], limit: int = ROWS_CAP) -> list[dict[str, Any]]:
    """Up to `limit` skipped, waiting and failed ledger rows of a phase's kinds, failed first, with reasons."""
    return rollups.phase_rows(db, run_id, kinds, limit)


def progress_metadata(p: PhaseProgress) -> dict[str, Any]:
    """A progress snapshot as numeric metadata (the UI plots numeric metadata of observations)."""
    md: dict[str, Any] = {
        "seen": MetadataValue.int(p.seen),
        "imported": MetadataValue.int(p.imported),
        "matched_or_already_here": MetadataValue.int(p.matched + p.already_here),
        "skipped": MetadataValue.int(p.skipped),
        "waiting_for_catchup": MetadataValue.int(p.waiting),
        "failed": MetadataValue.int(p.failed),
        "rows_per_second": MetadataValue.float(float(p.rows_per_second)),
        "requests": MetadataValue.int(p.requests),
        "requests_per_second": MetadataValue.float(float(p.requests_per_second)),
        "rate_limited_429s": MetadataValue.int(p.rate_limited),
        "retries": MetadataValue.int(p.retries),
        "retries_in_progress": MetadataValue.int(sum(p.retrying.values())),
        "tasks_done": MetadataValue.int(p.tasks_done),
        "tasks_total": MetadataValue.int(p.tasks_total),
        "tasks_failed": MetadataValue.int(p.tasks_failed),
        "engine_run_id": MetadataValue.int(p.run_id),
    }
    if p.retrying:
        md["retrying"] = MetadataValue.text(", ".join(f"{n} x {c}" for c, n in sorted(p.retrying.items())))
    if p.percent is not None:
        md["percent"] = MetadataValue.float(float(p.percent))
    if p.eta_seconds is not None:
        md["eta_seconds"] = MetadataValue.float(float(p.eta_seconds))
    if p.source_total is not None:
        md["source_total"] = MetadataValue.int(p.source_total)
    return md


def _extra(k: rollups.KindRollup, name: str) -> int:
    return int(k.deleted_at_source) if name == "deleted_at_source" else int(k.caught_up.get("seen", 0))


def phase_summary(db: Database, r: rollups.RunRollup, phase: int,
                  windows: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """Numbers of one phase of a run: totals, per kind, tasks, reasons of its kinds (of the catch-up:
    of the kinds it wrote rows of, `told`; of the last phase: the run's "info" notes too); its seconds and rows/s over the time Dagster runs worked
    on it (`windows`, `phase_seconds`). The kinds' figures are those the phase counted
    (`KindRollup.at_close`): read at its close, the catch-up's failures after it are not the phase's."""
    kinds = r.phase_kinds(phase, at_close=True)
    names = [k.kind for k in kinds]
    totals = {c: sum(getattr(k, c) for k in kinds) for c in COUNTS}
    totals.update({c: sum(_extra(k, c) for k in kinds) for c in EXTRA})
    tasks: dict[str, int] = {}
    for k in kinds:
        for s, n in k.tasks.items():
            tasks[s] = tasks.get(s, 0) + n
    seen = sum(k.seen for k in kinds)
    seconds = phase_seconds(db, r.run_id, set(names), windows)
    # the catch-up writes rows of other kinds: its reasons and rows are those kinds' (the kinds it
    # credited rows to), else its skipped and failed would have no reason beside them
    told = set(names) | ({k.kind for k in r.kinds if k.caught_up} if any(k.handed_over for k in kinds) else set())
    return {
        "kinds": kinds,
        "names": names,
        "totals": totals,
        "tasks": tasks,
        "seen": seen,
        "seconds": seconds,
        "rows_per_second": round(seen / seconds, 1) if seconds else 0.0,
        # the run's end notes (owed links filled) on its last phase, which ends it
        "reasons": [g for g in r.reasons if g.get("kind") in told
                    or (g.get("action") == "info" and phase == len(r.phases) - 1)],
        "told": sorted(told),
    }


def phase_status(tasks: dict[str, int]) -> str:
    """A closed phase's state from its tasks' statuses: "closed" (every task succeeded), or
    "closed with N failed task(s)" (the engine run failed at this phase)."""
    failed = int(tasks.get("failed", 0))
    return f"closed with {failed} failed task(s)" if failed else "closed"


def asset_phase(r: rollups.RunRollup, phase: int) -> str:
    """The run's phase `phase` as "N/M" in the provider's whole plan, as its asset is named
    (phase_9_catchup is 9/9 in a run without the opt-in phase); the run's own numbering when the
    provider does not load or does not hold the phase's kinds."""
    try:
        groups = [set(g) for g in plan_of(r.source)]
    except Exception:  # noqa: BLE001 - a source that no longer loads: the run's own numbering
        groups = []
    at = next((i for i, g in enumerate(groups) if g & set(r.phases[phase])), None)
    return f"{phase + 1}/{len(r.phases)}" if at is None else f"{at + 1}/{len(groups)}"


def phase_metadata(db: Database, r: rollups.RunRollup, phase: int,
                   windows: list[tuple[float, float]] | None = None) -> dict[str, Any]:
    """A closed phase's materialisation metadata: a dry run's `dry_run_note` (DRY_RUN_NOTE) first,
    grouped reasons (this run's; without any, `no_reasons` says so of this run and names what the
    tenant holds), `figures_of` (whose figures are whose), then `phase_status` ("closed" / "closed
    with N failed task(s)"), the engine run (`engine_run`, `engine_run_id`,
    `engine_run_status_at_close`: the run's status when this phase closed, "running" for every phase
    but the last), counts in total and per kind (`per_kind_as_of`: read at this phase's close),
    tasks, rows/s, duration by payload, a capped table of this run's skipped and failed rows, the
    tenant's rows not imported at this phase's close (`tenant_rows_metadata`; not for a dry run),
    completeness. `windows`: when Dagster runs worked on the engine run (`busy_windows`), so rows/s
    leaves out the time it was stopped or paused."""
    s = phase_summary(db, r, phase, windows)
    mode = runs.get_run(db, r.run_id).mode
    now = None if r.dry_run else counts_now(db, r.tenant_id, s["told"])[""]
    md: dict[str, Any] = {
        # a dry run's first: its materialisation records what the phase counted, nothing written
        **({"dry_run_note": MetadataValue.text(DRY_RUN_NOTE)} if r.dry_run else {}),
        # then (the UI lists metadata in this order) the grouped reasons, what a phase with
        # skipped or failed rows needs read first, and whose figures these are
        "reasons": MetadataValue.md(reasons_table(s["reasons"], no_reasons(r, now, mode))),
        "figures_of": MetadataValue.text(figures_of(r, phase, now, mode)),
        "engine_run": MetadataValue.text(r.name),
        "engine_run_id": MetadataValue.int(r.run_id),
        # what this materialisation says: the phase closed (a key `engine_run_status` said
        # "running" on every phase but the last, read as the phase's state); the engine run's own
        # status when the phase closed is beside it, named as such
        "phase_status": MetadataValue.text(phase_status(s["tasks"])),
        "engine_run_status_at_close": MetadataValue.text(r.status),
        "dry_run": MetadataValue.bool(r.dry_run),
        "phase": MetadataValue.text(f"{asset_phase(r, phase)}: {', '.join(s['names'])}"),
    }
    for c in (*COUNTS, *EXTRA):
        md[c] = MetadataValue.int(int(s["totals"][c]))
    if s["totals"]["waiting"]:  # the figures are the phase's at its close; the catch-up settles these after it
        md["waiting_note"] = MetadataValue.text(
            f"{s['totals']['waiting']} row(s) waited at this phase's close for the catch-up (the run's last phase), "
            "which settles them after it (imported, a link dangling when the parent is gone at the source): its "
            "materialisation and `migrate status TENANT` say what became of them")
    # rows the phase never listed, left to the catch-up with their parents: counted nowhere above
    left = [f"{line}." for line in left_lines(r, phase=phase)]
    if left:
        md["waiting_note"] = MetadataValue.text(" ".join([md["waiting_note"].value, *left] if "waiting_note" in md else left))
    md["tasks"] = MetadataValue.text(_tasks_text(s["tasks"]))
    md["failed_tasks"] = MetadataValue.int(int(s["tasks"].get("failed", 0)))
    md["rows_per_second"] = MetadataValue.float(float(s["rows_per_second"]))
    if s["seconds"] is not None:
        md["phase_seconds"] = MetadataValue.float(round(float(s["seconds"]), 2))
    for k in s["kinds"]:
        for c in COUNTS:
            md[f"{k.kind}/{c}"] = MetadataValue.int(int(getattr(k, c)))
        for c in EXTRA:
            md[f"{k.kind}/{c}"] = MetadataValue.int(_extra(k, c))
    md["per_kind"] = per_kind_table(s["kinds"])
    md["per_kind_as_of"] = MetadataValue.text(per_kind_as_of(r, phase, mode))
    md["duration_by_payload"] = MetadataValue.md(duration_table(db, r.run_id, s["names"]))
    rows = phase_rows(db, r.run_id, s["told"])
    # the rows the table is drawn from, counted the same way (the ledger's, now), so "N of M" holds
    not_landed = sum(int(g["count"]) for g in s["reasons"] if g.get("action") in ROW_OUTCOMES)
    md["rows_not_imported"] = MetadataValue.table(
        records=[TableRecord({"kind": x["kind"], "source_id": str(x["source_id"]), "action": x["action"],
                              "reason": str(x["reason"] or "")[:300]}) for x in rows],
        schema=ROWS_SCHEMA,
    )
    of = "" if s["told"] == s["names"] else f" of the kinds it walked ({', '.join(s['told'])})"
    md["rows_not_imported_listed"] = MetadataValue.text(
        f"{len(rows)} of {not_landed} skipped, waiting or failed rows{of} of this run ({run_said(r, mode)}; capped at "
        f"{ROWS_CAP}; the explain_row job tells any row's story)")
    if now is not None:
        md.update(tenant_rows_metadata(db, r.tenant_id, s["told"], now))
    c = r.phase_completeness(phase)
    if c is not None:
        md["complete"] = MetadataValue.bool(bool(c["complete"]))
        if c["problems"]:
            md["incomplete"] = MetadataValue.md("\n".join(f"- {x}" for x in c["problems"]))
    for k in s["kinds"]:
        if k.source_total is not None:
            md[f"{k.kind}/source_total"] = MetadataValue.int(int(k.source_total))
    return md


def run_said(r: rollups.RunRollup, mode: str = "full") -> str:
    """The engine run as a reader tells a sync from a full run: "sync #12", "run #7", "dry run #3"
    (`mode`: the run's, `Run.mode`)."""
    said = "dry run" if r.dry_run else ("sync" if mode == "sync" else "run")
    return f"{said} #{r.run_id}"


def figures_of(r: rollups.RunRollup, phase: int, now: dict[str, int] | None, mode: str = "full") -> str:
    """Whose figures a phase's materialisation holds, in one line: the counts, per_kind, reasons and
    rows_not_imported are the engine run's that materialised it (a sync's: only the rows it
    touched), at this phase's close; tenant_* are the tenant's ledger now, whichever run left the
    rows (`now`: `rows_now.counts_now`'s total; None for a dry run, which keeps no rows)."""
    sync = " (a sync: only the rows it brought)" if mode == "sync" else ""
    mine = (f"counts, per_kind, reasons and rows_not_imported: this {run_said(r, mode)}'s{sync}, at this phase's close "
            f"({asset_phase(r, phase)})")
    if now is None:
        return mine
    return (f"{mine}; tenant_skipped, tenant_waiting, tenant_failed and tenant_rows_not_imported: tenant "
            f"{r.tenant_id!r}'s rows not imported as the ledger held them at this phase's close, whichever run left "
            f"them (`migrate rows {r.tenant_id}` lists them as they are now)")


def no_reasons(r: rollups.RunRollup, now: dict[str, int] | None, mode: str = "full") -> str:
    """The sentence `reasons` says when this run has none: of this run, and what the tenant still
    holds of the phase's kinds (`now`), so "no rows" is never read as the tenant's."""
    said = f"No rows skipped, waiting or failed by this {run_said(r, mode)}, no task failed"
    if now is None:
        return said + "."
    held = sum(now.values())
    if not held:
        return said + f"; tenant {r.tenant_id!r} holds no such row of these kinds either."
    return (said + f"; tenant {r.tenant_id!r} still holds {held} such rows of these kinds, from other runs "
            f"({now['skipped']} skipped, {now['waiting']} waiting, {now['failed']} failed): tenant_rows_not_imported.")


def tenant_rows_metadata(db: Database, tenant: str, kinds: list[str], now: dict[str, int],
                         at: str = "at this phase's close") -> dict[str, Any]:
    """The tenant's rows not imported of `kinds` as the ledger holds them now (`now`: their counts,
    `rows_now.counts_now`'s total; `at`: when that is, as the text says it): `tenant_skipped`,
    `tenant_waiting`, `tenant_failed` and a capped table, `tenant_rows_not_imported` (failed first,
    each with the run that last wrote it), with `tenant_rows_not_imported_listed` saying how many of
    how many - the rows `migrate rows` lists."""
    rows = rows_now(db, tenant, kinds, ROWS_CAP)
    held = sum(now.values())
    one = f" --kind {kinds[0]}" if len(kinds) == 1 else ""
    return {
        "tenant_skipped": MetadataValue.int(now["skipped"]),
        "tenant_waiting": MetadataValue.int(now["waiting"]),
        "tenant_failed": MetadataValue.int(now["failed"]),
        "tenant_rows_not_imported": MetadataValue.table(
            records=[TableRecord({"kind": x["kind"], "source_id": str(x["id"]), "action": x["action"],
                                  "run_id": int(x["run_id"]), "reason": str(x["reason"] or "")[:300]}) for x in rows],
            schema=TENANT_ROWS_SCHEMA,
        ),
        "tenant_rows_not_imported_listed": MetadataValue.text(
            f"{len(rows)} of {held} skipped, waiting or failed rows of tenant {tenant!r} {at}, whichever run left them "
            f"(capped at {ROWS_CAP}; `migrate rows {tenant}{one}` lists them all, --kind K one kind's)"),
    }


def per_kind_as_of(r: rollups.RunRollup, phase: int, mode: str = "full") -> str:
    """When `per_kind` was read: a phase closes before the run's catch-up (its last phase) runs, so
    its by_catchup and deleted_at_source are the catch-up's figures so far (0 before it ran);
    `migrate status` reads the run again later. Once the run's last phase closes, its op observes
    every earlier phase's partition with per_kind as the run ended (`run_end_metadata`)."""
    last = len(r.phases) - 1
    if phase == last or r.current_phase > last or r.status in ("succeeded", "failed", "stopped"):
        return (f"{run_said(r, mode)} as it stood when read ({r.status}): the figures `migrate status {r.tenant_id}` "
                "shows for it")
    return (f"{run_said(r, mode)} at this phase's close, before its catch-up (phase {asset_phase(r, last)}) ran: by_catchup and "
            f"deleted_at_source are 0 until it does. When the run's last phase closes, this partition gets an "
            f"observation with per_kind as the run ended (as `migrate status {r.tenant_id}` shows it)")


def run_end_metadata(db: Database, r: rollups.RunRollup, phase: int, mode: str = "full") -> dict[str, Any]:
    """An earlier phase's figures as run `r` ended (read after its last phase closed): `per_kind`
    (PER_KIND_SCHEMA, what `migrate status` shows per kind), `by_catchup` and `deleted_at_source`
    in total and per kind, `per_kind_as_of` saying so, and the tenant's rows not imported of the
    phase's kinds now (`tenant_rows_metadata`: the catch-up settles some it left). Logged as an
    observation of the phase's partition: its materialisation was read at its close, before the
    catch-up wrote."""
    kinds = r.phase_kinds(phase)
    md: dict[str, Any] = {
        "per_kind_as_of": MetadataValue.text(
            f"{run_said(r, mode)} as it ended ({r.status}), its catch-up included: the figures `migrate status "
            f"{r.tenant_id}` shows; this phase's materialisation holds them at its close"),
        "engine_run_id": MetadataValue.int(r.run_id),
    }
    for c in EXTRA:
        md[c] = MetadataValue.int(sum(_extra(k, c) for k in kinds))
        for k in kinds:
            md[f"{k.kind}/{c}"] = MetadataValue.int(_extra(k, c))
    md["per_kind"] = per_kind_table(kinds)
    if not r.dry_run:
        names = [k.kind for k in kinds]
        md.update(tenant_rows_metadata(db, r.tenant_id, names, counts_now(db, r.tenant_id, names)[""],
                                       at="at the run's end"))
    return md


def per_kind_table(kinds: list[rollups.KindRollup]) -> MetadataValue:
    """The kinds' figures as a table (PER_KIND_SCHEMA): row outcomes, EXTRA, seen and tasks."""
    return MetadataValue.table(
        records=[
            TableRecord(
                {
                    "kind": k.kind,
                    **{c: int(getattr(k, c)) for c in COUNTS},
                    **{c: _extra(k, c) for c in EXTRA},
                    "seen": int(k.seen),
                    "tasks": _tasks_text(k.tasks),
                }
            )
            for k in kinds
        ],
        schema=PER_KIND_SCHEMA,
    )


NO_KIND_IN_RUN = "no kind of this phase in the run"


def not_planned_entries(kinds: Any, run: Any) -> dict[str, Any]:
    """`run_kinds` (a line that starts with NO_KIND_IN_RUN naming the phase's `kinds` and the engine
    `run`'s) and `phase_status` ("not in this run's plan"): how a phase `run` does not plan says so,
    first, in its materialisation (`not_planned_metadata`) and in its checks' evaluations."""
    return {
        "run_kinds": MetadataValue.text(f"{NO_KIND_IN_RUN}: {', '.join(kinds)} not among {run.name}'s kinds "
                                        f"({', '.join(run.kinds)}); nothing of it migrated by this run"),
        "phase_status": MetadataValue.text("not in this run's plan"),
    }


def not_planned_metadata(kinds: Any, run: Any, left_out: str | None, why: str) -> dict[str, Any]:
    """The metadata of a phase materialised although the engine `run` plans none of its `kinds` (a
    run limited to some kinds, opt-in kinds not taken): first `run_kinds`, one line that starts with
    NO_KIND_IN_RUN and names the phase's kinds and the run's, so the partition does not read as a
    migrated phase whose figures are all missing; then `phase_status` ("not in this run's plan"),
    `left_out` (the line `engine_core.plan.left_out_line` gives, when given), the engine run, and a
    `note` ending with `why` it was materialised. No counts: the run migrated nothing of it."""
    entries = not_planned_entries(kinds, run)
    kinds = ", ".join(kinds)
    return {
        **entries,
        **({"left_out": MetadataValue.text(left_out)} if left_out else {}),
        "engine_run": MetadataValue.text(run.name),
        "engine_run_id": MetadataValue.int(run.id),
        "note": MetadataValue.text(f"{kinds} not in this run's plan: nothing migrated. {why}"),
    }
