"""A run's elapsed time is the time it was running (`runs_reads.active_seconds`): a run stopped for
a day and then resumed has not run for a day. The spans it spent stopped (or failed, or ended) are
counted apart as it is reopened (`stopped_seconds`, migration 0023)."""
from __future__ import annotations

from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.runs_reads import active_seconds
from engine_core.worker import drain_threads
from tests.engine.support import FAST

OPTS = {"page_size": 10, "counts": {"companies": 20, "contacts": 20, "deals": 20, "activities": 20, "notes": 20}}
DAY = 86_400


def _row(db, run_id: int) -> dict:
    return db.fetch_one("get_run", {"run_id": run_id})


def test_a_run_stopped_for_a_day_then_resumed_counts_only_its_running_time(db):
    provider = provider_for("example")
    run = runs.start_run(db, provider, "paused", options=OPTS, settings=FAST)
    assert runs.stop(db, run.id, FAST).status == "stopped"
    # it ran ten seconds, then stayed stopped for a day
    db.sql("UPDATE migrations SET started_at = now() - interval '1 day 10 seconds',"
           " finished_at = now() - interval '1 day' WHERE id = %(r)s", {"r": run.id})
    assert 9 < active_seconds(_row(db, run.id)) < 11
    runs.resume(db, run.id, provider, FAST)
    assert DAY - 60 < float(_row(db, run.id)["stopped_seconds"]) < DAY + 60
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    row = _row(db, run.id)
    assert row["status"] == "succeeded"
    wall = (row["finished_at"] - row["started_at"]).total_seconds()
    assert wall > DAY and active_seconds(row) < wall - DAY + 1  # the day stopped is not counted


def test_a_run_never_stopped_counts_its_whole_span(db):
    run = runs.start_run(db, provider_for("example"), "straight", options=OPTS, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    row = _row(db, run.id)
    assert float(row["stopped_seconds"]) == 0
    assert active_seconds(row) == (row["finished_at"] - row["started_at"]).total_seconds()
