"""`run`, `sync` and `verify`: a tenant migrated, its changes brought over, proved from the source."""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from engine_core import db as dbmod
from engine_core import runs
from engine_core.config import Settings
from engine_core.errors import EngineError
from engine_core.providers.registry import provider_for
from engine_core.verify import verify
from migration_pipeline.cli.tenants import tenant_run
from migration_pipeline.cli.launching import (before_launch, collector_paused, exit_launched, launch_through_dagster,
                                              new_config, source_for)
from migration_pipeline.cli.options import KINDS_HELP, SECONDS, kinds_choice, typed_options
from migration_pipeline.cli.output import emit, fail, open_db, retries_summarised
from migration_pipeline.cli.progress import VerifyDisplay
from migration_pipeline.cli.tables import print_verify
from migration_pipeline.launch.checks import check_tenant, new_run_config


@click.command("run")
@click.option("--tenant", required=True)
@click.option("--source", default=None, help="default: MIGRATE_SOURCE, else pipedrive (example if it is unavailable)")
@click.option("--kinds", default=None, help=KINDS_HELP)
@click.option("--dry-run", is_flag=True)
@click.option("--options", "options_json", default=None, help="provider options as JSON (a new run only)")
@click.option("--timeout", default=None, type=SECONDS, help="give up waiting after this many seconds")
@click.option("--new-run", is_flag=True, help="migrate the kinds asked for again, from scratch, though succeeded runs took them")
@click.option("--json", "as_json", is_flag=True)
def run_cmd(tenant: str, source: str | None, kinds: str | None, dry_run: bool, options_json: str | None,
            timeout: float | None, new_run: bool, as_json: bool) -> None:
    """Launch TENANT's partition through Dagster (the instance the UI shows) and wait for it.

    Starts the tenant's run, joins it, or - if its last run failed or was stopped - retries or
    resumes it, exactly as materialising the partition in the UI does. Kinds a succeeded run of
    the tenant took are not migrated again: a new run takes the kinds asked for that none took (said
    in one line), and with none left the launch is refused in one line, pointing to `migrate sync`
    and `--new-run` (every kind asked for again, from scratch). Exit 0 succeeded, 1 failed, 2 refused (or --timeout), 3
    stopped from elsewhere (`migrate stop`, the UI's Terminate), 130 stopped by Ctrl-C."""
    with before_launch():
        check_tenant(tenant)
        try:
            options = json.loads(options_json) if options_json else {}
        except ValueError as e:
            fail(f"--options must be a JSON object: {e}")
        if not isinstance(options, dict):
            fail(f"--options must be a JSON object, got {options_json!r}")
        options = typed_options(options)
        wanted = kinds_choice(kinds)
        config = new_run_config(wanted, dry_run, options)
        with collector_paused():  # without a source named, the Dagster definitions are loaded (see collector_paused)
            src = source_for(source)
    exit_launched(launch_through_dagster(tenant, src, config, as_json, timeout=timeout, new_run=new_run))


def run_verify(db: dbmod.Database, tenant: str, source: str | None, kinds: list[str] | None = None,
               provider: Any = None, progress: Any = None) -> Any:
    """engine_core.verify for the tenant's latest run's source, telling `progress` (a
    `VerifyDisplay`, or None) as it reads; errors are one line (exit 2)."""
    run = tenant_run(db, tenant, source)
    provider = provider or provider_for(run.source, run)
    try:
        return verify(db, provider, tenant, Settings.from_env(), kinds=kinds, progress=progress)
    except EngineError:
        raise
    except Exception as e:  # the source's own errors (auth, budget): one line, never a traceback
        fail(f"verify {tenant!r}: the {run.source} source failed: {type(e).__name__}: {e}")


@click.command("verify")
@click.argument("tenant")
@click.option("--source", default=None, help="default: the source of TENANT's latest run")
@click.option("--kinds", default=None, help="comma-separated kinds to prove (default: every kind of the plan)")
@click.option("--json", "as_json", is_flag=True, help="every difference's ids, uncapped")
def verify_cmd(tenant: str, source: str | None, kinds: str | None, as_json: bool) -> None:
    """Prove TENANT from the source: list the source's ids per kind (cheapest listing), compare
    them with the ledger and the product's rows, name every difference (missing, extra, duplicated,
    stale version) and the requests and tokens it cost. Exit 1 on differences, 2 on errors."""
    wanted = [k.strip() for k in kinds.split(",") if k.strip()] if kinds else None
    display = VerifyDisplay(tenant, as_json)
    try:
        with open_db(create=False) as db, retries_summarised() as retried:
            result = run_verify(db, tenant, source, wanted, progress=display)
    finally:
        display.close()
    if retried.line():  # one line, not one per retry; stderr: --json stays one document
        click.echo(retried.line(), err=True)
    if not any(k.checked for k in result.kinds) and not result.left_out:  # a source without id listings
        fail(f"the {result.source} source cannot list its ids ({result.kinds[0].note if result.kinds else 'no kinds'}); "
              "nothing to verify")
    emit(as_json, result.as_dict(), lambda: print_verify(result))
    sys.exit(0 if result.passed else 1)


def check_sync(db: dbmod.Database, tenant: str, source: str) -> None:
    """What would fail a sync, before anything is launched: an unknown tenant, or no succeeded
    (non-dry) run to sync from. One line, exit 2."""
    tenant_run(db, tenant, source)  # an unknown tenant, or none of `source`: one line
    if runs.last_snapshot(db, tenant, source) is None:
        fail(f"tenant {tenant!r} has no succeeded {source} run to sync from; migrate it first "
              f"(migrate run --tenant {tenant})")


@click.command("sync")
@click.argument("tenant")
@click.option("--source", default=None, help="default: MIGRATE_SOURCE, else pipedrive")
@click.option("--timeout", default=None, type=SECONDS, help="give up waiting after this many seconds")
@click.option("--json", "as_json", is_flag=True)
def sync_cmd(tenant: str, source: str | None, timeout: float | None, as_json: bool) -> None:
    """Bring TENANT's changes since its last succeeded run or sync: launches the tenant's partition
    of the sync job through Dagster (as `migrate run` launches the migration) and waits. Same
    phases, claims, windows, budget and stop/retry/resume; only what changed is listed."""
    with before_launch():
        check_tenant(tenant, "TENANT")
        with collector_paused():  # Dagster's imports (see collector_paused); only a launch needs them
            from migration_pipeline.jobs import SYNC_JOB

            src = source_for(source)
        with open_db(create=False) as db:  # a sync follows a run: an empty database cannot hold one
            check_sync(db, tenant, src)
    exit_launched(launch_through_dagster(tenant, src, new_config({}), as_json, timeout=timeout, job=SYNC_JOB))
