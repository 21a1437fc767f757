"""The entity path: rows per second moving organizations, persons, deals, leads, activities and notes
from a sandbox (no latency, no rate limit) into Postgres - the engine driven directly (4 lane
threads in this process) against dlt's `rest_api` source loading the same endpoints into the same
server (merge on id), from one run, interleaved, medians.

    python bench/entity_path.py [--scale small] [--reps 3] [--width 4] [--also-rows copy] [--also-probes byid]

dlt is the optional `bench` extra (`pip install -e '.[bench]'`: dlt with its postgres extra);
without it the engine side runs alone and the ratio is skipped, saying so.

The sandbox runs in a subprocess. Every measurement gets a fresh database (the engine's schema,
from a template); the engine migrates a new tenant into it, dlt loads a new dataset into it. Rows
are the sandbox's truth for the six kinds (the same numerator for both). dlt's endpoints: v2 lists
with its cursor paginator (`additional_data.next_cursor`), v1 lists (leads, notes) with its offset
paginator (`start`/`limit`, `more_items_in_collection`), pages of 500, `x-api-token` header. dlt
keeps no ledger, no checkpoints and no references: it is the floor a data engineer would reach for.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import TOKEN, Databases, Sandbox, Timer, interleave, median, print_ratios, ratio, sandbox, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs, write  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.providers.pipedrive import writers  # noqa: E402
from engine_core.providers.pipedrive.provider import ENV_BASE_URL, ENV_TOKEN, PipedriveProvider  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402

KINDS = ["organizations", "persons", "deals", "leads", "activities", "notes"]
V2 = {"organizations": "api/v2/organizations", "persons": "api/v2/persons", "deals": "api/v2/deals",
      "activities": "api/v2/activities"}
V1 = {"leads": "v1/leads", "notes": "v1/notes"}
SETTINGS = Settings(lane_width=4, heartbeat_seconds=1.0, retry_backoff_seconds=0.5)


def dlt_available() -> str | None:
    """None when dlt and its postgres driver import, else why not (one line)."""
    try:
        import dlt  # noqa: F401
        import psycopg2  # noqa: F401
        from dlt.sources.rest_api import rest_api_source  # noqa: F401
    except ImportError as e:
        return f"{e}; install the bench extra: .venv/bin/pip install -e '.[bench]'"
    return None


def engine_once(url: str, sb: Sandbox, width: int) -> tuple[float, str]:
    db = dbmod.Database(url, max_size=width * 3 + 6)
    try:
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        options = {"base_url": sb.base_url, "burst_limit": 1_000_000}
        t = Timer()
        run = runs.start_run(db, PipedriveProvider(base_url=sb.base_url), tenant, kinds=KINDS, options=options, settings=SETTINGS)
        drain_threads(db, run.id, width=width, settings=SETTINGS)
        return t.seconds, runs.get_run(db, run.id).status
    finally:
        db.close()


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
    parser.add_argument("--also-rows", default="", metavar="WAY[,WAY]",
                        help="also run the engine with these other write.ROWS ways (copy, insert), interleaved")
    parser.add_argument("--also-probes", default="", choices=["", "byid"],
                        help="byid: also run the engine asking every missing parent by id (no `ids=` lists), interleaved")
    args = parser.parse_args(argv)
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
    missing = dlt_available()
    dbs = Databases("entity_path")
    problems: list[str] = []
    with sandbox(args.scale, latency="none", burst_limit=1_000_000) as sb:
        os.environ[ENV_BASE_URL] = sb.base_url
        os.environ[ENV_TOKEN] = TOKEN
        truth = sb.truth()["ids"]
        expected = {k: len(truth[k]) for k in KINDS}
        rows = sum(expected.values())
        print(f"entity path: {args.scale} sandbox, {rows} rows {expected}; {server_facts(dbs.server)}", flush=True)
        if missing:
            print(f"dlt: SKIPPED - {missing}", flush=True)

        def one(variant: str, r: int) -> float:
            url = dbs.new()
            if variant.startswith("engine"):
                default, batch_min = write.ROWS, writers.BATCH_MIN
                other = variant.split()[1] if " " in variant else None
                if other == "byid-probes":
                    writers.BATCH_MIN = 10**9  # every parent asked by id, as before issue 11's batching
                elif other is not None:
                    write.ROWS = other
                try:
                    seconds, status = engine_once(url, sb, args.width)
                finally:
                    write.ROWS, writers.BATCH_MIN = default, batch_min
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
            out = interleave(["engine", *others] + ([] if missing else ["dlt rest_api"]), args.reps, one)
        finally:
            dbs.close()
    for p in problems:
        print("PROBLEM:", p)
    e = median(out["engine"])
    lines = [("engine rows/s", e, f"width {args.width}, ledger + checkpoints + references")]
    if missing:
        lines.append(("engine / dlt rows/s", float("nan"), "SKIPPED: dlt not installed"))
    else:
        d = median(out["dlt rest_api"])
        lines += [("dlt rest_api rows/s", d, "merge on id"), ("engine / dlt rows/s", ratio(e, d), "target >= 1.0 (1.5 headed)")]
    for variant in out:
        if variant == "engine byid-probes":
            lines.append((f"engine / {variant} rows/s", ratio(e, median(out[variant])),
                          "missing parents in `ids=` lists vs each by id"))
        elif variant.startswith("engine "):
            lines.append((f"engine / {variant} rows/s", ratio(e, median(out[variant])),
                          f"the default write.ROWS ({write.ROWS}) vs {variant.split()[1]}"))
    print_ratios(f"entity path, {args.scale} sandbox, {rows} rows, medians of {args.reps}", lines)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
