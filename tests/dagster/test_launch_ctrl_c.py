"""Ctrl-C while `migrate run` prints its results, after the run succeeded (issue 10's leftover): it
was click's "Aborted!" with exit code 1 after a success. The run has ended and the daemon is
stopped by then: the tables are cut short, the verdict line is printed, the code is the run's."""
from __future__ import annotations

import os
import signal
import time

import pytest

from migration_pipeline.cli.launching import emit_outcome


@pytest.mark.parametrize("signo", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_results_print_keeps_the_runs_verdict_and_code(signo, capsys):
    printed: list[str] = []

    def render() -> None:
        printed.append("per-phase results (first rows)")
        os.kill(os.getpid(), signo)  # the user's Ctrl-C (or a kill) in the middle of the tables
        time.sleep(5)
        printed.append("the rest of the tables")

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # SIG_IGN on an xdist worker
    started = time.monotonic()
    code = emit_outcome(False, {}, render, "Dagster run r1: SUCCESS", ok=True)
    assert code == 0 and time.monotonic() - started < 4
    assert printed == ["per-phase results (first rows)"]
    assert "Dagster run r1: SUCCESS" in capsys.readouterr().out
    assert {s: signal.getsignal(s) for s in before} == before, "the handlers are restored"


def test_a_failed_run_keeps_its_code_too(capsys):
    def render() -> None:
        raise KeyboardInterrupt

    assert emit_outcome(False, {}, render, "Dagster run r2: FAILURE", ok=False) == 1
    assert "Dagster run r2: FAILURE" in capsys.readouterr().out
