"""`migrate status` counts a run's running time, not the time it stood stopped:

* its "elapsed" line and `--json`'s `seconds` leave out the spans it spent stopped before it was
  resumed (`runs_reads.active_seconds`), the line saying so and `--json` giving `stopped_seconds`;
* the ETA extrapolates the running time (a run stopped for a day and resumed is not four days from
  done), and an open phase's pace is no slower than the run's running time allows;
* `migrate stop` says in the run's log that it stopped the run, so `status` names it among the
  reasons, as it names a terminate from Dagster.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from engine_core import progress, runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.engine.support import FAST

pytestmark = pytest.mark.timeout(180)
OPTS = {"page_size": 10, "counts": {"companies": 20, "contacts": 20, "deals": 20, "activities": 20, "notes": 20}}
DAY = 86_400


def _stopped_a_day_then_resumed(db, tenant: str) -> int:
    provider = provider_for("example")
    run = runs.start_run(db, provider, tenant, options=OPTS, settings=FAST)
    assert runs.stop(db, run.id, FAST).status == "stopped"
    # it ran ten seconds, then stayed stopped for a day
    db.sql("UPDATE migrations SET started_at = now() - interval '1 day 10 seconds',"
           " finished_at = now() - interval '1 day' WHERE id = %(r)s", {"r": run.id})
    runs.resume(db, run.id, provider, FAST)
    return run.id


def test_status_elapsed_leaves_out_the_day_the_run_stood_stopped(db, run_env):  # noqa: F811
    run_id = _stopped_a_day_then_resumed(db, "overnight")
    drain_threads(db, run_id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, run_id).status == "succeeded"

    out = _migrate_in_process(["status", "overnight", "--source", "example"], run_env)
    assert out.returncode == 0, out.stderr[-2000:]
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("elapsed ")]
    seconds = float(line.split()[1].removesuffix("s"))
    assert seconds < 3600, line  # ten seconds and the drain, not a day
    assert " running (stopped 24h00m, not counted); tasks: " in line, line

    doc = json.loads(_migrate_in_process(["status", "overnight", "--source", "example", "--json"], run_env).stdout)
    assert doc["seconds"] < 3600, doc["seconds"]
    assert DAY - 60 < doc["stopped_seconds"] < DAY + 60, doc["stopped_seconds"]


def test_a_run_never_stopped_says_its_elapsed_time_plainly(db, run_env):  # noqa: F811
    run = runs.start_run(db, provider_for("example"), "straight", options=OPTS, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    out = _migrate_in_process(["status", "straight", "--source", "example"], run_env)
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith("elapsed ")]
    assert "running" not in line and "not counted" not in line, line
    doc = json.loads(_migrate_in_process(["status", "straight", "--source", "example", "--json"], run_env).stdout)
    assert doc["stopped_seconds"] == 0


def test_the_eta_extrapolates_the_running_time_not_the_day_stopped(db):
    run_id = _stopped_a_day_then_resumed(db, "eta")
    # its first phase closed before the stop (as the barrier leaves it): a share done, the rest to go
    db.sql("UPDATE migrations SET current_phase = 1 WHERE id = %(r)s", {"r": run_id})
    done = progress.run_progress(db, run_id)
    assert 0 < done["percent"] < 100, done
    # ten seconds for its share done: minutes to go at most, not days
    assert done["eta_seconds"] is not None and done["eta_seconds"] < 3600, done


def test_an_open_phases_pace_is_no_slower_than_the_runs_running_time():
    phase = {"started": datetime.now(timezone.utc) - timedelta(days=1, seconds=10), "weight": 1.0, "done": 0.5}
    now = datetime.now(timezone.utc).timestamp()
    # the phase began a day ago, but the run has run ten seconds since: half done in ten seconds
    assert progress._paced_eta(phase, 0.5, now, run_ran=10.0) == 10.0


def test_migrate_stop_is_named_in_the_runs_reasons(db, run_env):  # noqa: F811
    run = runs.start_run(db, provider_for("example"), "halted", options=OPTS, settings=FAST)
    out = _migrate_in_process(["stop", "halted", "--source", "example"], run_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert runs.get_run(db, run.id).status == "stopped"
    doc = json.loads(_migrate_in_process(["status", "halted", "--source", "example", "--json"], run_env).stdout)
    said = [g for g in doc["reasons"] if g["kind"] == "run"]
    assert [(g["action"], g["example"]) for g in said] == [("info", "stopped by `migrate stop`")], doc["reasons"]
    # a second stop of the stopped run stops nothing, and says nothing more
    _migrate_in_process(["stop", "halted", "--source", "example"], run_env)
    doc = json.loads(_migrate_in_process(["status", "halted", "--source", "example", "--json"], run_env).stdout)
    assert [g for g in doc["reasons"] if g["kind"] == "run"] == said, doc["reasons"]


def test_migrate_stop_of_a_failed_run_stops_nothing_and_claims_no_stop(db, run_env):  # noqa: F811
    run = runs.start_run(db, provider_for("example"), "broken", options=OPTS, settings=FAST)
    db.sql("UPDATE migrations SET status = 'failed', finished_at = now() WHERE id = %(r)s", {"r": run.id})
    _migrate_in_process(["stop", "broken", "--source", "example"], run_env)
    assert runs.get_run(db, run.id).status == "failed"
    doc = json.loads(_migrate_in_process(["status", "broken", "--source", "example", "--json"], run_env).stdout)
    assert not [g for g in doc["reasons"] if "migrate stop" in str(g.get("example"))], doc["reasons"]
