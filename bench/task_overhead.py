"""Per-task engine overhead: what claiming, checkpointing, finishing, topping up and advancing cost a
task whose own work is nothing, in milliseconds of lane time per task, at lane width 1 and 4.

    python bench/task_overhead.py [--tasks 200] [--reps 3]

A provider of this file's own (`bench-noop`) has three phases of `--tasks` tasks each; a task
writes one 25-row-window checkpoint (its offset) and finishes. The run is drained by
`worker.drain_threads` in this process; lane time per task = wall time x width / tasks (at width 4
the lanes contend for the same rows and the same two cores, so it is higher). Widths are
interleaved; medians. The issue's target: under 10 ms.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Databases, Timer, interleave, median, print_ratios, server_facts  # noqa: E402
from engine_core import db as dbmod  # noqa: E402
from engine_core import runs  # noqa: E402
from engine_core.config import Settings  # noqa: E402
from engine_core.context import TaskContext  # noqa: E402
from engine_core.models import Run, Successor, TaskOutcome  # noqa: E402
from engine_core.providers.registry import register  # noqa: E402
from engine_core.worker import drain_threads  # noqa: E402


class NoopProvider:
    """Tasks that do no work of their own: one checkpoint, then finish."""

    source = "bench-noop"

    def __init__(self, run: Run | None = None) -> None:
        self.options = dict(run.options) if run else {}

    def phases(self) -> list[list[str]]:
        return [["k0"], ["k1"], ["k2"]]

    def account(self) -> str:
        return "bench-noop"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        return [Successor(f"{kind}:{i}", {"i": i}) for i in range(int(run.options.get("tasks", 10)))]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        with ctx.db.transaction() as tx:
            ctx.checkpoint(tx, 25)
        return TaskOutcome()


register("bench-noop", NoopProvider)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks per phase (three phases)")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    settings = Settings(lane_width=4, heartbeat_seconds=1.0)
    dbs = Databases("task_overhead")
    db = dbmod.Database(dbs.new(), max_size=16)
    print(f"task overhead: 3 phases x {args.tasks} no-op tasks; {server_facts(dbs.server)}", flush=True)
    provider = NoopProvider()
    failed: list[str] = []

    def one(variant: str, r: int) -> float:
        width = int(variant.split()[1])
        run = runs.start_run(db, provider, f"bench-{uuid.uuid4().hex[:8]}", options={"tasks": args.tasks}, settings=settings)
        t = Timer()
        drain_threads(db, run.id, width=width, settings=settings, providers=lambda _run: provider)
        seconds = t.seconds
        status = runs.get_run(db, run.id).status
        if status != "succeeded":
            failed.append(f"{variant}: run {run.id} {status}")
        return seconds * 1000 * width / (3 * args.tasks)

    try:
        print("ms of lane time per task:", flush=True)
        out = interleave(["width 1", "width 4"], args.reps, one)
    finally:
        db.close()
        dbs.close()
    for f in failed:
        print("NOT SUCCEEDED:", f)
    w1, w4 = median(out["width 1"]), median(out["width 4"])
    print_ratios(f"task overhead, {3 * args.tasks} tasks per run, medians of {args.reps}", [
        ("ms per task, width 1", w1, "target < 10"),
        ("ms per task (lane time), width 4", w4, "target < 10"),
        ("width 4 / width 1 per task", w4 / w1 if w1 else float("nan"), "contention of 4 lanes on 2 cores"),
    ])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
