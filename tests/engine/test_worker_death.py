"""A dying worker never cancels a task, and the barrier never walks past one.

Pinned here, on real Postgres with real processes:
* a drainer process whose two idle pool backends are terminated (`pg_terminate_backend`) loses a
  lane; the sibling lane, stopped by the shared cancel Event, releases its task to pending (attempt
  refunded) instead of cancelling it; the reaper and another drainer then finish the run, which
  reconciles exactly (every source row written once);
* a drainer SIGKILLed mid-task: the reaper releases its tasks and another drainer finishes them
  from their checkpoints, rewriting no committed window;
* in process: a worker shutting down releases, a stop of the run cancels; a cancelled task in a
  running run holds the barrier and the reaper re-arms it; finalize never says `succeeded` with a
  cancelled or pending task; a phase closing with a failed task fails the run and seeds nothing.

Run as a module (`python -m tests.engine.test_worker_death URL RUN_ID MARKERS HOLD POOL`) it is the
child drainer process the first two tests start.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from psycopg import conninfo

from engine_core import reaper, runs, window
from engine_core.config import Settings
from engine_core.context import TaskContext
from engine_core.errors import TaskStopped
from engine_core.models import TaskOutcome
from engine_core.providers import example
from engine_core.providers.registry import provider_for, register, for_run
from engine_core.providers.example import ExampleProvider
from engine_core.worker import Worker, drain_threads
from tests.engine.support import FAST, make_executions_table, task_rows

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("companies", "contacts", "deals", "activities", "notes")
CHILD_SETTINGS = Settings(lane_width=2, stale_lock_seconds=60, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)
PAGE = 300
CHILD_SET_WINDOW = 100  # the child drainer's set-based windows: a page of PAGE rows is three (window.SET_WINDOW is 500)
REAPER_SETTINGS = Settings(lane_width=2, stale_lock_seconds=0.2, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)

# -- a provider that can hold a task where a source wait would be ---------------------------------

HOLD: dict[str, str] = {}  # cursor_key -> "go" (until MARKERS/go exists) or "cancel" (until the worker's cancel Event)
MARKERS: list[Path] = []


class HeldExample(ExampleProvider):
    """The example provider, with chosen tasks held before their page the way a slow source holds
    them (the Pipedrive client's waits end on the worker's cancel Event with TaskStopped)."""

    source = "held_example"

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        how = HOLD.get(ctx.task.cursor_key)
        if how:
            markers = MARKERS[0]
            (markers / f"holding-{ctx.task.cursor_key}").write_text(ctx.worker)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if ctx.cancel.wait(0.02):
                    raise TaskStopped()
                if how == "go" and (markers / "go").exists():
                    break
        return super().run_task(ctx)


register("held_example", HeldExample)


def _child_main(argv: list[str]) -> int:
    """The drainer process: drain_threads(width=2) over one run, on a pool of `pool` connections."""
    from engine_core.db import Database
    from engine_core.runlog import failure_reason

    url, run_id, markers, hold, pool = argv
    window.SET_WINDOW = CHILD_SET_WINDOW
    MARKERS.append(Path(markers))
    HOLD.update(json.loads(hold))
    db = Database(url, min_size=int(pool), max_size=int(pool), name="child")
    print(f"pid {os.getpid()}", flush=True)
    try:
        results = drain_threads(db, int(run_id), width=2, settings=CHILD_SETTINGS, providers=for_run)
    except BaseException as e:  # the lane death this test provokes
        print(f"lane died: {failure_reason(e)}", flush=True)
        return 3
    print(f"drained: {[r.executed for r in results]}", flush=True)
    return 0


def _spawn(db_url: str, run_id: int, markers: Path, hold: dict[str, str], pool: int) -> tuple[subprocess.Popen, str]:
    app = f"drainer-{uuid.uuid4().hex[:8]}"
    url = conninfo.make_conninfo(db_url, application_name=app)
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.engine.test_worker_death", url, str(run_id), str(markers), json.dumps(hold), str(pool)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return child, app


def _wait_for(what: str, check, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _reconciles(db, run_id: int, per_kind: int) -> None:
    """Every source row written exactly once, and the ledger says so."""
    items = {r["kind"]: r for r in db.sql(
        "SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items GROUP BY kind")}
    assert set(items) == set(KINDS)
    assert all(r["n"] == r["d"] == per_kind for r in items.values()), items
    ledger = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE migration_id = %(r)s AND action = 'created' GROUP BY kind",
        {"r": run_id})}
    assert ledger == {k: per_kind for k in KINDS}


# -- real processes ---------------------------------------------------------------------------------


def test_terminated_backends_kill_a_lane_and_its_sibling_releases_instead_of_cancelling(db, db_url, tmp_path) -> None:
    p = provider_for("held_example")
    run = runs.start_run(db, p, "acme", options={"page_size": 10, "counts": {k: 20 for k in KINDS}}, settings=FAST)
    # lane A holds companies:0 until told to go; lane B holds companies:10 until its cancel Event
    child, app = _spawn(db_url, run.id, tmp_path, {"companies:0": "go", "companies:10": "cancel"}, pool=2)
    try:
        _wait_for("both lanes holding a task",
                  lambda: (tmp_path / "holding-companies:0").exists() and (tmp_path / "holding-companies:10").exists())
        who = "datname = current_database() AND application_name = %(a)s"
        idle = db.sql(f"SELECT pid FROM pg_stat_activity WHERE {who} AND state = 'idle'", {"a": app})
        assert len(idle) == 2, "premise: both pool connections of the drainer sit idle while its lanes wait"
        db.sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {who}", {"a": app})
        _wait_for("the backends to exit", lambda: not db.sql(f"SELECT 1 FROM pg_stat_activity WHERE {who}", {"a": app}))
        (tmp_path / "go").write_text("")  # lane A meets the dead connections and dies
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 3 and "lane died" in out, out  # premise: a lane crashed and set the shared cancel

    by_key = {t["cursor_key"]: t for t in task_rows(db, run.id)}
    assert [k for k, t in by_key.items() if t["status"] == "cancelled"] == [], "nobody stopped the run"
    sibling = by_key["companies:10"]
    assert (sibling["status"], sibling["attempts"], sibling["locked_by"]) == ("pending", 0, None), "released, attempt refunded"
    assert by_key["companies:0"]["status"] in ("running", "pending")  # the dead lane's: the reaper's
    assert runs.get_run(db, run.id).status == "running"

    time.sleep(0.3)
    report = reaper.sweep(db, REAPER_SETTINGS, lambda r: p)
    assert report.rearmed == []
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)  # another drainer (no holds in this process)
    done = runs.get_run(db, run.id)
    assert done.status == "succeeded", task_rows(db, run.id)
    assert {t["status"] for t in task_rows(db, run.id)} == {"succeeded"}
    _reconciles(db, run.id, 20)


def _drainer_killed_mid_page(db, db_url, tmp_path) -> tuple[Any, Any, int, list[dict]]:
    """A run whose drainer process was SIGKILLed while a task was running between two of its
    page's commits: (provider, run, the child's pid, the tasks left running)."""
    p = provider_for("example")
    # Pages of 300 rows are three set-based windows of 100 (CHILD_SET_WINDOW), 0.2 s each: the kill
    # lands between a page's first commit and its last (a 50-row page was one window, and the task
    # finished in the instant after it committed: CI's suite once never saw it running mid-page).
    opts = {"page_size": PAGE, "counts": {k: 2 * PAGE for k in KINDS}, "row_delay": 0.002}
    run = runs.start_run(db, p, "acme", options=opts, settings=FAST)
    child, app = _spawn(db_url, run.id, tmp_path, {}, pool=4)
    try:
        # frozen (SIGSTOP) once a running task has committed a window, then killed only if, read
        # after its backends went quiet, a task is still running mid-page: under load the task had
        # finished between the read and the kill, and the test saw no task left running
        for _ in range(50):
            _wait_for("a committed window of a running task", lambda: db.sql(
                "SELECT 1 FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'"
                " AND processed_offset >= 100", {"r": run.id}))
            os.kill(child.pid, signal.SIGSTOP)
            try:  # a statement of the frozen drainer may never end: one waiting on a lock its own
                # idle transaction holds, or a backend blocked sending rows to it - then thaw and retry
                _wait_for("the frozen drainer's statements to end", lambda: not db.sql(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = %(app)s AND state = 'active'",
                    {"app": app}), timeout=5.0)
            except AssertionError:
                os.kill(child.pid, signal.SIGCONT)
                continue
            if db.sql("SELECT 1 FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'"
                      " AND processed_offset > 0 AND processed_offset < %(page)s", {"r": run.id, "page": PAGE}):
                break
            os.kill(child.pid, signal.SIGCONT)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    # a COMMIT the child sent just before it died still completes in its backend: what it left is
    # read once its backends are gone, not while one may still move a task's offset
    _wait_for("the killed drainer's backends to end", lambda: not db.sql(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = %(app)s", {"app": app}))
    return p, run, child.pid, task_rows(db, run.id, status="running")


def test_a_sigkilled_drainer_is_finished_by_another_without_rewriting_committed_windows(db, db_url, tmp_path) -> None:
    p, run, _, killed = _drainer_killed_mid_page(db, db_url, tmp_path)
    assert killed and any(t["processed_offset"] > 0 for t in killed)

    db.sql("UPDATE migrations SET options = options - 'row_delay' WHERE id = %(r)s", {"r": run.id})
    time.sleep(0.3)
    report = reaper.sweep(db, REAPER_SETTINGS, lambda r: p)
    assert set(report.released) == {t["id"] for t in killed}
    example.WRITE_CALLS.clear()
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    _reconciles(db, run.id, 2 * PAGE)
    for t in killed:  # what a killed task committed is not written again by the task that resumes it
        start = int(t["cursor"]["start"])
        committed = {(t["kind"], str(i)) for i in range(start + 1, start + t["processed_offset"] + 1)}
        assert not committed & set(example.WRITE_CALLS), f"task {t['id']} rewrote committed rows"
        rest = {(t["kind"], str(i)) for i in range(start + t["processed_offset"] + 1, start + PAGE + 1)}
        assert rest <= set(example.WRITE_CALLS)


def test_a_relaunch_releases_a_sigkilled_drainers_tasks_at_once(db, db_url, tmp_path) -> None:
    """The relaunch of a tenant whose `migrate run` was kill -9'd must not sit silent (~110 s)
    while the dead process's task locks age to MIGRATE_STALE_LOCK_SECONDS: `runs.prepare`
    (every launch) releases the tasks of workers whose process is gone from this host at once
    (the child's threshold is 60 s here; nothing waits for it)."""
    p, run, pid, killed = _drainer_killed_mid_page(db, db_url, tmp_path)
    assert killed and all(t["locked_by"].split(":")[1] == str(pid) for t in killed)

    runs.prepare(db, run.id, p, Settings(lane_width=2, stale_lock_seconds=3600))
    after = {t["id"]: t for t in task_rows(db, run.id)}
    for t in killed:
        assert after[t["id"]]["status"] == "pending" and after[t["id"]]["locked_by"] is None, after[t["id"]]
        assert "process" in after[t["id"]]["error"] and "is gone" in after[t["id"]]["error"], after[t["id"]]["error"]
    db.sql("UPDATE migrations SET options = options - 'row_delay' WHERE id = %(r)s", {"r": run.id})
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    _reconciles(db, run.id, 2 * PAGE)


def test_tasks_of_a_live_process_or_of_another_host_are_not_released_early(db) -> None:
    import socket

    p = provider_for("example")
    run = runs.start_run(db, p, "acme", options={"page_size": 10, "counts": {k: 10 for k in KINDS}}, settings=FAST)
    tasks = task_rows(db, run.id)
    assert len(tasks) >= 2
    here_alive = f"{socket.gethostname()}:{os.getpid()}:abc123"  # this very process
    elsewhere = "another-host-entirely:1:abc123"
    for t, who in zip(tasks[:2], (here_alive, elsewhere)):
        db.sql("UPDATE migration_tasks SET status = 'running', locked_by = %(w)s, locked_at = now() WHERE id = %(id)s",
               {"w": who, "id": t["id"]})
    assert reaper.release_dead_here(db, run.id) == []
    assert {t["id"]: t["status"] for t in task_rows(db, run.id)}[tasks[0]["id"]] == "running"


# -- in process: what stopping means ------------------------------------------------------------------


def _held_worker(db, run_id: int, tmp_path: Path, monkeypatch) -> tuple[Worker, threading.Thread, dict]:
    monkeypatch.setitem(HOLD, "companies:0", "cancel")
    monkeypatch.setattr(sys.modules[__name__], "MARKERS", [tmp_path])
    worker = Worker(db, settings=FAST, providers=for_run)
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.update(result=worker.drain(run_id)))
    t.start()
    _wait_for("the task to be held", lambda: (tmp_path / "holding-companies:0").exists())
    return worker, t, out


def test_a_worker_shutting_down_releases_its_task_with_the_attempt_refunded(db, tmp_path, monkeypatch) -> None:
    run = runs.start_run(db, provider_for("held_example"), "acme", kinds=["companies"],
                         options={"page_size": 10, "counts": {"companies": 10}}, settings=FAST)
    worker, t, out = _held_worker(db, run.id, tmp_path, monkeypatch)
    worker.cancel.set()  # the process is going away; the run is not stopping
    t.join(timeout=30)
    assert out["result"].executed == {"released": 1}
    task = task_rows(db, run.id, cursor_key="companies:0")[0]
    assert (task["status"], task["attempts"], task["locked_by"]) == ("pending", 0, None)
    assert runs.get_run(db, run.id).status == "running"


def test_a_stop_of_the_run_cancels_the_task_it_lands_on(db, tmp_path, monkeypatch) -> None:
    run = runs.start_run(db, provider_for("held_example"), "acme", kinds=["companies"],
                         options={"page_size": 10, "counts": {"companies": 10}}, settings=FAST)
    worker, t, out = _held_worker(db, run.id, tmp_path, monkeypatch)
    runs.stop(db, run.id)  # what the Dagster face does on Terminate: the stop flag, then the Event
    worker.cancel.set()
    t.join(timeout=30)
    assert task_rows(db, run.id, cursor_key="companies:0")[0]["status"] == "cancelled"
    assert runs.get_run(db, run.id).status == "stopped"


def test_a_cancelled_task_in_a_running_run_holds_the_barrier_until_the_reaper_rearms_it(db) -> None:
    make_executions_table(db)
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 2}, settings=FAST)
    first, second = task_rows(db, run.id)
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id = %(i)s", {"i": first["id"]})
    db.sql("UPDATE migration_tasks SET status = 'cancelled', processed_offset = 7 WHERE id = %(i)s", {"i": second["id"]})
    assert reaper.advance(db, FAST, lambda r: p) == []
    assert Worker(db, settings=FAST, providers=for_run).drain(run.id).executed == {}
    assert runs.get_run(db, run.id).current_phase == 0, "the barrier did not walk past the cancelled task"

    report = reaper.sweep(db, FAST, lambda r: p)
    assert report.rearmed == [second["id"]]
    again = task_rows(db, run.id, id=second["id"])[0]
    assert (again["status"], again["processed_offset"]) == ("pending", 7)
    Worker(db, settings=FAST, providers=for_run).drain(run.id)
    assert runs.get_run(db, run.id).status == "succeeded"


def test_a_cancelled_task_of_a_stopped_run_is_left_for_resume(db) -> None:
    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0"], options={"tasks": 2}, settings=FAST)
    assert runs.stop(db, run.id).status == "stopped"
    assert reaper.sweep(db, FAST, lambda r: p).rearmed == []
    assert {t["status"] for t in task_rows(db, run.id)} == {"cancelled"}


def test_finalize_never_says_succeeded_while_a_task_is_not_succeeded(db) -> None:
    p = provider_for("counter")
    for tenant, other in (("a", "cancelled"), ("b", "pending"), ("c", "failed")):
        run = runs.start_run(db, p, tenant, kinds=["k0"], options={"tasks": 2}, settings=FAST)
        db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s", {"r": run.id})
        db.sql("UPDATE migration_tasks SET status = %(s)s WHERE id = (SELECT max(id) FROM migration_tasks WHERE migration_id = %(r)s)",
               {"s": other, "r": run.id})
        db.sql("UPDATE migrations SET current_phase = 1 WHERE id = %(r)s", {"r": run.id})
        assert db.fetch_one("finalize_run", {"run_id": run.id})["status"] == "failed", other


def test_a_phase_closing_with_a_failed_task_fails_the_run_and_seeds_nothing(db) -> None:
    from engine_core import barrier

    p = provider_for("counter")
    run = runs.start_run(db, p, "acme", kinds=["k0", "k1"], options={"tasks": 3}, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s", {"r": run.id})
    db.sql("UPDATE migration_tasks SET status = 'failed', error = 'boom' WHERE id = (SELECT max(id) FROM migration_tasks)")
    assert barrier.advance_phase(db, run.id, 0, p, FAST)
    failed = runs.get_run(db, run.id)
    assert (failed.status, failed.current_phase) == ("failed", 0) and failed.finished_at is not None
    assert task_rows(db, run.id, phase=1) == []
    log = db.sql("SELECT log FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["log"]
    assert [(e["kind"], e["count"], e["level"]) for e in log] == [("k0", 1, "error")]
    assert "phase 1 (k0)" in log[0]["reason"] and "boom" in log[0]["reason"]
    assert not barrier.advance_phase(db, run.id, 0, p, FAST), "fails once"


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
