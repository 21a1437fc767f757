"""After kill -9 of a worker, lane slots go to work that can proceed, and no run stays stopping
for ever (issue 10, a fresh user's find: Dagster's retry runs and drainer runs sat idle on all four
lane slots, waiting on tasks killed workers held, while other tenants queued behind them; and
`migrate stop` left a run `stopping` whose task's owner was dead).

Why they idled: a worker with nothing to claim waits while other workers hold running tasks
(they may seed successors), and a dead worker's task is released only by the reaper sensor's
sweep - every 300 s, after its lock is MIGRATE_STALE_LOCK_SECONDS old, and never without a daemon.

Real processes and SIGKILL on a real Postgres: a child process claims a task through the engine's
claim (as a run worker does) and is killed holding it. Then
* a drainer's slot (a turn) ends its turn at once, "nothing_to_claim", instead of waiting;
* a phase op's slot (until its phase closes) releases the dead worker's task itself once its lock
  is stale and closes the phase - no reaper tick involved;
* `runs.stop` on the run settles it `stopped` once the dead worker's lock is stale, and
  `migrate stop --force` waits for that and exits with the run stopped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine_core import runs
from engine_core.config import Settings
from engine_core.db import Database
from engine_core.providers.registry import provider_for
from migration_pipeline.lane.slot import drain_in_slot
from tests.engine.support import make_executions_table, task_rows

ROOT = Path(__file__).resolve().parents[2]
MIGRATE = str(Path(sys.executable).parent / "migrate")
pytestmark = pytest.mark.timeout(300)

CHILD = """
import sys, time
from engine_core.db import Database
from engine_core.claim import claim_next
import tests.engine.support  # registers the counter provider
db = Database(sys.argv[1], max_size=2)
claimed = claim_next(db, int(sys.argv[2]), "doomed-worker")
print("claimed", claimed[0].id if claimed else None, flush=True)
time.sleep(600)
"""


def _kill_a_worker_holding_a_task(db_url: str, run_id: int) -> int:
    """A real process claims the run's task and is SIGKILLed holding it; the task id."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, db_url, str(run_id)], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = child.stdout.readline().split()
        assert line[:1] == ["claimed"] and line[1] != "None", line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    return int(line[1])


def _start(db: Database, tasks: int = 1) -> int:
    make_executions_table(db)
    return runs.start_run(db, provider_for("counter"), "dead-owner", options={"tasks": tasks}).id


def _in_thread(fn):
    """Run fn on a thread; (thread, box) - a slot that never returns shows as a thread still alive."""
    box: dict = {}

    def go():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t, box


def _providers(run):
    return provider_for(run.source, run)


def test_a_drainer_slot_gives_its_turn_back_when_only_a_dead_worker_holds_work(db, db_url):
    run_id = _start(db)
    dead_task = _kill_a_worker_holding_a_task(db_url, run_id)
    settings = Settings(lane_width=2, stale_lock_seconds=600, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)
    t, box = _in_thread(lambda: drain_in_slot(db, run_id, settings=settings, providers=_providers, turn_seconds=120))
    t.join(90)
    assert not t.is_alive(), "the drainer's slot waited on a task a killed worker holds"
    assert "error" not in box, box.get("error")
    assert box["result"].reason == "nothing_to_claim"
    assert task_rows(db, run_id, id=dead_task)[0]["status"] == "running"  # not its to release: the lock is fresh


def test_a_phase_slot_releases_the_dead_workers_task_itself_and_closes_its_phase(db, db_url):
    run_id = _start(db)
    dead_task = _kill_a_worker_holding_a_task(db_url, run_id)
    settings = Settings(lane_width=2, stale_lock_seconds=3, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)
    t, box = _in_thread(lambda: drain_in_slot(db, run_id, settings=settings, providers=_providers,
                                              until_phase_closed=0))
    t.join(120)
    assert not t.is_alive(), "the phase's slot waited for a reaper tick that never comes"
    assert "error" not in box, box.get("error")
    assert box["result"].reason == "phase_closed"
    assert runs.get_run(db, run_id).current_phase >= 1
    row = task_rows(db, run_id, id=dead_task)[0]
    assert row["status"] == "succeeded" and row["locked_by"] != "doomed-worker"


def test_a_stop_settles_once_the_dead_workers_lock_is_stale(db, db_url):
    run_id = _start(db)
    _kill_a_worker_holding_a_task(db_url, run_id)
    settings = Settings(lane_width=2, stale_lock_seconds=2, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)
    assert runs.stop(db, run_id, Settings(lane_width=2, stale_lock_seconds=600)).status == "stopping"
    assert runs.stop_until_settled(db, run_id, settings).status == "stopped"
    assert not task_rows(db, run_id, status="running")


def test_migrate_stop_force_ends_a_run_whose_worker_died_stopped(db, db_url, tmp_path):
    from migration_pipeline.instance import to_url

    run_id = _start(db)
    _kill_a_worker_holding_a_task(db_url, run_id)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIGRATE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path), MIGRATE_STALE_LOCK_SECONDS="600",
               PYTHONPATH=str(ROOT))
    # the counter provider is registered by tests.engine.support: a sitecustomize-free way in
    cmd = [sys.executable, "-c", "import tests.engine.support, sys; from migration_pipeline.cli.main import main; "
                                 "sys.argv[0] = 'migrate'; main()"]
    out = subprocess.run([*cmd, "stop", "dead-owner"], env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stopping" in out.stdout and "--force" in out.stdout, out.stdout
    env["MIGRATE_STALE_LOCK_SECONDS"] = "3"
    out = subprocess.run([*cmd, "stop", "dead-owner", "--force"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1].endswith(": stopped"), out.stdout
    assert runs.get_run(db, run_id).status == "stopped"
