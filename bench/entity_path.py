"""The entity path: rows per second moving organizations, persons, deals, leads, activities and notes
from a sandbox (no latency, no rate limit) into Postgres - the engine driven directly (4 lane
threads in this process) against dlt's `rest_api` source loading the same endpoints into the same
server (merge on id), from one run, interleaved, medians.

    python bench/entity_path.py [--scale small] [--reps 3] [--width 4] [--burst-limit 80] [--also-rows copy] [--also-probes byid]
                                [--also-before json,window,gc] [--against DIR]

dlt is the optional `bench` extra (`pip install -e '.[bench]'`: dlt with its postgres extra);
without it the engine side runs alone and the ratio is skipped, saying so.

The sandbox runs in a subprocess, with no rate limit unless `--burst-limit` gives one (Pipedrive's
is 80 per 2 s on most plans): then every measurement starts once the sandbox's burst window has
emptied (`WINDOW_REST`), since its fresh database's budget row cannot know the requests of the run
before it on the same token, which one deployment's row would. Every measurement gets a fresh database (the engine's schema,
from a template); the engine migrates a new tenant into it, dlt loads a new dataset into it. Rows
are the sandbox's truth for the six kinds (the same numerator for both). dlt's endpoints: v2 lists
with its cursor paginator (`additional_data.next_cursor`), v1 lists (leads, notes) with its offset
paginator (`start`/`limit`, `more_items_in_collection`), pages of 500, `x-api-token` header. dlt
keeps no ledger, no checkpoints and no references: it is the floor a data engineer would reach for.

`--also-before` runs the engine a second way in the same rounds with issue 11's earlier CPU
choices put back: `json` - the standard library's json for the responses (`decode._decode_json`)
and the windows' new rows (`ledger.rows_json`) instead of orjson; `window` - set-based windows of
100 rows (`window.SET_WINDOW`) instead of 500; `gc` - Python's default young collection threshold
(700) instead of the engine's (`worker.YOUNG_COLLECTION_THRESHOLD`); `all` - the three. Every
variant, dlt included, starts with the collector thresholds this process started with (the
engine's workers raise theirs as they do everywhere; dlt keeps Python's, as a user's would).

`--against DIR` (another checkout of this project, e.g. `git archive main | tar -x -C DIR`) runs
the engine of each tree in a child process of its own (`engine@this`, `engine@against`: the same
sandbox, server and rounds, each child timing and measuring its own CPU around `engine_once`, its
imports aside), so a change is compared with the code before it in one interleaved run. Each
tree's runs get databases of its own schema (its migrations applied by its code): a change that
adds a migration is compared with the code before it on the schema before it.

Beside rows/s (the wall, which other sessions' load on the machine moves), the engine's CPU is
given as this process's CPU seconds and its Postgres backends' (/proc, a server on this machine):
steadier measures of the engine's own work when the load is high.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# Run as a script, this folder is sys.path[0], and bench/requests.py then shadows the `requests`
# library dlt imports (dlt failed to import, and the ratio was skipped as "dlt not installed").
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TOKEN, Databases, Sandbox, Timer, interleave, median, print_ratios, ratio, sandbox, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import ledger, runs, window, worker, write  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive import client, decode, writers  # noqa: E402
from engine_core.providers.pipedrive.provider import PipedriveProvider  # noqa: E402
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402
from engine_core.providers.registry import for_run

KINDS = ["organizations", "persons", "deals", "leads", "activities", "notes"]
V2 = {"organizations": "api/v2/organizations", "persons": "api/v2/persons", "deals": "api/v2/deals",
      "activities": "api/v2/activities"}
V1 = {"leads": "v1/leads", "notes": "v1/notes"}
SETTINGS = Settings(lane_width=4, heartbeat_seconds=1.0, retry_backoff_seconds=0.5)
NO_LIMIT = 1_000_000  # the sandbox's burst limit (and the engine's) when --burst-limit is not given
WINDOW_REST = 2.25  # seconds: the sandbox's burst window (2 s) and a margin, between measurements
BEFORE_WINDOW = 100  # window.SET_WINDOW before issue 11's 500
BEFORE = {"json": ("json",), "window": ("window",), "gc": ("gc",), "all": ("json", "window", "gc")}
# Python's collector thresholds as this process started: every variant starts from them (a Worker
# raises the young one for the engine, `worker.collector_for_draining`; dlt runs with the defaults,
# as a user's pipeline would; the setting is process-wide and would otherwise carry over to it)
PYTHON_GC_THRESHOLDS = gc.get_threshold()


def _stdlib_rows_json(rows: Any) -> str:
    # ledger.rows_json before orjson: ASCII JSON from the standard library
    return json.dumps(rows, ensure_ascii=True, default=str)


def put_back(parts: tuple[str, ...]) -> dict[tuple[Any, str], Any]:
    """Put issue 11's earlier choices back in this process (`parts`: json, window); returns what
    to restore (`restore`)."""
    saved: dict[tuple[Any, str], Any] = {}

    def swap(module: Any, name: str, value: Any) -> None:
        saved[(module, name)] = getattr(module, name)
        setattr(module, name, value)

    if "json" in parts:
        swap(client, "_decode_json", decode.stdlib_decode_json)  # every body read as before orjson
        if hasattr(ledger, "rows_json"):
            swap(ledger, "rows_json", _stdlib_rows_json)
    if "window" in parts:
        swap(window, "SET_WINDOW", BEFORE_WINDOW)
    if "gc" in parts:  # the young threshold left at Python's default
        swap(worker, "YOUNG_COLLECTION_THRESHOLD", PYTHON_GC_THRESHOLDS[0])
    return saved


def restore(saved: dict[tuple[Any, str], Any]) -> None:
    for (module, name), value in saved.items():
        setattr(module, name, value)


def dlt_available() -> str | None:
    """None when dlt and its postgres driver import, else why not (one line)."""
    try:
        import dlt  # noqa: F401
        import psycopg2  # noqa: F401
        from dlt.sources.rest_api import rest_api_source  # noqa: F401
    except ImportError as e:
        return f"{e}; install the bench extra: .venv/bin/pip install -e '.[bench]'"
    return None


def engine_once(url: str, sb: Sandbox, width: int, pg_cpu: list[float] | None = None) -> tuple[float, str]:
    """One engine run into `url`: (seconds, the run's status); `pg_cpu` gets the CPU seconds its
    pool's Postgres backends spent (`backends_cpu`), when the server is on this machine."""
    db = dbmod.Database(url, max_size=width * 3 + 6)
    try:
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        options = {"base_url": sb.base_url, "burst_limit": 1_000_000}
        t = Timer()
        run = runs.start_run(db, PipedriveProvider(base_url=sb.base_url), tenant, kinds=KINDS, options=options, settings=SETTINGS)
        drain_threads(db, run.id, width=width, settings=SETTINGS, providers=for_run)
        seconds = t.seconds
        spent = backends_cpu(db)
        if pg_cpu is not None and spent is not None:
            pg_cpu.append(spent)
        return seconds, runs.get_run(db, run.id).status
    finally:
        db.close()


# A child process's engine run from a tree (`--against`): that tree's `engine_once`, timed in the child
_CHILD = """
import json, os, sys, time
tree, url, base_url, width = sys.argv[1:5]
sys.path.insert(0, tree)
from bench.common import Sandbox
from bench.entity_path import engine_once
pg = []
started = time.process_time()
seconds, status = engine_once(url, Sandbox(base_url), int(width), pg)
print(json.dumps({"seconds": seconds, "status": status, "cpu": time.process_time() - started, "pg": pg[0] if pg else None}))
"""


def child_once(tree: Path, url: str, sb: Sandbox, width: int) -> dict[str, Any]:
    """One engine run into `url` by the code of `tree` (a checkout of this project) in a child
    process: {seconds, status, cpu (the child's CPU seconds over the run), pg (its backends')}."""
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tree), url, sb.base_url, str(width)], cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def backends_cpu(db: dbmod.Database) -> float | None:
    """CPU seconds (user + system, /proc) of the backends connected to this database - the run's
    own, each measurement having a fresh database - or None when the server is not on this machine."""
    pids = [int(r["pid"]) for r in db.sql("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
    total = 0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def dlt_once(url: str, sb: Sandbox) -> tuple[float, dict[str, int]]:
    import dlt
    from dlt.sources.rest_api import rest_api_source

    resources: list[dict[str, Any]] = []
    for name, path in V2.items():
        resources.append({"name": name, "endpoint": {
            "path": path, "params": {"limit": 500},
            "paginator": {"type": "cursor", "cursor_path": "additional_data.next_cursor", "cursor_param": "cursor"}}})
    for name, path in V1.items():
        resources.append({"name": name, "endpoint": {
            "path": path,
            "paginator": {"type": "offset", "limit": 500, "offset_param": "start", "limit_param": "limit",
                          "total_path": None, "has_more_path": "additional_data.pagination.more_items_in_collection"}}})
    source = rest_api_source({
        "client": {"base_url": sb.base_url + "/",
                   "auth": {"type": "api_key", "name": "x-api-token", "api_key": TOKEN, "location": "header"}},
        "resource_defaults": {"primary_key": "id", "write_disposition": "merge", "endpoint": {"data_selector": "data"}},
        "resources": resources,
    })
    dataset = f"dlt_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bench-dlt-") as home:
        pipeline = dlt.pipeline(pipeline_name=dataset, pipelines_dir=home, dataset_name=dataset,
                                destination=dlt.destinations.postgres(credentials=dbmod_psycopg2_url(url)))
        t = Timer()
        pipeline.run(source)
        seconds = t.seconds
    with dbmod.Database(url, max_size=1) as db:
        counts = {k: int(db.sql(f'SELECT count(*) AS n FROM "{dataset}"."{k}"')[0]["n"]) for k in KINDS}
        db.sql(f'DROP SCHEMA "{dataset}" CASCADE')
    return seconds, counts


def dbmod_psycopg2_url(url: str) -> str:
    # dlt wants a postgresql:// URL with a password: under trust auth any password does
    from psycopg import conninfo

    p = conninfo.conninfo_to_dict(url)
    auth = p.get("user", "postgres") + ":" + (p.get("password") or "trust")
    host = p.get("host", "127.0.0.1")
    if host.startswith("/"):  # a unix socket (the embedded server): dlt reads it from the query
        return f"postgresql://{auth}@localhost:{p.get('port', 5432)}/{p['dbname']}?host={host}"
    return f"postgresql://{auth}@{host}:{p.get('port', 5432)}/{p['dbname']}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=4, help="the engine's lane threads")
    parser.add_argument("--latency", default="none",
                        help="the sandbox's latency: none (default), realistic, realistic:<factor>")
    parser.add_argument("--burst-limit", type=int, default=NO_LIMIT,
                        help="the sandbox's requests per 2 s window (default: no limit); the engine keeps to it, dlt ignores it")
    parser.add_argument("--also-rows", default="", metavar="WAY[,WAY]",
                        help="also run the engine with these other write.ROWS ways (copy, insert), interleaved")
    parser.add_argument("--also-probes", default="", choices=["", "byid"],
                        help="byid: also run the engine asking every missing parent by id (no `ids=` lists), interleaved")
    parser.add_argument("--also-before", default="", metavar="PART[,PART]",
                        help="also run the engine with issue 11's earlier CPU choices put back, interleaved, one"
                             " variant per PART: json (stdlib json), window (set windows of 100), gc (Python's"
                             " young collection threshold), all (the three)")
    parser.add_argument("--against", default=None, metavar="DIR", type=Path,
                        help="also run the engine of this tree and of DIR (another checkout) in child processes, interleaved")
    args = parser.parse_args(argv)
    befores = [b.strip() for b in args.also_before.split(",") if b.strip()]
    for b in befores:
        if b not in BEFORE:
            parser.error(f"--also-before: {b!r} is none of {', '.join(BEFORE)}")
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
    missing = dlt_available()
    dbs = Databases("entity_path")
    dbs_against = Databases("entity_path_against", tree=args.against.resolve()) if args.against else None
    problems: list[str] = []
    with sandbox(args.scale, latency=args.latency, burst_limit=args.burst_limit) as sb:
        os.environ[ENV_BASE_URL] = sb.base_url
        os.environ[ENV_TOKEN] = TOKEN
        truth = sb.truth()["ids"]
        expected = {k: len(truth[k]) for k in KINDS}
        rows = sum(expected.values())
        print(f"entity path: {args.scale} sandbox, latency {args.latency}, {rows} rows {expected}; "
              f"{server_facts(dbs.server)}", flush=True)
        if missing:
            print(f"dlt: SKIPPED - {missing}", flush=True)

        cpu: dict[str, list[float]] = {}
        pg: dict[str, list[float]] = {}

        def one(variant: str, r: int) -> float:
            if args.burst_limit < NO_LIMIT:
                time.sleep(WINDOW_REST)
            url = (dbs_against if variant == "engine@against" and dbs_against else dbs).new()
            gc.set_threshold(*PYTHON_GC_THRESHOLDS)
            if variant.startswith("engine@"):
                tree = Path(__file__).resolve().parent.parent if variant == "engine@this" else args.against.resolve()
                got = child_once(tree, url, sb, args.width)
                cpu.setdefault(variant, []).append(got["cpu"])
                if got["pg"] is not None:
                    pg.setdefault(variant, []).append(got["pg"])
                if got["status"] != "succeeded":
                    problems.append(f"{variant} run {got['status']}")
                return rows / got["seconds"]
            if variant.startswith("engine"):
                started = time.process_time()
                default, batch_min = write.ROWS, writers.BATCH_MIN
                other = variant.split()[1] if " " in variant else None
                saved: dict[tuple[Any, str], Any] = {}
                if other == "byid-probes":
                    writers.BATCH_MIN = 10**9  # every parent asked by id, as before issue 11's batching
                elif other is not None and other.startswith("before-"):
                    saved = put_back(BEFORE[other.removeprefix("before-")])
                elif other is not None:
                    write.ROWS = other
                try:
                    seconds, status = engine_once(url, sb, args.width, pg.setdefault(variant, []))
                finally:
                    write.ROWS, writers.BATCH_MIN = default, batch_min
                    restore(saved)
                # this process's CPU (the engine's threads; the sandbox has its own): steadier than
                # the wall on a machine others share
                cpu.setdefault(variant, []).append(time.process_time() - started)
                if status != "succeeded":
                    problems.append(f"{variant} run {status}")
            else:
                seconds, counts = dlt_once(url, sb)
                if counts != expected:
                    problems.append(f"dlt loaded {counts}, the sandbox has {expected}")
            return rows / seconds

        try:
            print("rows/s:", flush=True)
            others = [f"engine {w.strip()}" for w in args.also_rows.split(",") if w.strip()]
            others += ["engine byid-probes"] if args.also_probes == "byid" else []
            others += [f"engine before-{b}" for b in befores]
            others += ["engine@this", "engine@against"] if args.against else []
            out = interleave(["engine", *others] + ([] if missing else ["dlt rest_api"]), args.reps, one)
        finally:
            dbs.close()
            if dbs_against:
                dbs_against.close()
    for p in problems:
        print("PROBLEM:", p)
    e = median(out["engine"])
    lines = [("engine rows/s", e, f"width {args.width}, ledger + checkpoints + references")]
    if missing:
        lines.append(("engine / dlt rows/s", float("nan"), "SKIPPED: dlt not installed"))
    else:
        d = median(out["dlt rest_api"])
        lines += [("dlt rest_api rows/s", d, "merge on id"), ("engine / dlt rows/s", ratio(e, d), "target >= 1.0 (1.5 headed)")]
        lines += [(f"{v} / dlt rows/s", ratio(median(out[v]), d), "issue 11's earlier choices")
                  for v in out if v.startswith("engine before-")]
    c = median(cpu.get("engine", []))
    lines.append(("engine CPU ms per 1000 rows", 1e6 * c / rows, "this process: the engine's threads"))
    for variant in out:
        if variant.startswith("engine ") and variant in cpu:
            lines.append((f"{variant} CPU / engine CPU", ratio(median(cpu[variant]), c), "the same process's CPU, medians"))
    if pg.get("engine"):
        p = median(pg["engine"])
        lines.append(("Postgres CPU ms per 1000 rows", 1e6 * p / rows, "the engine's backends (/proc)"))
        for variant in out:
            if variant.startswith("engine ") and pg.get(variant):
                lines.append((f"{variant} Postgres CPU / engine's", ratio(median(pg[variant]), p), "the same backends' CPU, medians"))
    if args.against:
        here, there = "engine@this", "engine@against"
        lines.append(("engine@this / engine@against rows/s", ratio(median(out[here]), median(out[there])),
                      f"this tree vs {args.against} (child processes)"))
        if not missing:
            lines += [(f"{v} / dlt rows/s", ratio(median(out[v]), median(out["dlt rest_api"])), "child process")
                      for v in (here, there)]
        for v in (here, there):
            lines.append((f"{v} CPU ms per 1000 rows", 1e6 * median(cpu[v]) / rows, "the child's CPU over the run"))
            if pg.get(v):
                lines.append((f"{v} Postgres CPU ms per 1000 rows", 1e6 * median(pg[v]) / rows, "its backends (/proc)"))
        lines.append(("engine@this / engine@against CPU", ratio(median(cpu[here]), median(cpu[there])), "medians"))
        if pg.get(here) and pg.get(there):
            lines.append(("engine@this / engine@against Postgres CPU", ratio(median(pg[here]), median(pg[there])), "medians"))
    for variant in out:
        if variant == "engine byid-probes":
            lines.append((f"engine / {variant} rows/s", ratio(e, median(out[variant])),
                          "missing parents in `ids=` lists vs each by id"))
        elif variant.startswith("engine before-"):
            lines.append((f"engine / {variant} rows/s", ratio(e, median(out[variant])),
                          f"today's vs issue 11's earlier {variant.split('-', 1)[1]} (see --also-before)"))
        elif variant.startswith("engine "):
            lines.append((f"engine / {variant} rows/s", ratio(e, median(out[variant])),
                          f"the default write.ROWS ({write.ROWS}) vs {variant.split()[1]}"))
    limit = "" if args.burst_limit >= NO_LIMIT else f", burst limit {args.burst_limit} per 2 s"
    print_ratios(f"entity path, {args.scale} sandbox{limit}, {rows} rows, medians of {args.reps}", lines)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
