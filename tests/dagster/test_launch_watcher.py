"""The in-process run's watcher thread (`launch.InProcessRun._watch`) survives a progress callback
that raises SystemExit (or any BaseException but KeyboardInterrupt): it says so once on `err` and
keeps watching, so a stop signal recorded afterwards is still acted on. Such an exception had ended
the thread silently, and with it the command's handling of SIGINT/SIGTERM (the watcher acts on them).
"""
from __future__ import annotations

import io
import signal
import threading
import time
from types import SimpleNamespace

from dagster import DagsterRunStatus

from migration_pipeline.launch.in_process import InProcessRun


class _Instance:
    """What the watcher reads of the instance: the run, STARTED."""

    def get_run_by_id(self, run_id: str) -> SimpleNamespace:
        return SimpleNamespace(run_id=run_id, status=DagsterRunStatus.STARTED, tags={})


def test_a_progress_callback_raising_system_exit_does_not_end_the_watcher():
    ticks = []

    def progress(run) -> None:
        ticks.append(run.run_id)
        raise SystemExit(1)  # what rich's console raised on a closed pipe, from whichever thread printed

    err = io.StringIO()
    watched = InProcessRun(_Instance(), "r1", on_tick=progress, err=err, poll=0.02)
    watched._wake, watched._done = threading.Event(), threading.Event()
    stopped = threading.Event()
    watched._stop_run = stopped.set  # what a stop signal leads to (the run CANCELING, the engine run stopped)
    watcher = threading.Thread(target=watched._watch, daemon=True)
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while len(ticks) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(ticks) >= 5 and watcher.is_alive(), (len(ticks), watcher.is_alive())
        watched.signalled = int(signal.SIGTERM)  # what the guard records on SIGTERM
        assert stopped.wait(5), "the watcher no longer acts on a stop signal"
    finally:
        watched._done.set()
        watched._wake.set()
        watcher.join(5)
    assert err.getvalue().count("SystemExit") == 1, err.getvalue()  # said once, not every tick
