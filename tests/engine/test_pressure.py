"""Behaviour 11: when the database reports more active queries than a threshold, a worker defers
without claiming; the task stays honestly pending."""
from __future__ import annotations

import threading
import time

import psycopg

from engine_core import runs
from engine_core.config import Settings
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker
from tests.engine.support import FAST, make_executions_table, task_rows


def test_worker_defers_without_claiming_under_pressure(db, db_url) -> None:
    make_executions_table(db)
    run = runs.start_run(db, provider_for("counter"), "acme", kinds=["k0"], options={"tasks": 1}, settings=FAST)
    task = task_rows(db, run.id)[0]
    # two other sessions busy with real queries
    stop = threading.Event()

    def busy() -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            while not stop.is_set():
                c.execute("SELECT pg_sleep(0.3)")

    threads = [threading.Thread(target=busy) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)
        pressured = Settings(**{**FAST.__dict__, "pressure_threshold": 1})
        assert Worker(db, settings=pressured, providers=for_run).execute(task["id"]) == "deferred"
        t = task_rows(db, run.id)[0]
        assert t["status"] == "pending" and t["attempts"] == 0 and t["locked_by"] is None
    finally:
        stop.set()
        for t in threads:
            t.join()
    relaxed = Settings(**{**FAST.__dict__, "pressure_threshold": 50})
    assert Worker(db, settings=relaxed, providers=for_run).execute(task["id"]) == "succeeded"
