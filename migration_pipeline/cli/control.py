"""`stop`, `retry` and `resume` of a tenant's engine run, and the Dagster runs a killed `migrate run`
left in progress ended on the way."""
from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.config import Settings
from engine_core.errors import EngineError
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline.cli.output import MIGRATE_STOP, console, emit, fail, open_db
from migration_pipeline.cli.tenants import tenant_run
from migration_pipeline.cli.progress import Progress
from migration_pipeline.cli.tables import print_rollup, rollup_doc
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, dagster_home, open_instance


@click.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--force", is_flag=True, help="wait until the run settles: a dead worker's task is cancelled once "
                                            "its lock is MIGRATE_STALE_LOCK_SECONDS old")
@click.option("--json", "as_json", is_flag=True)
def stop(tenant: str, source: str | None, force: bool, as_json: bool) -> None:
    """Stop TENANT's live run: no new claims; running tasks keep their checkpoints. A succeeded or
    stopped run has nothing to stop: one line says so, with its state.

    The run is `stopping` until its running tasks reach a stop point. A task whose worker died
    (kill -9) never does: its lock goes stale MIGRATE_STALE_LOCK_SECONDS (120 s) after the last
    renewal, and `stop` cancels it then. `--force` waits for that (at most twice the threshold plus
    30 s), so the run ends `stopped`; without it a still-stopping run says what it waits for."""
    settings = Settings.from_env()
    with open_db(create=False) as db:
        latest = tenant_run(db, tenant, source)
        if latest.status in ("succeeded", "stopped"):
            emit(as_json, {"run_id": latest.id, "status": latest.status, "running_tasks": 0, "nothing_to": "stop"},
                  lambda: console.print(f"{latest.name} {latest.status}: nothing to stop"))
            return
        run_id = latest.id
        if latest.status == "running":  # `migrate status` names who stopped it, as it names a Dagster terminate
            runs.note_stop(db, run_id, MIGRATE_STOP)  # (a stopping run's stop was someone else's)
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

        emit(as_json, {"run_id": run.id, "status": run.status, "running_tasks": len(held)},
              lambda: console.print(f"{run.name}: {run.status}{note}"))


def end_runs_of_dead_processes(instance: Any, as_json: bool) -> list[str]:
    """End the Dagster runs whose in-process executor (a `migrate run`) is known to be gone
    (`launcher.fail_runs_of_dead_processes`: FAILURE, or CANCELED when CANCELING, with the reason),
    saying so in one line (stderr under --json). Best effort: a Dagster storage that cannot be read
    is not this command's failure. Returns their run ids.

    `migrate run` does it before it counts the lane; `stop --force`, `resume` and `retry` do it too:
    after a `kill -9` of `migrate run` then those, the run stayed STARTED in the UI until the next
    `migrate run`."""
    from migration_pipeline.launcher import fail_runs_of_dead_processes  # Dagster: only `stop --force`, retry, resume

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
    # Dagster's instance (~2 s of imports): not on `stop`'s path
    from migration_pipeline.lane.fair import dagster_managed
    from migration_pipeline.launch.daemon import daemon_liveness, lock_path

    env = dagster_env(env=dict(os.environ))
    instance = open_instance(env)
    try:
        end_runs_of_dead_processes(instance, as_json)
        live = daemon_liveness(instance, lock_path(Path(env["DAGSTER_HOME"]), env[STORAGE_URL_ENV]))
        managed = dagster_managed(instance, run.id)
    finally:
        instance.dispose()
    if live.alive and managed:
        return
    why = live.why if not live.alive else f"{run.name} was not launched through Dagster, so no drainer joins it"
    hint = (f"`migrate run --tenant {run.tenant_id}` ({'retries' if action == 'retry' else action + 's'} it through Dagster, with a daemon for the duration) "
            f"or `migrate {action} {run.tenant_id} --drain` (works on it here)") if managed else \
        f"`migrate {action} {run.tenant_id} --drain` (works on it here)"
    fail(f"{run.name}: nothing would work on it after the {action} ({why}); use {hint}")


def _reopen(action: str, tenant: str, source: str | None, as_json: bool, drain: bool) -> None:
    with open_db(create=False) as db:
        run = tenant_run(db, tenant, source)
        if run.status == "succeeded":  # before the daemon check: a succeeded run needs no daemon
            emit(as_json, {"run_id": run.id, "status": run.status, "nothing_to": action},
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
            fail(e)
        emit(as_json, {"run_id": run.id, "status": run.status, "phase": run.current_phase},
              lambda: console.print(f"{run.name}: {action} -> {run.status}, phase {run.current_phase + 1}"))
        if drain:
            drain_and_report(db, run.id, as_json)


@click.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--drain/--no-drain", default=False, help="also run the tasks here until the run ends")
@click.option("--json", "as_json", is_flag=True)
def retry(tenant: str, source: str | None, drain: bool, as_json: bool) -> None:
    """Re-arm failed tasks and rewind the barrier to the earliest of them."""
    _reopen("retry", tenant, source, as_json, drain)


@click.command()
@click.argument("tenant")
@click.option("--source", default=None)
@click.option("--drain/--no-drain", default=False, help="also run the tasks here until the run ends")
@click.option("--json", "as_json", is_flag=True)
def resume(tenant: str, source: str | None, drain: bool, as_json: bool) -> None:
    """Re-arm a stopped run's cancelled tasks; they resume from their checkpoints."""
    _reopen("resume", tenant, source, as_json, drain)


class _Drained:
    """What `Progress` reads of a Dagster run (its tags, id and status), for an engine run drained
    in this process with no Dagster run: the engine run's id, no observations to read."""

    def __init__(self, run_id: int) -> None:
        self.tags = {"migration/run_id": str(run_id)}
        self.run_id = ""
        self.status = SimpleNamespace(value="STARTED")


def materialize_drained(db: dbmod.Database, run_id: int) -> int:
    """Report the phase assets a drain in this shell closed to Dagster (runless materialisations of
    `jobs.phases_to_materialize`: the metadata a phase op gives), so the UI shows the tenant's phases
    materialised, not "Missing" behind the run a stop canceled. The count reported; 0 when Dagster
    was never used here (no dagster.yaml in DAGSTER_HOME) or its instance cannot be opened: the
    drain's result stands either way (the checks are not evaluated: `migrate verify` or the
    verify_tenant job prove the tenant)."""
    if not (dagster_home() / "dagster.yaml").exists():
        return 0
    from migration_pipeline.jobs import phases_to_materialize  # Dagster's definitions (~2 s): only after a drain

    try:
        instance = open_instance(dagster_env(env=dict(os.environ)))
    except Exception:  # noqa: BLE001 - as above
        return 0
    reported = 0
    try:
        run = runs.get_run(db, run_id)
        for _, _, materialization in phases_to_materialize(instance, db, run, run.source, "a drain in migrate's shell"):
            instance.report_runless_asset_event(materialization)
            reported += 1
        done_after_cancel(instance, db, run)
    except Exception as e:  # noqa: BLE001 - the UI's picture only; said, not raised
        click.echo(f"note: the phases could not be shown materialised in Dagster ({type(e).__name__}: {e})", err=True)
    finally:
        instance.dispose()
    return reported


FINISHED_BY_DRAIN = "migration/finished_by_drain"  # on a launch a stop canceled and a drain finished


def done_after_cancel(instance: Any, db: dbmod.Database, run: Any) -> list[str]:
    """When engine run `run` succeeded with every row accounted for (`RunRollup.complete`), tag the
    Dagster runs of it that ended CANCELED (a stop) with FINISHED_BY_DRAIN, so the UI's runs list
    says the tenant is done beside the status Dagster keeps for good, and say so on stderr. The
    Dagster run ids tagged (none when the run is not done, or has no canceled launch)."""
    from dagster import DagsterRunStatus, RunsFilter  # already loaded by the caller's instance

    r = rollups.rollup(db, run.id)
    if r.status != "succeeded" or not r.complete:
        return []
    canceled = instance.get_runs(filters=RunsFilter(tags={"migration/run_id": str(run.id)},
                                                    statuses=[DagsterRunStatus.CANCELED]))
    said = f"succeeded: every row accounted for ({run.name}, finished by a drain after the stop)"
    for launch in canceled:
        instance.add_run_tags(launch.run_id, {FINISHED_BY_DRAIN: said})
    if canceled:
        click.echo(f"{run.tenant_id} is done, {said}; Dagster keeps its launch "
                   f"{', '.join(c.run_id[:8] for c in canceled)} as Canceled (tagged {FINISHED_BY_DRAIN})", err=True)
    return [c.run_id for c in canceled]


def drain_and_report(db: dbmod.Database, run_id: int, as_json: bool) -> int:
    """Drain run `run_id` in this process on the lane's width of threads until it ends, showing its
    progress as `migrate run` does (`Progress`: a line per change of phase or counts, every
    `Progress.EVERY` seconds at most while they move, or a bar per phase on a terminal; a drain of
    minutes was silent), then print its rollup (or its JSON); the exit code: 0 when it succeeded, else 1."""
    settings = Settings.from_env()
    progress, drained, done = Progress(as_json), _Drained(run_id), threading.Event()

    def show() -> None:
        while not done.wait(1.0):
            try:
                progress(drained)
            except Exception:  # noqa: BLE001 - progress is best effort; the drain's result is what counts
                return

    with contextlib.suppress(Exception):
        progress(drained)  # where it resumes: later looks say every phase closed since
    shower = threading.Thread(target=show, name="drain-progress", daemon=True)
    shower.start()
    try:
        drain_threads(db, run_id, width=settings.lane_width, settings=settings, providers=for_run)
    finally:
        done.set()
        shower.join(timeout=5)
        with contextlib.suppress(Exception):
            progress(drained)  # the phases closed since the last look
        progress.close()
    materialize_drained(db, run_id)
    r = rollups.rollup(db, run_id)
    emit(as_json, rollup_doc(r), lambda: print_rollup(r))
    return 0 if r.status == "succeeded" else 1
