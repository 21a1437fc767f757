"""`--json` as a script reads it, and the progress lines as a user reads them (a fresh user's finds):

* `migrate run --json`: stdout is the JSON document alone, stderr the launch line and the same
  progress lines the plain command prints (there had been none), and the document's `message` is
  the verdict line the plain command ends with (it had been "");
* every phase gets its progress line, the first one too when it closed before the command's first
  tick (the lines had started at the phase the first tick saw);
"""
from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline.cli import progress as cli_progress
from migration_pipeline.instance import to_url
from tests.dagster.test_cli_errors import _migrate, run_env  # noqa: F401
from tests.engine.support import FAST

pytestmark = pytest.mark.timeout(180)


def test_run_json_keeps_stdout_to_the_document_and_shows_its_progress_on_stderr(run_env):
    out = _migrate(["run", "--tenant", "scripted", "--source", "example", "--json"], run_env, timeout=150)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    doc = json.loads(out.stdout)  # the whole of stdout is one JSON document
    assert doc["dagster_status"] == "SUCCESS", doc
    assert doc["message"].startswith("tenant 'scripted': run #") and " succeeded, 0 row(s) skipped, 0 failed" in \
        doc["message"], doc["message"]
    assert doc["failure"] == "", doc
    err = out.stderr.splitlines()
    assert any(line.startswith("launched Dagster run ") for line in err), out.stderr
    phases = len(doc["phases"])
    for n in range(1, phases + 1):  # the plain command's lines, one or more a phase
        assert any(line.startswith(f"  phase {n}/{phases} (") for line in err), (n, out.stderr)
    assert not any(line.startswith("  phase ") for line in out.stdout.splitlines()), out.stdout


def test_the_first_progress_line_names_the_phases_that_closed_before_it(db, db_url, monkeypatch):
    # a phase 1 of a few rows closed before the launch's first tick: the lines began at phase 2
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "quick", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)  # every phase closed before the first tick
    shown = io.StringIO()
    monkeypatch.setattr(cli_progress, "console", Console(file=shown, width=300))
    ticks = cli_progress.Progress(False)
    try:
        ticks(SimpleNamespace(tags={"migration/run_id": str(run.id)}, status=SimpleNamespace(value="SUCCESS"),
                              run_id="r"))
    finally:
        ticks.close()
    lines = [line.strip() for line in shown.getvalue().splitlines() if line.strip()]
    assert [line.split(" (")[0] for line in lines] == [f"phase {n}/5" for n in range(1, 6)], lines
    assert lines[0].startswith("phase 1/5 (companies) closed: ") and "companies 20 imported" in lines[0], lines
    assert " succeeded: " in lines[-1], lines
