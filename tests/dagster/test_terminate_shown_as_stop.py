"""A real Terminate (the webserver's call: `run_coordinator.cancel_run` -> the run launcher) on a
`migrate run` mid-phase is shown as the stop it is, as far as Dagster 1.13 allows: the run ends
CANCELED (never FAILURE), and the phase step that was draining ends with a `dagster.Failure` whose
description is one line saying how to resume - not DagsterExecutionInterruptedError with the
interrupt's trace through the drain. What Dagster does not allow: a step has no CANCELED status
(a step ends SUCCESS, FAILURE or SKIPPED), and a raised Failure's event keeps the few frames between
Dagster's step boundary and the raise (the event is written when it is made, before any executor
sees it)."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from dagster import DagsterEventType, DagsterRunStatus

from tests.dagster.test_launch_in_process import (MIGRATE, _engine_status, _instance, _started_and_attached,  # noqa: F401
                                                  _until, slow_account, slow_env)

pytestmark = pytest.mark.timeout(300)


def test_a_real_terminate_ends_the_run_canceled_and_the_step_in_one_line(slow_env, db_url):
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "ui-stop", "--timeout", "240"], env=slow_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    instance = _instance(slow_env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, "ui-stop"), proc=proc)
        time.sleep(1.0)  # inside the first phase's drain
        assert instance.run_coordinator.cancel_run(run.run_id)
        out, err = proc.communicate(timeout=120)
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.CANCELED, (out[-2000:], err[-2000:])
        engine = run.tags["migration/run_id"]
        assert _engine_status(db_url, engine) in ("stopping", "stopped")
        events = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(run.run_id).records
                  if r.event_log_entry.dagster_event is not None]
        kinds = [e.event_type for e in events]
        assert DagsterEventType.RUN_FAILURE not in kinds and DagsterEventType.RUN_CANCELED in kinds, kinds
        failures = [e for e in events if e.event_type == DagsterEventType.STEP_FAILURE]
        assert len(failures) == 1, [e.step_key for e in failures]
        data = failures[0].event_specific_data
        assert data.error.cls_name == "Failure", data.error.cls_name  # not DagsterExecutionInterruptedError
        assert data.user_failure_data.description == f"stopped by a terminate request; relaunch resumes engine run {engine}"
        assert "\n" not in data.error.message.strip() and data.error.cause is None and data.error.context is None
        assert not any("slot.py" in frame or "drain" in frame for frame in data.error.stack), data.error.stack
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()
