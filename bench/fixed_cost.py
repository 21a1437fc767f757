"""Dagster's fixed cost of a `migrate run`, from one run: the command's wall time against the engine's
own window in that same run (no engine-direct variant to compare with, so the machine's load falls
on both figures alike).

    python bench/fixed_cost.py [--scale small] [--reps 3] [--latency none]

Each rep migrates a new tenant of one sandbox account through `migrate run --json` (as a user runs
it, no UI alive: the run executes in the command's process; bench/dagster_overhead.py's `cli_env`)
into a fresh database. From the engine's task rows (migration_tasks) and the command's clock:

* engine window: the run's first task start to its last task finish;
* phases:        the sum over phases of first task start to last task finish (the engine working);
* launch:        the command's start to the first task start (imports, checks, instance, the run built);
* boundaries:    the window less the phases: between one phase's last task and the next one's first
                 (a Dagster step's close - materialisation, checks - and the next step's start);
* tail:          the last task finish to the command's exit;
* fixed cost:    wall - phases = launch + boundaries + tail.

Target (issue 25, Deliver 4): fixed cost < 1.5 s a run on the small account.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Databases, median, print_ratios, ratio, sandbox, server_facts, with_dbname  # noqa: E402
from bench.dagster_overhead import MIGRATE, OPTIONS, cli_env  # noqa: E402

PARTS = ("wall", "window", "phases", "launch", "boundaries", "tail", "fixed")


def one_run(env: dict[str, str], kinds: str | None = None) -> dict[str, float]:
    """One `migrate run` of a new tenant into env's DATABASE_URL: its parts (seconds, see the module
    docstring); {} when it did not succeed."""
    import psycopg

    argv = [MIGRATE, "run", "--tenant", f"bench-{uuid.uuid4().hex[:8]}", "--json", "--options", json.dumps(OPTIONS)]
    if kinds:
        argv += ["--kinds", kinds]
    started = time.time()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    ended = time.time()
    try:
        ok = json.loads(out.stdout).get("dagster_status") == "SUCCESS"
    except ValueError:
        ok = False
    if not ok:
        print(f"  migrate run exit {out.returncode}: {out.stderr[-500:]}", flush=True)
        return {}
    with psycopg.connect(env["DATABASE_URL"]) as c:
        spans = [(float(a), float(b)) for a, b in c.execute(
            "SELECT extract(epoch FROM min(started_at)), extract(epoch FROM max(finished_at)) FROM migration_tasks"
            " GROUP BY phase HAVING min(started_at) IS NOT NULL ORDER BY 1").fetchall()]
    first, last = spans[0][0], max(b for _, b in spans)
    phases = sum(b - a for a, b in spans)
    wall = ended - started
    return {"wall": wall, "window": last - first, "phases": phases, "launch": first - started,
            "boundaries": (last - first) - phases, "tail": ended - last, "fixed": wall - phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--latency", default="none", help="the sandbox's latency: none, realistic, realistic:<f>")
    args = parser.parse_args(argv)
    import psycopg
    from migration_pipeline.instance import to_url

    dbs = Databases("fixed_cost")
    storage_db = f"{dbs.prefix}_dagster"
    with psycopg.connect(dbs.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{storage_db}"')
    storage_url = to_url(with_dbname(dbs.server, storage_db), scheme="postgresql+psycopg2")
    home = Path(tempfile.mkdtemp(prefix="bench-fixed-home-"))
    got: dict[str, list[float]] = {p: [] for p in PARTS}
    failed = 0
    try:
        with sandbox(args.scale, latency=args.latency, burst_limit=1_000_000) as sb:
            print(f"fixed cost: {args.scale} sandbox, latency {args.latency}; {server_facts(dbs.server)}", flush=True)
            one_run(cli_env(dbs.new(), storage_url, home, sb), "users")  # warm-up: Dagster's tables (a user pays it once)
            for r in range(args.reps):
                parts = one_run(cli_env(dbs.new(), storage_url, home, sb))
                if not parts:
                    failed += 1
                    continue
                print(f"  round {r + 1}: " + ", ".join(f"{p} {parts[p]:.2f}" for p in PARTS), flush=True)
                for p in PARTS:
                    got[p].append(parts[p])
    finally:
        dbs.close()
        with psycopg.connect(dbs.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{storage_db}" WITH (FORCE)')
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    m = {p: median(got[p]) for p in PARTS}
    lines = [(f"{p} seconds", m[p], "median") for p in PARTS]
    lines += [("engine window / command wall", ratio(m["window"], m["wall"]), "the engine's share of the command"),
              ("fixed cost seconds", m["fixed"], "wall - phases; target < 1.5")]
    print_ratios(f"fixed cost, {args.scale} sandbox, medians of {len(got['wall'])}", lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
