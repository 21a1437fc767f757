"""A phase's rows/s (its materialisation's `phase_seconds` and `rows_per_second`) is over the time
Dagster runs worked on the engine run: a run terminated mid-phase, left stopped for a while and
launched again does not count the stopped time (it had: from the phase's first task start to its
last finish). Real: a real Dagster run terminated while writing, a real relaunch resuming it."""
from __future__ import annotations

import threading
import time

import pytest
from dagster import AssetKey, DagsterRunStatus

from engine_core import runs, runs_reads
from tests.dagster.support import materialize_tenant, resources
from tests.dagster.test_ui_leftovers import TINY, _runs_of, _terminate_while_draining

pytestmark = pytest.mark.timeout(240)
STOPPED_SECONDS = 3.0  # the phase_seconds bound keeps 2 s between counting it and not (tolerance 1 s)


def test_rows_per_second_leaves_out_the_time_the_run_was_stopped(instance, engine_url, db):
    slow_contacts = {"page_size": 20, "counts": {**TINY["counts"], "contacts": 70}, "row_delay": 0.03}
    done = threading.Event()
    terminator = threading.Thread(target=_terminate_while_draining, args=(instance, db, "paused", "contacts", done))
    terminator.start()
    try:
        first = materialize_tenant(instance, "paused", resources(engine_url, options=slow_contacts))
    finally:
        done.set()
        terminator.join()
    assert instance.get_run_by_id(first.run_id).status == DagsterRunStatus.CANCELED
    (run_id,) = _runs_of(db, "paused")
    time.sleep(STOPPED_SECONDS)  # the tenant stays stopped
    again = materialize_tenant(instance, "paused", resources(engine_url, options=slow_contacts), raise_on_error=True)
    assert runs.get_run(db, run_id).status == "succeeded"
    (contacts,) = [m for m in again.asset_materializations_for_node("example__phase_2_contacts")
                   if m.asset_key == AssetKey(["example", "phase_2_contacts"])]
    md = contacts.metadata
    groups = [g for g in runs_reads.task_groups(db, run_id) if g["kind"] == "contacts"]
    span = (max(g["last_finished"] for g in groups) - min(g["first_started"] for g in groups)).total_seconds()
    assert span > STOPPED_SECONDS, span
    seconds = md["phase_seconds"].value
    assert seconds <= span - STOPPED_SECONDS + 1.0, (seconds, span)
    seen = sum(int(g["seen"]) for g in groups)
    assert md["rows_per_second"].value == pytest.approx(seen / seconds, rel=0.02, abs=0.1)
