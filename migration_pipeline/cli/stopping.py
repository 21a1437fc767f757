"""How a launching command (`migrate run`, `sync`, `demo`) ends when its run is stopped: by its own
signal (`stop_what_we_started`) or from elsewhere (`stopped_elsewhere`), one `stopped_line` on
stderr naming who stopped it, and under --json the stopped run's document on stdout
(`stopped_doc`)."""
from __future__ import annotations

import signal
import sys
from typing import Any

import click

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.errors import EngineError
from migration_pipeline import tags
from migration_pipeline.cli.output import (again_line, emit, open_db, reader_gone, stopped_by, stopped_exit_code,
                                          stopped_line)
from migration_pipeline.cli.tables import rollup_doc


def asset_order(source: str) -> list[str]:
    """The source's phase assets' keys ("pipedrive/phase_1_users"), in plan order."""
    from migration_pipeline.assets.specs import phase_specs  # Dagster: a launch's results only

    return [spec.key.to_user_string() for spec in phase_specs(source)]


def stop_what_we_started(instance: Any, keeper: Any, run_id: str | None, tenant: str, signalled: Any,
                         source: str | None = None, sync: bool = False, as_json: bool = False) -> None:
    """A `migrate run` / `sync` / `demo` stopped by SIGINT, SIGTERM or SIGHUP stops what it started
    (what a user stopping a foreground command expects; nothing is lost: the engine run keeps its
    checkpoints and `migrate run --tenant T` resumes it): the Dagster run it launched is cancelled
    from the queue or terminated, with its engine run's stop flag set (`launch.stop_launched_run`),
    then the daemon it started for the duration is stopped (a daemon it did not start - the UI's -
    is left alone). A run still in progress when our daemon (its run worker's parent) is gone is
    marked CANCELED. Lines go to stderr, also under --json; a stopped engine run ends with the one
    `stopped_line` a stop from elsewhere ends with too (`sync`: resumed by `migrate sync`). Under
    --json, stdout gets the document a finished launch gives (`stopped_doc`), its `message` the
    last line said."""
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        try:
            click.echo(line, err=True)
        except BrokenPipeError:  # stderr's reader has gone (`2>&1 | head`): the stop goes on unsaid
            reader_gone(sys.stderr)

    try:
        _stop_and_say(instance, keeper, run_id, tenant, signalled, source, sync, say)
    finally:
        if as_json:
            emit(True, stopped_doc(instance, run_id, source, stopped_by(signalled.signo), said[-1] if said else ""),
                 lambda: None)


def stopped_doc(instance: Any, run_id: str | None, source: str | None, by: str, message: str,
                r: Any = None) -> dict[str, Any]:
    """A stopped launch's --json document, the shape of a finished one's: the Dagster run's status,
    `message` the stop line, `stopped_by` who stopped it, the phases' results and the engine run's
    rollup (`r`, else read here; its `status` "stopping" or "stopped"), or null when there is none."""
    from migration_pipeline.launch.results import phase_results

    run = instance.get_run_by_id(run_id) if run_id else None
    engine = run.tags.get(tags.ENGINE_RUN, "") if run is not None else ""
    if r is None and engine.isdigit():
        with dbmod.connect(max_size=1, apply=False) as db:
            r = rollups.rollup(db, int(engine))
    results = phase_results(instance, run_id, asset_order(source)) if run is not None and source else []
    return {"dagster_run_id": run_id, "dagster_status": run.status.value if run is not None else None,
            "message": message, "failure": "", "stopped_by": by, "dry_run": bool(r.dry_run) if r else False,
            "phases": [{"asset": p.asset, "status": p.status, "message": p.message} for p in results],
            "engine": rollup_doc(r) if r else None}


def _stop_and_say(instance: Any, keeper: Any, run_id: str | None, tenant: str, signalled: Any, source: str | None,
                  sync: bool, say: Any) -> None:
    """`stop_what_we_started`'s stop, its lines said with `say`."""
    # Dagster (~2 s of imports): only a launch needs it
    from migration_pipeline.launch.statuses import FINISHED
    from migration_pipeline.launch.stop import mark_canceled, stop_launched_run

    name = signal_name(signalled.signo)
    if not getattr(signalled, "announced", False):  # an in-process run's watcher said it when it stopped the run
        say(f"{name}: stopping what this command started")
    if run_id and instance.get_run_by_id(run_id) is None:
        run_id = None  # interrupted before submit_tenant_run created it
    status = stop_launched_run(instance, run_id, say) if run_id else None
    ours = keeper.proc is not None
    if run_id and ours:
        # before our daemon (its run worker's parent) goes: a run still starting then ends CANCELED
        # (its worker, if it starts at all, finds it cancelled and executes nothing) rather than
        # FAILURE when the worker dies with the daemon
        mark_canceled(instance, run_id, f"`migrate run` got {name}; the daemon it started is stopped")
    keeper.close(30.0)
    if run_id and ours:
        status = instance.get_run_by_id(run_id).status
    if run_id:
        run = instance.get_run_by_id(run_id)
        engine = run.tags.get("migration/run_id") if run is not None else None
        if not engine and run is not None and run.status not in FINISHED:
            # stopped before its op attached an engine run: nothing of it is worth keeping, and
            # left STARTED or queued it would hold the tenant's partition in the UI for ever
            mark_canceled(instance, run_id, f"`migrate run` got {name} before the run reached its engine "
                                                   "run; nothing was migrated")
            run = instance.get_run_by_id(run_id)
            status = run.status if run is not None else status
        dagster = f"Dagster run {run_id}: {status.value if status else 'gone'}{', our daemon stopped' if ours else ''}"
        with open_db() as db:
            er = runs.get_run(db, int(engine)) if engine else None
            if er is not None and er.status in ("stopping", "stopped"):
                say(stopped_line(er.name, er.status, stopped_by(signalled.signo), tenant, dagster, sync))
                return
            if er is not None:  # it ended on its own before the stop reached it
                again = again_line(tenant, er.status, sync)
                after = f"; {er.name} is {er.status}" + (f"; `{again[0]}` {again[1]}" if again else "")
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
    """"SIGINT" for 2: the signal's name, as the stop lines say it."""
    return signal.Signals(signo).name

def stopped_elsewhere(as_json: bool, instance: Any, run_id: str, r: Any, results: list[Any], tenant: str, sync: bool,
                       noted: str | None, source: str) -> int:
    """The end of a launch whose run a stop from outside this command ended (`migrate stop`, the UI's
    Terminate, the engine's pause): as a Ctrl-C's, one `stopped_line` on stderr (not the tables, the
    "what now" and the phase step's own Dagster-worded message, which had printed it twice and
    called the stop "failed"); under --json, stdout's document first (`stopped_doc`). Who stopped
    it: `noted`, the engine run's stop note since this launch, else the steps' messages. Exit code
    (`stopped_exit_code`) STOPPED_ELSEWHERE for an operator's stop, SOURCE_FAILED for the engine's
    pause of a failing source: not 1, which says the run failed."""
    by = stopped_by(step_messages=tuple(p.message for p in results if p.status == "failed"), noted=noted)
    line = stopped_line(r.name, r.status, by, tenant, f"Dagster run {run_id}: CANCELED", sync)
    emit(as_json, stopped_doc(instance, run_id, source, by, line, r), lambda: None)
    click.echo(line, err=True)
    return stopped_exit_code(by)
