"""An engine pause is not reported as a terminate, however the in-process run's watcher and the
phase op's own cancel interleave. The op pausing its run for a failing source marks its Dagster run
CANCELING and ends its step with the pause's one-line Failure; the watcher of a run executed in the
`migrate` process delivers an interrupt for a CANCELING run (the UI's Terminate). When the interrupt
landed between the CANCELING write and the Failure, the step ended "stopped by a terminate request",
the engine run's log said "stopped from Dagster", and the command said "stopped by a Terminate from
elsewhere", exit 3. The window is widened here (`slow_canceling/sitecustomize.py`: report_run_canceling
sleeps after writing) so the interleaving happens every run; the command must still end paused by
the engine, exit `output.SOURCE_FAILED`."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from migration_pipeline.cli import output
from tests.dagster.test_source_down_exit import run_while_the_source_goes_down

pytestmark = pytest.mark.timeout(420)

HOOK = Path(__file__).parent / "slow_canceling"


def test_a_pause_whose_cancel_meets_the_watcher_is_still_the_engines_pause(db_url, db, tmp_path):
    tenant = "paused"
    hooked = os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc, run, out, err = run_while_the_source_goes_down(db_url, tmp_path, tenant, SLOW_CANCELING_SECONDS="1.5",
                                                         PYTHONPATH=hooked)
    said = [ln for ln in (out + err).splitlines() if "resumes it" in ln]
    assert proc.returncode == output.SOURCE_FAILED, (proc.returncode, said, err[-3000:])
    assert len(said) == 1 and "paused by the engine: the source failed every request" in said[0], said
    assert "Terminate" not in said[0] and "from elsewhere" not in said[0], said
    engine = int(run.tags["migration/run_id"])
    (row,) = db.sql("SELECT log FROM migrations WHERE id = %(id)s", {"id": engine})
    reasons = [str(e.get("reason", "")) for e in row["log"] or []]
    assert any(r.startswith("paused: the source failed every request") for r in reasons), reasons
    assert not any(r.startswith("stopped ") for r in reasons), reasons  # no "stopped from Dagster (...)"
