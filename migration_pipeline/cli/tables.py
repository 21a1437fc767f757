"""The tables the commands print: a run's rollup per kind, the tenants' overview, per-phase results,
grouped reasons, the verify verdict; laid out to fit the console without cutting a cell short."""
from __future__ import annotations

import json
import re
from datetime import timezone
from typing import Any

from rich.cells import cell_len
from rich.table import Table

from engine_core import rollup as rollups
from engine_core.progress import format_seconds
from engine_core.rollup_left import left_lines
from engine_core.rollup_totals import run_totals
from engine_core.providers.registry import provider_for
from migration_pipeline.cli.output import console


def phase_number(source: str, kinds: Any, own: int, own_total: int) -> tuple[int, int]:
    """(number from 1, phases) of the run's phase of `kinds` in the provider's whole plan, as the
    phase assets are numbered (the catch-up of a run that left the opt-in phase out is 9 of 9, as
    its asset phase_9_catchup, not 8 of 8); the run's own numbering (`own`, `own_total`) when the
    provider does not load or does not hold those kinds."""
    try:
        groups = [set(g) for g in provider_for(source).phases() if g]
    except Exception:  # noqa: BLE001 - a source that no longer loads: the run's own numbering
        groups = []
    at = next((i for i, g in enumerate(groups) if g & set(kinds)), None)
    return (own, own_total) if at is None else (at + 1, len(groups))


def phase_labels(source: str, plan: list[list[str]]) -> list[str]:
    """Each phase of a run's `plan` as "N/M" (`phase_number`)."""
    return ["{}/{}".format(*phase_number(source, kinds, i + 1, len(plan))) for i, kinds in enumerate(plan)]


def run_phase(source: str, plan: list[list[str]], current_phase: int) -> tuple[int, str, str]:
    """Where a run of `plan` is: (its phase's position in `plan` from 1, "N/M" in the run's own plan,
    "N/M" as the phase asset is numbered, `phase_labels`). The two differ for a run of some kinds
    (`--kinds users`: "2/2" and the catch-up's asset "9/9"); a finished run's is its last phase."""
    if not plan:
        return 0, "0/0", "0/0"
    at = min(current_phase, len(plan) - 1)
    return at + 1, f"{at + 1}/{len(plan)}", phase_labels(source, plan)[at]


def rollup_doc(r: rollups.RunRollup) -> dict[str, Any]:
    """A rollup as the commands' --json give it: every phase number from 1, in the run's own
    `phases` (`phases[n - 1]`; `phase_assets[n - 1]` its asset's "N/M") - `current_phase`, each
    kind's `phase` and each `completeness` entry's `phase` - as the tables number them, with `phase`
    ("2/2") and `phase_asset` ("9/9") beside them (`run_phase`). The engine's own rollup numbers
    them from 0."""
    source = getattr(r, "source", "")
    at, phase, phase_asset = run_phase(source, r.phases, r.current_phase)
    doc = r.as_dict()
    for entry in (*doc["kinds"], *doc["completeness"]):
        entry["phase"] += 1
    doc.update(current_phase=at, phase=phase, phase_asset=phase_asset, phase_assets=phase_labels(source, r.phases))
    return doc


# How a dry run's state is listed, before the state: "dry run: succeeded" reads as no migration
# where "succeeded (dry run)", folded on a narrow console, showed "succeeded" first like a real run
DRY_RUN_MARK = "dry run: "


def written_columns(dry_run: bool) -> tuple[str, ...]:
    """A dry run writes nothing: its counts are what a real run would do."""
    if dry_run:
        return ("would import", "would match", "already here", "would update")
    return ("imported", "matched", "already here", "updated")


FOLD_WIDTH = 16  # a text column's width on a narrow console: longer words fold onto the next line


def fitted_table(title: str, columns: list[tuple[str, str]], rows: list[tuple[str, ...]], *,
                 fold: tuple[str, ...] = (), drop: tuple[str, ...] = ()) -> Table:
    """A rich Table of `columns` ((header, "left" | "right")) and `rows` that `console`'s width
    shows without cutting a cell short: on an 80-column terminal rich had cut every cell to "123…"
    and "pip…". The text columns in `fold` wrap, folding a word too long for
    them; the others (numbers) are never wrapped or cut. When the table is wider than the console,
    the numbers' headers go one word a line and the `fold` columns at most FOLD_WIDTH wide, then
    the columns in `drop` are left out, least important first, until the rest fits (the caption
    names them). Print it with `soft_wrap=False`: the piped console's soft wrap (its lines of text
    are never broken) would leave the caption one long line."""
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
    catch-up` (rows of the kind the run's catch-up wrote; the catch-up's own row counts them all) and
    `left to catch-up` (rows its phase left to the catch-up's walk, `rows.WAITING`: a count of what
    the phase did, as the others are; what became of them is the catch-up's count, and the rows
    waiting now are `migrate rows --action waiting`'s: after a succeeded run, none). Under it, the rows
    a phase left to the catch-up unlisted with their parents (`rollup_left`: counted nowhere above)."""
    title = f"{r.name}{', a dry run' if r.dry_run else ''}: {r.status}"
    labels = phase_labels(getattr(r, "source", ""), r.phases)
    # the phase assets' numbering ("9/9" for the catch-up of a run of some kinds), as the table's
    # phase column, the progress lines and the overview number it: one count, not the run's own beside it
    asset = run_phase(getattr(r, "source", ""), r.phases, r.current_phase)[2]
    phase_note = f"phase {asset}" if r.status in ("running", "stopping") and labels else ""
    written = written_columns(r.dry_run)
    columns = [(col, "left" if col in ("kind", "tasks") else "right") for col in
               ("phase", "kind", "tasks", "seen", *written, "skipped", "left to catch-up", "failed",
                "deleted at source", "by catch-up")]
    rows = []
    for k in r.kinds:
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(k.tasks.items())) or "-"
        caught = int(k.caught_up.get("seen", 0))
        rows.append((labels[k.phase].split("/")[0] if k.phase < len(labels) else str(k.phase + 1), k.kind, tasks, str(k.seen), str(k.imported), str(k.matched),
                     str(k.already_here), str(k.updated), str(k.skipped), str(k.waiting), str(k.failed), str(k.deleted_at_source),
                     str(caught) if caught else "-"))
    # narrow: the phase (the kinds are in plan order), then what is most often 0; a kind's name is
    # never wrapped or cut ("organization/s" on an 80-column terminal)
    console.print(fitted_table(f"{title} {phase_note}".strip(), columns, rows, fold=("tasks",),
                               drop=("phase", "left to catch-up", "by catch-up", written[1], "deleted at source", "seen", written[3],
                                     written[2], "skipped", "tasks")), soft_wrap=False)
    for line in left_lines(r):  # rows a phase never listed, left to the catch-up with their parents
        console.print(line, highlight=False)
    for line in catchup_lines(r):  # a skipped or failed figure beyond its phase's: the catch-up's, said so
        console.print(line, highlight=False)
    for problem in r.incomplete:  # completeness (engine_core.rollup): never a silent "succeeded"
        console.print(f"[red]does not add up: {problem}[/red]")
    for note in r.unfinished:  # a stopped run's counts not met yet, with why (engine_core.rollup.cut_short)
        console.print(f"[yellow]not finished: {note}[/yellow]")
    if r.reasons:
        console.print(reasons_table(r.reasons, r.tenant_id), soft_wrap=False)
    if r.seconds is not None:
        console.print(f"{elapsed_said(r.seconds, r.stopped_seconds)}; tasks: "
                      + ", ".join(f"{n} {s}" for s, n in sorted(r.tasks.items())))


def elapsed_said(seconds: float, stopped_seconds: float = 0.0) -> str:
    """A run's elapsed time as `migrate status` says it: the time it was running ("elapsed 12.0s"),
    and, once it was stopped and reopened, that the time stopped is left out ("elapsed 12.0s running
    (stopped 24h00m, not counted)"): a run stopped overnight does not read as a day's work."""
    if stopped_seconds < 0.5:
        return f"elapsed {seconds:.1f}s"
    return f"elapsed {seconds:.1f}s running (stopped {format_seconds(stopped_seconds)}, not counted)"


def catchup_lines(r: rollups.RunRollup) -> list[str]:
    """One line per kind and outcome whose figure holds more than its phase counted (its progress
    lines and its phase's materialisation): "emails: 9 failed: 8 as its phase counted them (4 of them
    records kept apart), 1 the catch-up failed after the phase closed", "deal_products: 38 skipped: 0
    as its phase counted them, 38 the catch-up skipped after the phase closed", and of a kind whose
    phase left rows to the catch-up, how many of those it skipped ("persons: 42 skipped: 29 as its
    phase counted them, 13 the catch-up skipped after the phase closed (13 of them rows the phase
    left to the catch-up: counted here, no longer in left to catch-up)")."""
    lines = []
    for k in r.kinds:
        for outcome in ("skipped", "failed"):
            later = getattr(k, f"{outcome}_by_catchup", 0)
            if not later:
                continue
            kept = (f" ({k.kept_apart} of them records kept apart)"
                    if outcome == "failed" and getattr(k, "kept_apart", 0) else "")
            total = getattr(k, outcome)
            waited = sum(int(getattr(w, "waiting_skipped", 0)) for w in r.kinds
                         if w.kind.removesuffix("_archived") == k.kind) if outcome == "skipped" else 0
            left = (f" ({waited} of them rows the phase left to the catch-up: counted here, no longer in left to "
                    f"catch-up)" if waited else "")
            lines.append(f"{k.kind}: {total} {outcome}: {total - later} as its phase counted them{kept}, "
                         f"{later} the catch-up {outcome} after the phase closed{left}")
    return lines


OUTCOMES = ("seen", "imported", "matched", "already_here", "updated", "skipped", "waiting", "failed",
            "deleted_at_source")
REASON_GROUPS_SHOWN = 20


_BYTES = re.compile(r"(\d{1,3}(?:,\d{3})+|\d+) bytes")


def human_bytes(n: int) -> str:
    """A size in bytes as people read it, binary units: 512 -> "512 bytes", 1000000 -> "976.6 KiB",
    104857600 -> "100.0 MiB"."""
    size, unit = float(n), "bytes"
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


# How a terminal table shows the shape's placeholders (`runlog.reason_shape`): a brace read as a
# template left unformatted ("organizations {n} is not here").
_PLACEHOLDERS = {"{n}": "N", "{id}": "ID", "{value}": "..."}


def shown_reason(group: dict[str, Any]) -> str:
    """A reason group's label as the table shows it: a group of one row is its reason as written;
    otherwise its shape (`rollup.grouped_reasons`) with the placeholders as N, ID and "..."
    ("organizations N is not here"), and a size the shape holds as "{n} bytes" given from the
    group's example, humanly ("e.g. 976.6 KiB")."""
    shape, example = group["reason"], group.get("example") or ""
    one = group.get("count", 1) == 1
    sizes = [int(m.group(1).replace(",", "")) for m in _BYTES.finditer(example)]
    if "{n} bytes" in shape and len(sizes) == shape.count("{n} bytes"):
        for size in sizes:
            shape = shape.replace("{n} bytes", ("" if one else "e.g. ") + human_bytes(size), 1)
    elif one and example:
        return example
    for placeholder, shown in _PLACEHOLDERS.items():
        shape = shape.replace(placeholder, shown)
    return shape


def reasons_table(reasons: list[dict[str, Any]], tenant: str) -> Table:
    """Grouped reasons (`rollup.grouped_reasons`) as `status` and `report` show them: the
    REASON_GROUPS_SHOWN biggest, and a caption saying how many groups and rows are not shown and
    where they are (`--json`, `migrate rows`): an account can have many more groups than are shown,
    and none is left out silently."""
    rt = Table(title="grouped reasons (skipped and failed rows from the ledger, failed tasks)")
    for col in ("kind", "what", "count", "reason", "samples"):
        rt.add_column(col)
    for g in reasons[:REASON_GROUPS_SHOWN]:
        rt.add_row(g["kind"], g.get("action", ""), str(g["count"]), shown_reason(g), ", ".join(g["samples"]))
    rest = reasons[REASON_GROUPS_SHOWN:]
    if rest:
        rt.caption = (f"{len(rest)} more group(s) of {sum(g['count'] for g in rest)} row(s) or task(s) not shown: "
                      f"`--json` has every group, `migrate rows {tenant}` every row")
    return rt


def outcome_counts(r: rollups.RunRollup, kind: str | None = None) -> dict[str, int]:
    """A run's row outcomes summed over its kinds (or one kind): {"seen", "imported", "matched",
    "already_here", "updated", "skipped", "waiting" (left to the catch-up's walk and not taken by it
    yet: none once it ran), "failed", "deleted_at_source"}. Over the kinds each row is counted
    once (`rollup_totals.run_totals`): a row the catch-up met again - one its phase left waiting,
    skipped or failed - is counted with the catch-up's outcome, not again in `seen`; so `seen` is
    the rows served (the source's own count on an unchanging account) and the outcomes add up to it."""
    if kind is not None:
        chosen = [k for k in r.kinds if k.kind == kind]
        return {c: sum(int(getattr(k, c)) for k in chosen) for c in OUTCOMES}
    try:
        catchup = getattr(provider_for(r.source), "catchup_kind", None)
    except Exception:  # noqa: BLE001 - a source that no longer loads: no catch-up kind to tell apart
        catchup = None
    return run_totals(r, catchup)


def print_overview(overview: list[dict[str, Any]]) -> None:
    """The overview as a table, with each tenant's skipped, waiting (a column, and a word of the
    title, only when some row waits) and failed rows beside its status; a run no worker drains
    ("unattended") has "idle 10m05s" (or "no live worker since 21:10:04", UTC, when its workers'
    processes are gone) beside its
    status and a line under the table says what that means and what resumes it (the overview had
    shown a dead run as plainly "running"); a running run whose source fails every task that asks
    it ("source_failing") has "(source failing: retrying)" there, and a line says what follows."""
    if not overview:
        console.print("no tenant has a migration run yet: `migrate run --tenant T` starts one")
        return
    columns = [("tenant", "left"), ("source", "left"), ("run", "right"), ("status", "left"), ("phase", "right"),
               ("skipped", "right"), ("waiting", "right"), ("failed", "right"), ("tasks", "left"),
               ("started (UTC)", "left"), ("finished (UTC)", "left")]
    rows = [(o["tenant"], o["source"], f"#{o['run_id']}",
             (DRY_RUN_MARK if o["dry_run"] else "") + o["status"] + (f" (no live worker since {o['no_live_worker_since']:%H:%M:%S})" if o.get("no_live_worker_since")
                            else f" (idle {format_seconds(o['idle_seconds'])})" if o.get("unattended") else "")
             + (" (source failing: retrying)" if o.get("source_failing") else "")
             + (" (sync)" if o["mode"] == "sync" else ""),
             o["phase"], str(o.get("skipped", 0)), str(o.get("waiting", 0)), str(o.get("failed", 0)),
             ", ".join(f"{n} {s}" for s, n in o["tasks"].items()) or "-",
             *(f"{o[k].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S}" if o[k] else "-" for k in ("started_at", "finished_at")))
            for o in overview]
    waits = any(o.get("waiting") for o in overview)
    if not waits:  # only a run stopped before its catch-up has them
        columns, rows = ([c for c in columns if c[0] != "waiting"],
                         [row[:6] + row[7:] for row in rows])
    # an 80-column terminal had cut every cell short: names and tasks fold,
    # and the times go first when it is still too narrow; the title names the columns there are
    counted = "skipped, waiting (for the catch-up) and failed" if waits else "skipped and failed"
    table = fitted_table(f"tenants (each one's latest run; {counted}: the rows `migrate rows TENANT` lists)",
                         columns, rows, fold=("tenant", "source", "status", "tasks"),
                         drop=("finished (UTC)", "started (UTC)", "waiting"))
    console.print(table, soft_wrap=False)
    if any(o["dry_run"] for o in overview):
        console.print("a dry run's skipped and failed are its own counts, as its table says them: the rows a real "
                      "run would skip or fail (it wrote none for `migrate rows`)", highlight=False)
    failing = [o["tenant"] for o in overview if o.get("source_failing")]
    if failing:
        console.print(f"[yellow]source failing: every task that asked it since its retries began failed; the engine pauses "
                      f"such a run after MIGRATE_SOURCE_DOWN_SECONDS; `migrate status {failing[0] if len(failing) == 1 else 'T'}` "
                      "says since when and why[/yellow]")
    idle = [o["tenant"] for o in overview if o.get("unattended")]
    if idle:
        who = idle[0] if len(idle) == 1 else "T"
        console.print(f"[yellow]idle: nothing has worked on the run for longer than MIGRATE_STALE_LOCK_SECONDS, or the "
                      f"process that claimed its tasks is gone; no worker is draining it; `migrate run --tenant {who}` resumes it here, `migrate ui` (a daemon) "
                      f"in the background[/yellow]")


def dry_status(status: str) -> str:
    """A dry run's phase asset state as its launch table lists it: Dagster's "materialized" read as
    data written, so a dry run's says "dry run: nothing written" (its phase counted what a real run
    would do); "failed" and "skipped" after DRY_RUN_MARK."""
    return DRY_RUN_MARK + ("nothing written" if status == "materialized" else status)


def print_phase_results(results: list[Any], dry_run: bool = False) -> None:
    """Per phase asset its Dagster status (a dry run's in `dry_status`'s words) and materialisation
    figures; on a narrow console the figures the engine run's table below repeats go first
    (`fitted_table`)."""
    written = written_columns(dry_run)
    columns = [(col, "left" if col in ("phase asset", "status", "tasks") else "right") for col in
               ("phase asset", "status", *written, "skipped", "failed", "deleted at source", "tasks", "rows/s")]
    rows = [(r.asset, dry_status(r.status) if dry_run else r.status, *(str(r.metadata.get(k, "-")) for k in
             ("imported", "matched", "already_here", "updated", "skipped", "failed", "deleted_at_source",
              "tasks", "rows_per_second"))) for r in results]
    console.print(fitted_table("per-phase results (Dagster materialisations)" + (" of a dry run" if dry_run else ""),
                               columns, rows, fold=("phase asset", "status"),
                               drop=("rows/s", written[1], "deleted at source", written[3], written[2], "skipped")),
                  soft_wrap=False)
    for r in results:
        if r.status == "failed":
            console.print(f"[red]{r.asset} failed:[/red] {r.message}")


def print_verify(result: Any) -> None:
    """The verify verdict: one line per kind, the differences (ids capped), the cost beside it."""
    lines = result.lines()
    for line in lines[:-1]:
        style = "red" if line.startswith("  ") else ("yellow" if "not checked" in line else None)
        console.print(f"[{style}]{line}[/{style}]" if style else line, highlight=False)
    console.print(f"[{'green' if result.passed else 'red'}]{lines[-1]}[/]", highlight=False)
