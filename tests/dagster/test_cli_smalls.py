"""Small finds of a fresh user, each one line:

* a Pipedrive base URL ending in an API version path (`.../v1`, as Pipedrive's reference writes its
  URLs) is refused before anything is launched, saying to drop it and giving the URL to use (it had
  been "HTTP 404" with no hint);
* the sandbox's `--live-mix` help names every live op there is (it listed the older seven);
* `migrate run`'s progress: a bar says what is retrying on the open phases only, a closed phase's
  bar its average rows/s (or no rate), the bars end with the run's last figures, and a resumed
  run's phase has one line, not "stopped" then "running".
"""
from __future__ import annotations

import io
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console

from engine_core import runs
from engine_core.progress import PhaseMeter, ProgressBoard, SourceMetrics
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline.cli import progress as cli_progress
from migration_pipeline.instance import to_url

from pipedrive_sandbox.config import LIVE_OPS
from tests.dagster.test_cli_errors import _migrate_in_process, _nothing_launched, _one_line_error, run_env  # noqa: F401
from tests.engine.support import FAST
from tests.pipedrive.support import TOKEN, sandbox


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/api/v2"])
def test_a_base_url_ending_in_an_api_version_is_told_to_drop_it(db_url, run_env, suffix):  # noqa: F811
    with sandbox() as sb:
        env = {**run_env, "PIPEDRIVE_BASE_URL": sb.base_url + suffix, "PIPEDRIVE_API_TOKEN": TOKEN}
        line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), "PIPEDRIVE_BASE_URL")
    assert f"ends in {suffix.rstrip('/')}, which the client adds itself" in line, line
    assert line.endswith(f"drop it, PIPEDRIVE_BASE_URL={sb.base_url}"), line
    _nothing_launched(db_url)


def test_the_live_mix_help_names_every_live_op():
    out = subprocess.run([sys.executable, "-m", "pipedrive_sandbox", "--help"], capture_output=True, text=True,
                         timeout=60)
    text = " ".join(out.stdout.split())
    said = text.split("--live-mix MIX ")[-1].split(" --")[0]  # the option's help, up to the next option
    found = re.search(r"over the ops (.*?) \(default", said)
    assert found and set(found[1].split(", ")) == set(LIVE_OPS), said


def test_the_bars_say_retrying_on_open_phases_only_and_a_closed_phases_rate_is_its_average(db):
    # a fresh user's find: "| retrying 1x ReadTimeout" on every phase's bar, finished ones included,
    # and "0 rows/s" on each finished phase
    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "bars", options=opts, settings=FAST)
    shown = io.StringIO()
    retrying = SourceMetrics()
    retrying.retrying("ReadTimeout", 3600)  # in progress for the whole test
    with ProgressBoard(run.id, runs.get_run(db, run.id).plan, console=Console(file=shown, width=300)) as board:
        board._meters[0] = PhaseMeter(db, run.id, 0, ["companies"], metrics=retrying)
        board.update(db)  # phase 1 open: its bar says what is retrying
        assert "retrying 1x ReadTimeout" in board.progress.tasks[0].fields["figures"]
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        board.update(db)
    bars = [line for line in shown.getvalue().splitlines() if line.startswith("phase ")]
    assert len(bars) == 5, shown.getvalue()
    assert not any("retrying" in bar or " 0 rows/s" in bar for bar in bars), bars
    assert re.search(r"\| \d+ rows/s average$", bars[0]), bars[0]  # seen open, then closed: its average
    assert not any("rows/s" in bar for bar in bars[1:]), bars  # closed when first seen: no rate


def test_a_resumed_runs_progress_lines_say_its_phase_once(db, db_url, monkeypatch):
    # a fresh user's find: after a resume the phase's line was printed twice, "stopped" (the stop
    # being resumed) then "running"
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "again", options=opts, settings=FAST)
    runs.stop(db, run.id, FAST)
    shown = io.StringIO()
    monkeypatch.setattr(cli_progress, "console", Console(file=shown, width=300))
    ticks = cli_progress.Progress(False)
    dagster_run = SimpleNamespace(tags={"migration/run_id": str(run.id)}, status=SimpleNamespace(value="STARTED"),
                                  run_id="r")
    try:
        ticks(dagster_run)  # the launch's first tick: the op has not resumed the run yet
        runs.resume(db, run.id, provider_for("example"), FAST)
        ticks(dagster_run)
    finally:
        ticks.close()
    lines = [line for line in shown.getvalue().splitlines() if "phase 1/" in line]
    assert len(lines) == 1 and " running: " in lines[0], shown.getvalue()


def test_the_bars_end_with_the_runs_last_figures(db, db_url, monkeypatch):
    # the last phase's bar had kept the last tick's figures ("tasks 7/8 | 0 rows/s") once the run ended
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "ended", options=opts, settings=FAST)
    shown = io.StringIO()
    monkeypatch.setattr(cli_progress, "console", Console(file=shown, width=300, force_terminal=True))
    ticks = cli_progress.Progress(False)
    try:
        ticks(SimpleNamespace(tags={"migration/run_id": str(run.id)}, status=SimpleNamespace(value="STARTED"), run_id="r"))
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    finally:
        ticks.close()
    last = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", shown.getvalue()).rsplit("phase 1/5", 1)[1]
    assert "phase 5/5 notes" in last and "5 seen 5 imported" in last.split("phase 5/5 notes")[1], last
