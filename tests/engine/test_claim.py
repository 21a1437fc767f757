"""Behaviour 4: the fenced claim. Many workers in threads and processes race over many task ids;
each task is executed exactly once and the losers exit doing nothing."""
from __future__ import annotations

import multiprocessing as mp
import random
import threading

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker
from tests.engine import support
from tests.engine.support import FAST, make_executions_table

TASKS = 120


def _race(url: str, ids: list[int], seed: int, out: "mp.Queue | None" = None) -> dict[str, int]:
    database = dbmod.Database(url, max_size=2)
    order = list(ids)
    random.Random(seed).shuffle(order)
    w = Worker(database, settings=FAST, providers=for_run)
    counts: dict[str, int] = {}
    for task_id in order:
        r = w.execute(task_id)
        counts[r] = counts.get(r, 0) + 1
    database.close()
    if out is not None:
        out.put(counts)
    return counts


def test_each_task_executes_exactly_once_across_threads_and_processes(db, db_url) -> None:
    assert support.CounterProvider  # registered in child processes by importing this module
    make_executions_table(db)
    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": TASKS}, settings=FAST)
    ids = [r["id"] for r in db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})]
    assert len(ids) == TASKS

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(db_url, ids, 100 + i, q)) for i in range(2)]
    for p in procs:
        p.start()
    results: list[dict[str, int]] = []
    threads = [threading.Thread(target=lambda s=s: results.append(_race(db_url, ids, s))) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        results.append(q.get(timeout=120))
        p.join(timeout=120)

    per_task = db.sql("SELECT task_id, count(*) AS n FROM test_executions GROUP BY task_id")
    assert len(per_task) == TASKS
    assert max(r["n"] for r in per_task) == 1, "a task ran twice: the claim fence is broken"
    succeeded = sum(r.get("succeeded", 0) for r in results)
    assert succeeded == TASKS
    assert sum(r.get("lost", 0) + r.get("terminal", 0) for r in results) == 6 * TASKS - TASKS
