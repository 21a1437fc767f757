"""A terminate landing while a phase op waits for its ledger checks - after its materialisation was
yielded, its checks' queries still running on their thread - ends the step with the phase op's
one-line Failure ("stopped by a terminate request; relaunch resumes engine run N"), the engine run
stopped and the Dagster run CANCELED, as one landing in the drain does - not with
DagsterExecutionInterruptedError's stack trace raised from the wait, outside the op's stop handling.

Deterministic and real: a real engine run on real Postgres, a real Dagster run of the phase assets
executed as a run worker does (`execute_run`, the project's executor), and the terminate the UI
makes (the run marked CANCELING, then the interrupt Dagster sends the run worker's main thread),
made by the first phase's checks once the op's main thread is seen waiting for them; the checks'
own evaluation is the real one.
"""
from __future__ import annotations

import _thread
import sys
import threading
import time
from typing import Any

import pytest
from dagster import DagsterEventType, DagsterRunStatus, Definitions
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.execution.api import execute_run

from engine_core import runs
from migration_pipeline import tags
from migration_pipeline.assets import phases
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.lane.executors import stopping_in_process_executor
from tests.dagster.support import resources, tmpfs_instance

pytestmark = pytest.mark.timeout(180)
TINY = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def _waiting_for_checks(main: threading.Thread) -> bool:
    """Whether `main` is blocked in the phase op's wait for its checks (`Future.result` in `phase_step`)."""
    frame = sys._current_frames().get(main.ident)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return "result" in names and "phase_step" in names and names.index("result") < names.index("phase_step")


def test_a_terminate_while_the_op_waits_for_its_checks_ends_the_step_in_one_line(db, engine_url, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", engine_url)  # the run worker's engine database
    job = Definitions(assets=build_phase_assets("example"), resources=resources(engine_url, options=TINY),
                      executor=stopping_in_process_executor()).resolve_implicit_global_asset_job_def()
    main, terminated = threading.current_thread(), []
    evaluate = phases.evaluate_ledger_checks

    with tmpfs_instance() as instance:
        instance.add_dynamic_partitions("tenants", ["checked"])
        launched = instance.create_run_for_job(job_def=job, tags={tags.PARTITION: "checked"})

        def slow_checks(db_: Any, tenant: str, spec: Any, selected: set[str]) -> Any:
            evaluations = evaluate(db_, tenant, spec, selected)
            if spec.index == 0 and not terminated:
                deadline = time.monotonic() + 60
                while not _waiting_for_checks(main) and time.monotonic() < deadline:
                    time.sleep(0.01)
                terminated.append(_waiting_for_checks(main))
                instance.report_run_canceling(instance.get_run_by_id(launched.run_id))  # the UI's terminate
                _thread.interrupt_main()  # what Dagster's terminate sends the run worker's main thread
            return evaluations

        monkeypatch.setattr(phases, "evaluate_ledger_checks", slow_checks)
        try:
            execute_run(InMemoryJob(job), instance.get_run_by_id(launched.run_id), instance)
        except (DagsterExecutionInterruptedError, KeyboardInterrupt):
            pass  # Dagster re-raised the interrupt to its caller: the events below say how the step ended

        assert terminated == [True], "the terminate was not made while the op waited for its checks"
        run = instance.get_run_by_id(launched.run_id)
        assert run.status == DagsterRunStatus.CANCELED, run.status
        engine = run.tags[tags.ENGINE_RUN]
        failures = [r.event_log_entry.dagster_event for r in instance.get_records_for_run(
            launched.run_id, of_type=DagsterEventType.STEP_FAILURE).records]
        assert [e.step_key for e in failures] == ["example__phase_1_companies"], [e.step_key for e in failures]
        error = failures[0].event_specific_data.error
        assert error.cls_name == "Failure", error.to_string()  # not DagsterExecutionInterruptedError
        assert failures[0].event_specific_data.user_failure_data.description == (
            f"stopped by a terminate request; relaunch resumes engine run {engine}")
    assert runs.get_run(db, int(engine)).status in ("stopping", "stopped")
