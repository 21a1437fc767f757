"""Behaviour 15: a drain loop claims and runs a run's tasks until nothing is claimable,
heartbeating; many threads and processes drain one run at once and every row lands once."""
from __future__ import annotations

import multiprocessing as mp

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.base import provider_for
from engine_core.worker import Worker, drain_threads
from tests.engine.support import FAST

COUNTS = {"companies": 120, "contacts": 150, "deals": 100, "activities": 80, "notes": 80}


def _drain(url: str, run_id: int) -> None:
    database = dbmod.Database(url, max_size=6)
    drain_threads(database, run_id, width=3, settings=FAST)
    database.close()


def test_threads_and_processes_drain_one_run_exactly_once(db, db_url) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", options={"page_size": 10, "counts": COUNTS}, settings=FAST)
    db.sql("UPDATE migrations SET heartbeat_at = now() - interval '1 hour'")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_drain, args=(db_url, run.id)) for _ in range(2)]
    for p in procs:
        p.start()
    drain_threads(db, run.id, width=3, settings=FAST)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert runs.get_run(db, run.id).status == "succeeded"
    per = {r["kind"]: (r["n"], r["d"]) for r in db.sql(
        "SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items GROUP BY kind")}
    assert per == {k: (v, v) for k, v in COUNTS.items()}
    workers = db.sql("SELECT count(DISTINCT split_part(locked_by, ':', 2)) AS n FROM migration_tasks")
    beat = db.sql("SELECT heartbeat_at > now() - interval '1 minute' AS fresh FROM migrations")[0]["fresh"]
    assert beat, "draining heartbeats the run"


def test_drain_exits_when_nothing_is_claimable(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"], options={"page_size": 10, "counts": {"companies": 5}}, settings=FAST)
    result = Worker(db, settings=FAST).drain(run.id)
    assert result.reason == "succeeded" and result.executed["succeeded"] == 4
