"""Dagster's fixed cost of a `migrate run`, from one run: the command's wall time against the engine's
own window in that same run (no engine-direct variant to compare with, so the machine's load falls
on both figures alike).

    python bench/fixed_cost.py [--scale small] [--reps 3] [--latency none] [--against DIR] [--kinds K,..] [--preload]

Each rep migrates a new tenant of one sandbox account through `migrate run --json` (as a user runs
it, no UI alive: the run executes in the command's process; bench/dagster_overhead.py's `cli_env`)
into a fresh database. From the engine's task rows (migration_tasks) and the command's clock:

* engine window: the run's first task start to its last task finish;
* phases:        the time covered by some phase's span (its first task start to its last task
                 finish): the engine working. Phases overlap where a phase's early tasks (a
                 discovery) or lane threads carried into the next phase (migration_pipeline/lane/carry.py)
                 start it before the Dagster step of the one before has closed: counted once;
* launch:        the command's start to the first task start (imports, checks, instance, the run built);
* boundaries:    the window less the phases: the gaps no phase covers, between one phase's last task
                 and the next one's first (a Dagster step's close - materialisation, checks - and the
                 next step's start, while the engine waits);
* tail:          the last task finish to the command's exit;
* fixed cost:    wall - phases = launch + boundaries + tail;
* cpu:           the command's own CPU seconds (user + system; its Postgres backends and the sandbox
                 not counted): steadier than the wall on a loaded machine. With `--preload` the work
                 runs in a child of the launcher's server, not counted: compare walls then.

`--against DIR` runs the same rounds, interleaved, with the code of another checkout (`git archive
<commit> | tar -x -C DIR`: its packages ahead of this clone's on PYTHONPATH, same venv) and prints
both sides and their ratios: of the medians, and the median of each round's own ratio (its two runs
back to back: on a machine whose load drifts the paired ratio is the steadier one).

Target (issue 25, Deliver 4): fixed cost < 1.5 s a run on the small account.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Databases, median, print_ratios, ratio, sandbox, server_facts, with_dbname  # noqa: E402
from bench.dagster_overhead import MIGRATE, OPTIONS, cli_env  # noqa: E402

PARTS = ("wall", "window", "phases", "launch", "boundaries", "tail", "fixed", "cpu")


def covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of `spans` ((start, end) pairs sorted by start), in their unit."""
    total, reach = 0.0, float("-inf")
    for a, b in spans:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def one_run(env: dict[str, str], kinds: str | None = None) -> dict[str, float]:
    """One `migrate run` of a new tenant into env's DATABASE_URL: its parts (seconds, see the module
    docstring); {} when it did not succeed."""
    import psycopg

    argv = [MIGRATE, "run", "--tenant", f"bench-{uuid.uuid4().hex[:8]}", "--json", "--options", json.dumps(OPTIONS)]
    if kinds:
        argv += ["--kinds", kinds]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1200)
    ended = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
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
    phases = covered(spans)
    wall = ended - started
    return {"wall": wall, "window": last - first, "phases": phases, "launch": first - started,
            "boundaries": (last - first) - phases, "tail": ended - last, "fixed": wall - phases, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--latency", default="none", help="the sandbox's latency: none, realistic, realistic:<f>")
    parser.add_argument("--against", default=None, help="another checkout's directory, run interleaved")
    parser.add_argument("--preload", action="store_true", help="this checkout's commands through the pre-loaded "
                        "launcher (MIGRATE_PRELOAD=1, as a command typed at a terminal; its server started by the "
                        "warm-up run); without --against, interleaved with the same commands without it (plain)")
    parser.add_argument("--kinds", default=None, help="migrate only these kinds (`--kinds users`: a short run for the "
                                                     "launch; its tail then holds the unplanned phases' steps)")
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, str]] = {"this": {"MIGRATE_PRELOAD": "1", "MIGRATE_PRELOAD_IDLE_SECONDS": "120"}
                                           if args.preload else {}}
    if args.against:
        variants["against"] = {"PYTHONPATH": str(Path(args.against).resolve())}
    elif args.preload:  # what a script or service gets (no terminal: no launcher), beside a user at a prompt
        variants["plain"] = {"MIGRATE_PRELOAD": "0"}
    other = [v for v in variants if v != "this"]
    import psycopg
    from migration_pipeline.instance import to_url

    dbs = Databases("fixed_cost")
    storage_db = f"{dbs.prefix}_dagster"
    with psycopg.connect(dbs.server, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{storage_db}"')
    storage_url = to_url(with_dbname(dbs.server, storage_db), scheme="postgresql+psycopg2")
    homes = {v: Path(tempfile.mkdtemp(prefix=f"bench-fixed-home-{v}-")) for v in variants}
    got: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PARTS} for v in variants}
    rounds: list[dict[str, dict[str, float]]] = []  # per round, each variant's parts (paired ratios)
    failed = 0
    try:
        with sandbox(args.scale, latency=args.latency, burst_limit=1_000_000) as sb:
            print(f"fixed cost: {args.scale} sandbox, latency {args.latency}; {server_facts(dbs.server)}", flush=True)
            for v, extra in variants.items():  # warm-up: Dagster's tables, the bytecode cache (a user pays them once)
                one_run(cli_env(dbs.new(), storage_url, homes[v], sb, **extra), "users")
            names = list(variants)
            for r in range(args.reps):
                rounds.append({})
                for v in names[r % len(names):] + names[:r % len(names)]:
                    parts = one_run(cli_env(dbs.new(), storage_url, homes[v], sb, **variants[v]), args.kinds)
                    if not parts:
                        failed += 1
                        continue
                    rounds[-1][v] = parts
                    print(f"  round {r + 1} {v:<8}: " + ", ".join(f"{p} {parts[p]:.2f}" for p in PARTS), flush=True)
                    for p in PARTS:
                        got[v][p].append(parts[p])
    finally:
        dbs.close()
        with psycopg.connect(dbs.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{storage_db}" WITH (FORCE)')
        import shutil

        for home in homes.values():
            shutil.rmtree(home, ignore_errors=True)
    m = {v: {p: median(got[v][p]) for p in PARTS} for v in variants}
    lines = []
    for v in variants:
        side = "" if len(variants) == 1 else f" ({v})"
        lines += [(f"{p} seconds{side}", m[v][p], "median") for p in PARTS]
        lines += [(f"engine window / command wall{side}", ratio(m[v]["window"], m[v]["wall"]),
                   "the engine's share of the command"),
                  (f"fixed cost seconds{side}", m[v]["fixed"], "wall - phases; target < 1.5")]
    for o in other:
        lines += [(f"{p} this / {o}", ratio(m["this"][p], m[o][p]), f"below 1: this is shorter than {o}")
                  for p in ("wall", "fixed", "launch", "boundaries", "tail", "cpu")]
        pairs = [r for r in rounds if len(r) == 2]
        lines += [(f"{p} this / {o}, paired", median([ratio(r["this"][p], r[o][p]) for r in pairs]),
                   f"median of {len(pairs)} rounds' own ratios (back to back: the load's drift cancels)")
                  for p in ("wall", "fixed", "launch", "cpu")]
    print_ratios(f"fixed cost, {args.scale} sandbox, medians of {len(got['this']['wall'])}", lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
