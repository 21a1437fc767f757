"""What Dagster costs: a small sandbox account migrated through `migrate run` (the CLI launching the
tenant job through Dagster and waiting for it) against the engine driven directly (runs.start_run
+ drain_threads in this process), from one run, interleaved, medians.

    python bench/dagster_overhead.py [--scale small] [--reps 3] [--kinds ...] [--no-daemon-path] [--launch-threads N]

Both variants migrate a new tenant of the same sandbox account (no latency, no rate limit; the run
option burst_limit lifts the engine's own budget too) into a fresh database of their own with the
engine's schema, with the same Settings (the MIGRATE_* defaults). `migrate run` runs as a user runs
it: a subprocess of the venv's `migrate` with no UI alive, so it executes the Dagster run in its own
process (issue 11; migration_pipeline/launch/); one MIGRATE_HOME (DAGSTER_HOME inside) and one
Dagster storage database serve every round (a warm-up run, not timed, creates Dagster's tables
first: a user pays that once). Its wall time is split with the Dagster run's own timestamps:

* launch:  the command's start to the run's creation (CLI start and imports, checks, the run built
           in the command's own process)
* queue:   creation to RUN_STARTING (in-process: the lane counted under its lock; daemon path: the
           daemon's start - begun just before the launch - and its dequeue)
* worker:  RUN_STARTING to the first STEP_START (in-process: the job reconstructed and the run's
           context set up in the command; daemon path: the run worker's process and code loading)
* steps:   first STEP_START to the run's end (the phase ops: the engine's work, plus Dagster's
           events and the checks)
* tail:    the run's end to the command's exit (the results; on the daemon path also its 0.25 s
           polling and stopping the daemon: killed once it has logged that its threads stopped,
           its interpreter's teardown not waited for, nor the command's own: `os._exit`)

The steps are split further, summed over the phases, with the engine's own task times (its
migration_tasks rows) against the steps' events (`step_split`):

* head:    a phase op's STEP_START to its phase's first task start (attach, the lane, threads)
* engine:  the phase's first task start to its last task finish (the engine's work, in the op)
* close:   the last task finish to the op's ASSET_MATERIALIZATION (the phase seen closed, the
           threads stopped, the rollup and metadata, the materialisation's events)
* checks:  the materialisation to the op's STEP_SUCCESS: its three ledger checks, evaluated in the
           phase's own op since issue 11 (a step of their own before)
* between: from one phase op's STEP_SUCCESS to the next one's STEP_START

`migrate run` runs with the default MIGRATE_LAUNCH_THREADS (the lane width: the phase ops drain
with up to their fair share of the lane in their own process, `LaunchLanes`). A third variant,
"migrate run, daemon path" (unless --no-daemon-path), runs it with MIGRATE_RUN_IN_PROCESS=0: the
path taken before issue 11's in-process runs (a daemon started for the duration of the command, its
code server, a run worker), and still taken when a daemon is alive or the lane is full.
`--launch-threads N` adds one with MIGRATE_LAUNCH_THREADS=N (1: one thread per launch plus drainer
runs, the lane as it was before it counted threads).

Target (issue 11): `migrate run` <= 1.5x the engine driven directly on a small account.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TOKEN, Databases, Sandbox, Timer, interleave, median, print_ratios, ratio, sandbox, server_facts, with_dbname  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive.provider import PipedriveProvider  # noqa: E402
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402
from engine_core.providers.registry import for_run

MIGRATE = str(Path(sys.executable).parent / "migrate")
OPTIONS = {"burst_limit": 1_000_000}
PARTS = ("launch", "queue", "worker", "steps", "tail")
STEP_PARTS = ("head", "engine", "close", "checks", "between")
THREADED = "migrate run, other launch threads"
DAEMON_PATH = "migrate run, daemon path"
LAUNCH_THREADS_ENV = "MIGRATE_LAUNCH_THREADS"  # migration_pipeline.lane.threads.LAUNCH_THREADS_ENV
IN_PROCESS_ENV = "MIGRATE_RUN_IN_PROCESS"  # migration_pipeline.launch.in_process.IN_PROCESS_ENV


def engine_once(url: str, sb: Sandbox, kinds: list[str] | None) -> tuple[float, str]:
    """The engine driven directly: start the tenant's run and drain it with the lane's threads."""
    settings = Settings.from_env({})
    db = dbmod.Database(url, max_size=settings.lane_width * 3 + 6)
    try:
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        t = Timer()
        run = runs.start_run(db, PipedriveProvider(base_url=sb.base_url, token=TOKEN), tenant, kinds=kinds, options=OPTIONS,
                             settings=settings)
        drain_threads(db, run.id, width=settings.lane_width, settings=settings, providers=for_run)
        return t.seconds, runs.get_run(db, run.id).status
    finally:
        db.close()


def cli_env(url: str, storage_url: str, home: Path, sb: Sandbox, **extra: str) -> dict[str, str]:
    """The environment of a user's `migrate run`: only what it needs, nothing of this shell's -
    PYTHONDONTWRITEBYTECODE included: a user's command reads its modules' bytecode cache, where
    with it set every run compiled the project's ~120 modules from source again (~0.2 s)."""
    from migration_pipeline.instance import STORAGE_URL_ENV, to_url

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k not in ("DATABASE_URL", "PYTHONDONTWRITEBYTECODE")}
    env.update(DATABASE_URL=to_url(url), MIGRATE_HOME=str(home), MIGRATE_SOURCE="pipedrive",
               PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN, **{STORAGE_URL_ENV: storage_url}, **extra)
    return env


def migrate_run_once(env: dict[str, str], kinds: list[str] | None) -> tuple[float, dict[str, Any]]:
    """`migrate run --json` for a new tenant; (wall seconds, its JSON output)."""
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    argv = [MIGRATE, "run", "--tenant", tenant, "--json", "--options", json.dumps(OPTIONS), "--timeout", "900"]
    if kinds:
        argv += ["--kinds", ",".join(kinds)]
    started = time.time()
    t = Timer()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    seconds = t.seconds
    try:
        payload = json.loads(out.stdout)
    except ValueError:
        payload = {"dagster_status": f"exit {out.returncode}", "stderr": out.stderr[-2000:], "stdout": out.stdout[-2000:]}
    payload["_started"], payload["_ended"] = started, started + seconds
    return seconds, payload


def breakdown(env: dict[str, str], payload: dict[str, Any]) -> dict[str, float]:
    """Where a `migrate run`'s wall time went, from the Dagster run's record and events."""
    from dagster import DagsterEventType, DagsterInstance

    os.environ["DAGSTER_HOME"] = str(Path(env["MIGRATE_HOME"]) / "dagster")
    os.environ["MIGRATE_DAGSTER_STORAGE_URL"] = env["MIGRATE_DAGSTER_STORAGE_URL"]
    instance = DagsterInstance.from_config(os.environ["DAGSTER_HOME"])
    try:
        run_id = payload["dagster_run_id"]
        record = instance.get_run_record_by_id(run_id)
        records = instance.get_records_for_run(run_id, of_type={DagsterEventType.RUN_STARTING,
                                                                DagsterEventType.STEP_START}).records
        starting = min((r.event_log_entry.timestamp for r in records
                        if r.event_log_entry.dagster_event_type == DagsterEventType.RUN_STARTING), default=None)
        first_step = min((r.event_log_entry.timestamp for r in records
                          if r.event_log_entry.dagster_event_type == DagsterEventType.STEP_START), default=None)
        created, ended = record.create_timestamp.timestamp(), record.end_time
        if starting is None or first_step is None or ended is None:
            return {}
        return {"launch": created - payload["_started"], "queue": starting - created, "worker": first_step - starting,
                "steps": ended - first_step, "tail": payload["_ended"] - ended}
    finally:
        instance.dispose()


def step_split(env: dict[str, str], payload: dict[str, Any], engine_url: str) -> dict[str, float]:
    """The steps of a `migrate run` split per phase (see the module docstring), summed over the
    phases: the phase ops' events against the engine's task times (seconds)."""
    import psycopg
    from dagster import DagsterInstance

    os.environ["DAGSTER_HOME"] = str(Path(env["MIGRATE_HOME"]) / "dagster")
    os.environ["MIGRATE_DAGSTER_STORAGE_URL"] = env["MIGRATE_DAGSTER_STORAGE_URL"]
    instance = DagsterInstance.from_config(os.environ["DAGSTER_HOME"])
    try:
        steps: dict[str, dict[str, float]] = {}
        for r in instance.all_logs(payload["dagster_run_id"]):
            if r.dagster_event_type is not None and r.step_key:
                steps.setdefault(r.step_key, {}).setdefault(r.dagster_event_type.value, r.timestamp)
    finally:
        instance.dispose()
    with psycopg.connect(engine_url) as c:
        spans = {phase: (float(first), float(last)) for phase, first, last in c.execute(
            "SELECT phase, extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at))"
            " FROM migration_tasks GROUP BY phase").fetchall() if first is not None and last is not None}
    ops = sorted((k for k in steps if "STEP_START" in steps[k]), key=lambda k: steps[k]["STEP_START"])
    if len(ops) != len(spans):  # a run limited to some kinds: its steps are not its plan's phases
        return {}
    out = {p: 0.0 for p in STEP_PARTS}
    previous_end = None
    for phase, key in enumerate(ops):
        op = steps[key]
        if phase not in spans or "STEP_SUCCESS" not in op:
            return {}
        first, last = spans[phase]
        materialized = op.get("ASSET_MATERIALIZATION", op["STEP_SUCCESS"])
        out["head"] += first - op["STEP_START"]
        out["engine"] += last - first
        out["close"] += materialized - last
        out["checks"] += op["STEP_SUCCESS"] - materialized
        if previous_end is not None:
            out["between"] += op["STEP_START"] - previous_end
        previous_end = op["STEP_SUCCESS"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kinds", default=None, help="comma list of kinds (default: the whole plan)")
    parser.add_argument("--no-daemon-path", dest="daemon_path", action="store_false",
                        help=f"leave out the variant with {IN_PROCESS_ENV}=0 (a daemon for the duration, a run worker)")
    parser.add_argument("--launch-threads", type=int, default=0,
                        help=f"a further variant: migrate run with {LAUNCH_THREADS_ENV}=N (0: no such variant)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()] if args.kinds else None
    from migration_pipeline.instance import to_url

    dbs = Databases("dagster_overhead")
    storage_db = f"{dbs.prefix}_dagster"
    import psycopg

    with psycopg.connect(dbs.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{storage_db}"')
    storage_url = to_url(with_dbname(dbs.server, storage_db), scheme="postgresql+psycopg2")
    problems: list[str] = []
    variants = (["engine direct", "migrate run"] + ([DAEMON_PATH] if args.daemon_path else [])
                + ([THREADED] if args.launch_threads > 0 else []))
    parts: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PARTS + STEP_PARTS} for v in variants[1:]}
    home = Path(tempfile.mkdtemp(prefix="bench-dagster-home-"))
    try:
        with sandbox(args.scale, latency="none", burst_limit=1_000_000) as sb:
            os.environ[ENV_BASE_URL] = sb.base_url  # the engine-direct workers' provider reads them
            os.environ[ENV_TOKEN] = TOKEN
            truth = sb.truth()["ids"]
            rows = sum(len(v) for k, v in truth.items() if not kinds or k in kinds)
            print(f"dagster overhead: {args.scale} sandbox, {rows} rows, kinds {','.join(kinds) if kinds else 'all'}; "
                  f"{server_facts(dbs.server)}", flush=True)
            t = Timer()
            seconds, payload = migrate_run_once(cli_env(dbs.new(), storage_url, home, sb), ["users"])
            print(f"warm-up (Dagster's tables, kinds users): {payload.get('dagster_status')} in {t.seconds:.1f} s", flush=True)
            if payload.get("dagster_status") != "SUCCESS":
                problems.append(f"warm-up: {payload}")

            def one(variant: str, r: int) -> float:
                url = dbs.new()
                if variant == "engine direct":
                    seconds, status = engine_once(url, sb, kinds)
                    if status != "succeeded":
                        problems.append(f"engine run {status}")
                    return seconds
                extra = ({LAUNCH_THREADS_ENV: str(args.launch_threads)} if variant == THREADED else
                         {IN_PROCESS_ENV: "0"} if variant == DAEMON_PATH else {})
                env = cli_env(url, storage_url, home, sb, **extra)
                seconds, payload = migrate_run_once(env, kinds)
                if payload.get("dagster_status") != "SUCCESS" or (payload.get("engine") or {}).get("status") != "succeeded":
                    problems.append(f"migrate run: {payload.get('dagster_status')} "
                                    f"{(payload.get('engine') or {}).get('status')} {payload.get('message') or payload.get('stderr', '')}")
                    return seconds
                split = breakdown(env, payload)
                split.update(step_split(env, payload, url))
                for p in PARTS + STEP_PARTS:
                    if p in split:
                        parts[variant][p].append(split[p])
                print("    " + ", ".join(f"{p} {split.get(p, float('nan')):.1f}" for p in PARTS)
                      + "; steps: " + ", ".join(f"{p} {split.get(p, float('nan')):.2f}" for p in STEP_PARTS), flush=True)
                return seconds

            print("seconds:", flush=True)
            out = interleave(variants, args.reps, one)
    finally:
        dbs.close()
        with psycopg.connect(dbs.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{storage_db}" WITH (FORCE)')
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    for p in problems:
        print("PROBLEM:", p)
    e, m = median(out["engine direct"]), median(out["migrate run"])
    lines = [("engine direct seconds", e, f"runs.start_run + drain_threads, width {Settings.from_env({}).lane_width}"),
             ("migrate run seconds", m, "the CLI through Dagster, the run executed in its own process")]
    lines += [(f"  of which {p} seconds", median(parts["migrate run"][p]), "median") for p in PARTS]
    lines += [(f"    steps: {p} seconds", median(parts["migrate run"][p]), "median, summed over the phases")
              for p in STEP_PARTS]
    lines.append(("migrate run / engine direct", ratio(m, e), "target <= 1.5 (default: the lane width of launch threads)"))
    if DAEMON_PATH in out:
        d = median(out[DAEMON_PATH])
        lines += [(f"{DAEMON_PATH} seconds", d, f"{IN_PROCESS_ENV}=0: its own daemon, a run worker")]
        lines += [(f"  of which {p} seconds", median(parts[DAEMON_PATH][p]), "median") for p in PARTS]
        lines.append((f"{DAEMON_PATH} / engine direct", ratio(d, e), "the path before issue 11's in-process runs"))
    if THREADED in out:
        t = median(out[THREADED])
        lines += [(f"{THREADED} seconds", t, f"{LAUNCH_THREADS_ENV}={args.launch_threads}")]
        lines += [(f"  of which {p} seconds", median(parts[THREADED][p]), "median") for p in PARTS]
        lines.append((f"{THREADED} / engine direct", ratio(t, e), "target <= 1.5"))
    print_ratios(f"dagster overhead, {args.scale} sandbox, {rows} rows, medians of {args.reps}", lines)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
