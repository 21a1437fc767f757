"""Launching a tenant's Dagster run from the command line and waiting for it: the checks before
the launch, the run placed and executed here or queued for a daemon, a stop signal turned into
stopping what was started, the results printed and the exit code. `migration_pipeline.launch`
holds the Dagster side."""
from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from engine_core import db as dbmod
from engine_core import ledger_reads
from engine_core import rollup as rollups
from engine_core import runs, runs_reads
from engine_core.config import check_environment, number
from engine_core.coverage import coverage
from engine_core.plan import left_out_line
from engine_core.providers.registry import provider_for
from migration_pipeline.cli.output import again_line, console, emit, err_console, fail, open_db, what_now
from migration_pipeline.cli.options import left_out_of
from migration_pipeline.cli.progress import Progress
from migration_pipeline.cli.remedy import remedies
from migration_pipeline.cli.tables import print_phase_results, print_rollup, rollup_doc
from migration_pipeline.cli.stopping import asset_order, stop_what_we_started, stopped_elsewhere
from migration_pipeline import preload, stack, tags
from migration_pipeline.alembic_later import storage_modules
from migration_pipeline.instance import dagster_env, get_instance
from migration_pipeline.launch.checks import (LaunchError, check_launch, check_tenant, check_tenant_source,
                                              new_run_config, unlinked_kinds)
from migration_pipeline.launch.signals import Interrupted, signals_held, signals_interrupt


def source_for(requested: str | None) -> str:
    """The source a command works on: `--source`, else MIGRATE_SOURCE, else the Dagster face's
    default (`resolve_source`). One named explicitly must load: a mistyped MIGRATE_SOURCE launched a
    run on the fallback `example` definitions that failed in Dagster and left its partition behind
   ; now it is one line naming the variable, exit 2, nothing launched."""
    named = (requested or os.environ.get("MIGRATE_SOURCE") or "").strip()
    if named:
        try:
            provider_for(named).phases()
        except Exception as e:  # noqa: BLE001 - an unknown source or a provider that does not load
            where = "--source" if requested else "MIGRATE_SOURCE"
            fail(f"{where}={named!r} is not a source this project can migrate from: {e}")
        return named
    from migration_pipeline.definitions import resolve_source  # Dagster: a launch only, in its paused collector

    return resolve_source(requested)


def check_not_migrated(db: dbmod.Database, tenant: str, source: str, kinds: list[str] | None, dry_run: bool) -> None:
    """Before `migrate run` launches a new full run: a tenant whose succeeded full runs already took
    every kind the launch asks for (`runs.migrated_by`: their kinds together, not a dry run unless this
    one is) is refused in one line (exit 2, nothing launched) naming the latest such run ("with the
    runs before it" when it alone did not take them all) and saying what to do - the engine's attach
    policy would refuse it anyway (`runs.AlreadyMigrated`), after a Dagster run and a CANCELED partition.
    When they took only some, the launch goes on and takes the others (`runs.attach`,
    `coverage.Coverage.lacking`): said first in one line on stderr (`Coverage.line`)."""
    provider = provider_for(source)
    covered = coverage(db, tenant, provider, {"kinds": kinds, "dry_run": dry_run})
    if covered is not None and covered.partial:
        click.echo(covered.line(tenant), err=True)
    if covered is None or not covered.complete or covered.by is None:
        return
    migrated_by = covered.by
    latest = runs.latest_run(db, tenant, source)
    before = "" if set(covered.wanted) <= set(migrated_by.kinds) else " with the runs before it"
    synced = f" and synced by {latest.name}" if latest.mode == "sync" else ""
    fail(f"tenant {tenant!r} is already migrated by {migrated_by.name}"
          f"{' (a dry run)' if migrated_by.dry_run else ''}{before}{synced}: "
          f"`migrate sync {tenant}` brings what changed since; `migrate run --tenant {tenant} --new-run` "
          f"migrates it again from scratch")


def ignored_on_relaunch(db: dbmod.Database, tenant: str, source: str, new_cfg: dict[str, Any],
                        existing: Any = ...) -> str | None:
    """What `migrate run` says (one line on stderr, not an error) when its launch will work on a run
    that exists - the tenant's live run (joined) or its latest failed or stopped one (retried or
    resumed), as `runs.attach` decides (`runs.existing_attachment`) - and it was given --options or --kinds: those are ignored,
    the run keeps what it started with, and saying so is better than silence. Without them, a launch that joins a
    running run says so (two `migrate run` of one tenant at once: the second joins the first's run), and one whose
    worker is gone (a killed command: `rollup.no_live_worker_since`) says it takes the run over. None when the
    launch starts a new run, or retries or resumes one without them.

    The dry-run flag is not merely ignored (a --dry-run that resumed a stopped real run would
    write): a --dry-run launch that would work on a run that is not a dry run is
    refused in one line (`fail`: exit 2, SystemExit, nothing launched), naming the run and saying
    to finish or resume it first without --dry-run. The other way round is safe, so it is a note,
    given with or without other flags: a launch without --dry-run that works on a dry run says it
    writes nothing and that a run that writes can start once the dry one has succeeded.
    `existing`: `runs.existing_attachment` as the caller read it (default: read now)."""
    options = json.loads(new_cfg.get("options_json") or "{}")
    wants_dry = bool(new_cfg.get("dry_run"))
    if existing is ...:
        existing = runs.existing_attachment(db, tenant, source)
    if existing is None:
        return None  # a new run starts with them (a succeeded one was refused by check_not_migrated)
    run = existing.run
    how = "joins" if existing.action == "joined" else "resumes" if run.status == "stopped" else "retries"
    gone = rollups.no_live_worker_since(db, run.id) if how == "joins" else None
    if gone is not None:  # a killed command's run: nobody drives it, this launch does
        how = "takes over"
    if wants_dry and not run.dry_run:
        verb = {"joins": "join", "takes over": "take over", "resumes": "resume", "retries": "retry"}[how]
        first = ("let it finish first" if how == "joins" else
                 f"finish or {verb} it first with `migrate run --tenant {tenant}` (without --dry-run)")
        fail(f"--dry-run refused: this launch would {verb} the {run.status} {run.name}, which is not a dry run "
              f"and writes; {first}; nothing was launched")
    # --dry-run is not among them: refused above on a run that writes, what was asked for on a dry one
    given = [flag for flag, value in (("--options", options), ("--kinds", new_cfg.get("kinds"))) if value]
    keeps = started_with(run)
    if run.dry_run and not wants_dry:
        line = (f"note: this launch {how} the {run.status} {run.name}, a dry run: it writes nothing; once it has "
                f"succeeded, `migrate run --tenant {tenant}` starts a run that writes")
        return line + (f"; {' and '.join(given)} ignored: it keeps {keeps}" if given else "")
    if not given:
        if gone is not None:
            return (f"note: this launch takes over the running {run.name}, whose worker is gone (no live worker "
                    f"since {gone:%Y-%m-%d %H:%M:%S} UTC): it goes on from its tasks' checkpoints")
        return (f"note: this launch joins the running {run.name}, which another launch or worker drives: "
                f"it works on that run and waits for it to end" if how == "joins" else None)
    return (f"note: {' and '.join(given)} ignored: this launch {how} the {run.status} {run.name}, which keeps {keeps}; "
            f"a run with others can start once it has succeeded (--new-run)")


def joining_tags(existing: Any, source: str) -> dict[str, str]:
    """The run tags of a launch that joins `existing` (`runs.existing_attachment`, "joined"): the
    engine run it joins, so its phase ops attach to that run (`runs.attach`'s tagged run) even when
    it has ended by the time they start - it then reports that run's ending, as its note promised,
    instead of being refused as a new launch on a migrated tenant - and `tags.JOINED`. None joined: {}."""
    if existing is None or existing.action != "joined":
        return {}
    return {tags.ENGINE_RUN: str(existing.run.id), tags.SOURCE: source, tags.JOINED: "true"}


def started_with(run: Any) -> str:
    """What a run keeps when a relaunch names other kinds or options, in words: "the kinds it
    started with (persons, deals) and its options ({"burst_limit": 40})", "... and no options"
    when it was given none."""
    options = json.dumps(run.options, separators=(", ", ": "), default=str) if run.options else None
    return (f"the kinds it started with ({', '.join(run.kinds)}) and "
            + (f"its options ({options})" if options else "no options"))


def _execute_here(instance: Any, run_id: str, progress: "Progress", home: Path, timeout: float | None) -> Any:
    """The Dagster run placed in this process (`launch.place_tenant_run(start_here=True)`),
    executed here (`launch.InProcessRun`), the progress shown meanwhile from its watcher thread on
    the command's own stdout (stderr under --json), Dagster's run output in DAGSTER_HOME/in-process-runs.log
    (`launch.output_aside`); the finished run. A stop signal stops the run (CANCELED, the engine
    run stopped) and is raised afterwards as Interrupted (announced already); --timeout
    stops it the same way and raises TimeoutError."""
    # Dagster (~2 s of imports): only a launch needs it
    from migration_pipeline.launch.in_process import IN_PROCESS_LOG, InProcessRun, output_aside

    with output_aside(home / IN_PROCESS_LOG) as (out, err):
        # rich's own attribute: None while the console follows sys.stdout. The `file` property gives
        # sys.stdout itself, and putting that back pinned the console to that stream for good (under
        # click's test runner, every later command of the process printed to the real stdout)
        shown = progress.out
        previous = shown._file
        shown.file = err if shown is err_console else out
        try:
            here = InProcessRun(instance, run_id, on_tick=progress, err=err, timeout=timeout)
            dagster_run = here.execute()
            if dagster_run is not None and here.signalled is None and not here.timed_out:
                # the watcher's last tick may predate the run's end (it stops when the run does): the
                # last phase's line, and the closing lines of those the barrier passed since, are said here
                progress(dagster_run)
            progress.close()  # the bars end on the terminal, before it is handed back
        finally:
            shown.file = previous
    if here.signalled is not None:
        raise Interrupted(here.signalled, announced=True)
    if here.timed_out:
        raise TimeoutError(f"Dagster run {run_id} was still running after {timeout:.0f} s (--timeout): it was stopped "
                           f"({dagster_run.status.value if dagster_run else 'gone'}); launching the tenant again resumes it")
    return dagster_run


@contextlib.contextmanager
def before_launch() -> Iterator[None]:
    """Around what `migrate run` / `sync` do before their launch line (imports, checks, the source's
    token request, opening the instance): a Ctrl-C there is one line on stderr saying nothing was
    launched, exit code 130 (128 + SIGINT) as a Ctrl-C later in the command ends, not click's
    "Aborted!" with 1. From the launch on, `signals_interrupt` and
    `stop_what_we_started` take over: they stop what was started and say what."""
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
    collector ran over them while they grew cost ~1 CPU-s of each launch (importing those
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


class DagsterAhead:
    """Dagster's modules for a launch (`MODULES`: the jobs, the launch modules, the definitions as
    MIGRATE_SOURCE names them, Dagster's storage modules with alembic deferred) imported on a
    thread of their own, started where a launch's checks begin: those wait on the engine database
    (connections, the schema check, the tenant's runs) and the source (the token's request) while
    the imports, ~1 s of CPU, hold the interpreter. The caller imports the same modules after
    `join()`, which finds them loaded; an import that failed here is left out of sys.modules
    (Python's rule) and fails again there, on the caller's thread, with its real error.

    Start it once the environment the definitions read is final (MIGRATE_SOURCE, the overrides):
    the definitions module is built from it at import."""

    MODULES = ("migration_pipeline.jobs", "migration_pipeline.launch.daemon", "migration_pipeline.launch.in_process",
               "migration_pipeline.launch.place", "migration_pipeline.launch.results", stack.DEFS_MODULE)

    def __init__(self) -> None:
        self.thread = threading.Thread(target=self._load, name="migrate-dagster-ahead", daemon=True)
        self.thread.start()

    def _load(self) -> None:
        try:
            for name in self.MODULES:
                importlib.import_module(name)
            storage_modules()
        except BaseException:  # noqa: BLE001 - raised again by the caller's own import (class docstring)
            pass

    def join(self) -> None:
        """Wait until the modules are imported (or their import failed)."""
        self.thread.join()

    @staticmethod
    def tenant_job() -> str:
        """The tenant job's name (`jobs.TENANT_JOB`): the jobs module as the thread loads it (Python's
        module lock waits for that module alone), at once when the caller named a job from it."""
        return importlib.import_module("migration_pipeline.jobs").TENANT_JOB


def launch_through_dagster(tenant: str, source: str, run_config: dict, as_json: bool,
                           env_overrides: dict[str, str] | None = None, timeout: float | None = None,
                           job: str | None = None, outcome: dict[str, Any] | None = None,
                           new_run: bool = False, ends_with_what_now: bool = True) -> int:
    """Check, add the partition, create the tenant job's run (or `job`'s: the sync job), execute it
    in this process when no daemon serves the instance and the lane has room (MIGRATE_RUN_IN_PROCESS
    =0: never), else queue it and keep a daemon alive (the UI's, or one for the duration) and wait
    (saying why while queued); print the per-phase results; the exit code. A launch that fails
    leaves nothing behind. `outcome`, when given, receives "engine_run_id" and "cost"
    ({"requests", "tokens"}: what the engine run's own tasks counted, `run_cost`). `new_run`: the
    tenant job starts a new engine run even when the tenant's latest run succeeded (run tag
    `migration/new_run=true`); without it such a tenant is refused before launching
    (`check_not_migrated`). `ends_with_what_now=False` leaves the "what now" lines out (a command that
    launches twice, `demo --live`, prints them once at its end; `outcome` then carries "ui", the UI's
    address or None)."""
    with before_launch(), collector_paused():  # on again, with what was built frozen, before the run starts
        check_tenant(tenant)
        os.environ.update(env_overrides or {})
        os.environ["MIGRATE_SOURCE"] = source
        ahead = DagsterAhead()  # Dagster's modules load while the checks below wait on the database and the source
        settings = check_environment()
        new_cfg = run_config["resources"]["new_run"]["config"]
        check_launch(source, new_cfg.get("kinds"), json.loads(new_cfg.get("options_json") or "{}"))
        tenant_job = job is None or job == ahead.tenant_job()
        taken_over = False
        placed_tags = {tags.NEW_RUN: "true"} if new_run else {}
        with open_db() as db:
            check_tenant_source(db, tenant, source)  # another company's settings: before any run is placed
            if tenant_job and not new_run:
                check_not_migrated(db, tenant, source, new_cfg.get("kinds"), bool(new_cfg.get("dry_run")))
            if tenant_job:
                existing = runs.existing_attachment(db, tenant, source)
                placed_tags.update(joining_tags(existing, source))
                note = ignored_on_relaunch(db, tenant, source, new_cfg, existing)
                if note:
                    click.echo(note, err=True)
                    taken_over = "this launch takes over" in note
                if not note and new_cfg.get("kinds"):  # a new run of chosen kinds: are their parents there?
                    lonely = unlinked_kinds(provider_for(source), new_cfg.get("kinds"),
                                            ledger_reads.ledger_kinds(db, tenant))
                    if lonely:
                        click.echo(lonely, err=True)
        queue_timeout = number("MIGRATE_QUEUE_TIMEOUT_SECONDS")
        env = dagster_env()
        ahead.join()
        # Dagster (~2 s of imports, loaded by `ahead` by now), paused collector: only a launch needs it
        from migration_pipeline.jobs import TENANT_JOB
        from migration_pipeline.launch.daemon import daemon_for_duration, daemon_liveness
        from migration_pipeline.launch.in_process import run_in_process
        from migration_pipeline.launch.stop import run_started_at
        from migration_pipeline.launch.place import add_tenant, place_tenant_run, undo_failed_launch, wait_for_run
        from migration_pipeline.launch.results import phase_results, run_failure_message, wait_tenant_quiet

        here_allowed = run_in_process()
        instance = get_instance()
    home = Path(env["DAGSTER_HOME"])
    progress = Progress(as_json, instance)
    shown = progress.out  # the launch line, the queue's and the progress lines: stderr under --json
    say = lambda m: shown.print(f"  {m}")  # noqa: E731
    run_id = str(uuid.uuid4())
    job = job or TENANT_JOB
    try:
        with signals_interrupt(), \
                daemon_for_duration(instance, env, home, home / "daemon.log", echo=say, linger=queue_timeout) as keeper:
            try:
                # No daemon serves the instance: the run executes in this process (no daemon, code
                # server or run worker to start), lane permitting. A live one (the UI's)
                # runs it as before; else one is started while the run is built here.
                live = daemon_liveness(instance, keeper.lock.path)
                start_here = here_allowed and not live.alive
                if not start_here:
                    keeper.ensure()
                added = add_tenant(instance, tenant)
                try:
                    placed = place_tenant_run(instance, tenant, run_config, job=job, run_id=run_id,
                                                     run_tags=placed_tags or None,
                                                     start_here=start_here)
                except BaseException:
                    undo_failed_launch(instance, tenant, run_id, added)
                    raise
                where = ("; executing it in this process (no daemon serves the instance)" if placed.here else
                         f"; queued: {placed.why}" if placed.why else "")
                shown.print(f"launched Dagster run {run_id} ({job}) for tenant {tenant!r} ({source}){where}; "
                            f"Dagster home {home}")
                if placed.here:
                    dagster_run = _execute_here(instance, run_id, progress, home, timeout)
                else:
                    dagster_run = wait_for_run(instance, run_id, on_tick=progress, timeout=timeout, keeper=keeper,
                                                      lane_width=settings.lane_width, queue_timeout=queue_timeout,
                                                      on_queued=say)
                wait_tenant_quiet(instance, tenant, timeout=30)
                # our daemon (if we started one) shuts down while the results are read
                keeper.stop_soon(queue_timeout)
                progress.close()  # the bars stop before the results are printed
                results = phase_results(instance, run_id, asset_order(source))
                engine_id = dagster_run.tags.get("migration/run_id")
                with dbmod.connect(max_size=2, apply=False) as db:  # the checks' open_db applied the schema
                    r = rollups.rollup(db, int(engine_id)) if engine_id else None
                    cost = runs_reads.run_cost(db, int(engine_id)) if engine_id else None
                    bad = ledger_reads.bad_row_counts(db, tenant)
                    changed = ledger_reads.changed_bodies(db, tenant)  # for the hints: no second connection
                    left = left_out_of(runs.get_run(db, int(engine_id)), db) if engine_id else {}
                    remedy = remedies(db, tenant, source)  # the lists skipped rows wait for, or the sync
                    noted = runs.stop_noted(db, int(engine_id), run_started_at(instance, run_id)) if engine_id else None
            except Interrupted as signalled:
                with signals_held():
                    progress.close()
                    # the run exists once place_tenant_run has created it, maybe before it was queued
                    stop_what_we_started(instance, keeper, run_id, tenant, signalled, source,
                                         sync=job != TENANT_JOB, as_json=as_json)
                sys.exit(signalled.exit_code)
        if outcome is not None:
            outcome.update(engine_run_id=int(engine_id) if engine_id else None, name=r.name if r else None,
                           cost={k: int(v) for k, v in cost.items()} if cost else {"requests": 0, "tokens": 0},
                           ui=live.address if live.alive else None)
        dry_run = bool(r.dry_run) if r is not None else bool(new_cfg.get("dry_run"))
        if dagster_run.status.value == "CANCELED" and r is not None and r.status in ("stopping", "stopped"):
            return stopped_elsewhere(as_json, instance, run_id, r, results, tenant, job != TENANT_JOB, noted, source)
        ok = dagster_run.status.value == "SUCCESS"
        why = "" if ok or any(p.status == "failed" for p in results) else run_failure_message(instance, run_id)
        joined = (" (taken over: its worker was gone)" if taken_over else
                  " (joined: another launch had started it)" if dagster_run.tags.get(tags.JOINED) == "true" else "")
        verdict = (f"{r.name} {r.status}{' (a dry run)' if dry_run else ''}{joined}" if r is not None
                   else f"Dagster run {dagster_run.status.value}")
        again = again_line(tenant, r.status if r is not None else None, sync=job != TENANT_JOB)
        now_lines = what_now(tenant, verdict, bad, live.address if live.alive else None, left_out_line(left), again,
                             dry_run=dry_run, changed=changed, remedies=remedy)
        # "message": the verdict line the plain command ends with ("tenant 'acme': run #5 (...) succeeded,
        # 0 row(s) skipped, 0 failed"); "failure": why the Dagster run failed, when no phase says it
        payload = {"dagster_run_id": run_id, "dagster_status": dagster_run.status.value,
                   "message": now_lines[0].removeprefix("what now: "), "failure": why,
                   "dry_run": dry_run, "left_out": left,
                   "phases": [{"asset": p.asset, "status": p.status, "message": p.message,
                               "metadata": {k: v for k, v in p.metadata.items() if not hasattr(v, "records")}}
                              for p in results],
                   "engine": rollup_doc(r) if r else None,
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
            for line in now_lines if ends_with_what_now else ():
                console.print(line, highlight=False, markup=False)  # plain text: `kinds: [a, b]` is no markup tag

        code = emit_outcome(as_json, payload, render, f"Dagster run {run_id}: {dagster_run.status.value}", ok)
        if not ok:  # why, on stderr as well: stdout may be piped away or be one --json document
            failed = why or next((f"{p.asset} failed: {p.message}" for p in results if p.status == "failed"), "")
            click.echo(f"Dagster run {run_id} {dagster_run.status.value}"
                       + (f": {failed.splitlines()[0]}" if failed else ""), err=True)
        return code
    except (LaunchError, TimeoutError) as e:
        fail(e)
        return 2
    finally:
        progress.close()
        instance.dispose()



def emit_outcome(as_json: bool, payload: Any, render: Any, verdict: str, ok: bool) -> int:
    """Print a finished launch's results (`emit`); the exit code (0 when `ok`). The run has ended
    and our daemon is stopped by then, so a Ctrl-C (or SIGTERM/SIGHUP) while the tables print only
    cuts the tables short: the `verdict` line ("Dagster run R: SUCCESS") is printed and the code is
    the run's, not click's "Aborted!" with 1 after a run that succeeded ."""
    try:
        with signals_interrupt():
            emit(as_json, payload, render)
    except KeyboardInterrupt:
        with signals_held():
            click.echo(f"\n{verdict} (the results were cut short: `migrate status` shows them)", err=as_json)
    return 0 if ok else 1


def exit_launched(code: int) -> None:
    """End a command that launched through Dagster with `code`. As the `migrate` program itself,
    once its output is flushed, without the interpreter's teardown (`os._exit`): a process that
    imported Dagster and ran its instance took 0.6-0.9 s to tear down after its last line, every
    `migrate run`; nothing is left to clean up by then (the daemon is stopped, pools and
    the instance closed, no atexit handler of ours). Called in-process (click's test runner, a
    script calling `main`), it is `sys.exit(code)`."""
    if Path(sys.argv[0]).name != "migrate":
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
    finally:
        preload.exit_now(code)  # os._exit, the code told first to a pre-loaded launcher's client


def new_config(options: dict) -> dict:
    """The tenant job's run config for a new run with provider `options` (`new_run_config`)."""
    return new_run_config(options=options)
