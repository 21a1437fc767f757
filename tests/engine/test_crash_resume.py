"""Behaviour 6: a worker process killed with SIGKILL in the middle of a page. After the stale lock
is released and the task rerun, every row is written exactly once and the task resumes from its
offset rather than rewriting the page."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from psycopg import conninfo

from engine_core import db as dbmod
from engine_core import reaper, runs, window
from engine_core.providers import example
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker
from tests.engine.support import FAST, task_rows

ROWS = 600  # six set-based windows of WINDOW rows: the kill lands inside the page
WINDOW = 100  # the killed worker's set-based windows (window.SET_WINDOW is 500: the page would be two)
APP = "killed-worker"  # the killed worker's application_name: its backends are found by it


def _killed_backends_gone(db: dbmod.Database, timeout: float = 60.0) -> None:
    """Wait until the killed worker's backends have ended. A SIGKILLed client does not stop its
    backend at once: a COMMIT it sent may still land after the client is gone, so the checkpoint and
    the rows are read only once no backend of it is left."""
    deadline = time.monotonic() + timeout
    while db.sql("SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                 " AND application_name = %(app)s", {"app": APP})[0]["n"]:
        assert time.monotonic() < deadline, "the killed worker's backends did not end"
        time.sleep(0.02)


def _work(url: str, task_id: int) -> None:
    window.SET_WINDOW = WINDOW  # this process is the killed worker's alone
    # each window waits before it writes: the page may be mapped whole before its first window (the
    # row delay is the mapper's), and six quick windows then reached the page's end before the kill
    written = window.Windows._write_window

    def slow_window(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(0.3)
        return written(self, *args, **kwargs)

    window.Windows._write_window = slow_window  # type: ignore[method-assign]
    database = dbmod.Database(conninfo.make_conninfo(url, application_name=APP), max_size=2)
    Worker(database, settings=FAST, providers=for_run).execute(task_id)


def test_sigkill_mid_page_then_release_and_resume_writes_each_row_once(db, db_url) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"],
                         options={"page_size": ROWS, "counts": {"companies": ROWS}, "row_delay": 0.01}, settings=FAST)
    task = task_rows(db, run.id)[0]
    proc = mp.get_context("spawn").Process(target=_work, args=(db_url, task["id"]))
    proc.start()
    deadline = time.monotonic() + 60
    offset = 0
    while time.monotonic() < deadline:
        offset = task_rows(db, run.id, id=task["id"])[0]["processed_offset"]
        if offset >= 75:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    _killed_backends_gone(db)
    killed = task_rows(db, run.id, id=task["id"])[0]
    assert killed["status"] == "running" and 75 <= killed["processed_offset"] < ROWS
    at_kill = killed["processed_offset"]
    committed = db.sql("SELECT count(*) AS n FROM example_items")[0]["n"]
    assert committed == at_kill, "rows on disk must equal the checkpoint: it commits with its window"

    # a young lock is not stale; an old one is
    assert reaper.release_stale(db, 3600) == []
    assert reaper.release_stale(db, 0) == [task["id"]]

    example.WRITE_CALLS.clear()
    db.sql("UPDATE migrations SET options = options - 'row_delay'")
    assert Worker(db, settings=FAST, providers=for_run).execute(task["id"]) == "succeeded"
    rewritten = sum(example.WRITE_CALLS.values())
    assert rewritten == ROWS - at_kill, "the rerun must start at the checkpoint, not at the top of the page"
    per_row = db.sql("SELECT source_id, count(*) AS n FROM example_items GROUP BY source_id")
    assert len(per_row) == ROWS and max(r["n"] for r in per_row) == 1
    ledger = db.sql("SELECT count(*) AS n FROM migration_records WHERE kind = 'companies' AND action = 'created'")
    assert ledger[0]["n"] == ROWS
