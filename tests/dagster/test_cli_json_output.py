"""`--json` as a script reads it, and the progress lines as a user reads them (a fresh user's finds):

* `migrate run --json`: stdout is the JSON document alone, stderr the launch line and the same
  progress lines the plain command prints (there had been none), and the document's `message` is
  the verdict line the plain command ends with (it had been "");
* every phase gets its progress line, the first one too when it closed before the command's first
  tick (the lines had started at the phase the first tick saw);
* an error under --json (an unknown tenant, a MIGRATE_HOME without a database, a bad setting, a
  bad tenant name) is also `{"error": "<the line>"}` on stdout, one line; stderr and the exit
  code (2) are as without --json.
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
from tests.dagster.test_cli_errors import UNREACHABLE, _env, _migrate, _migrate_in_process, run_env  # noqa: F401
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


def _json_error(out, *needles: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert line.startswith("error: "), out.stderr
    (doc,) = [ln for ln in out.stdout.splitlines() if ln.strip()]  # one line: JSON Lines' `rows --json` too
    assert json.loads(doc) == {"error": line.removeprefix("error: ")}, (doc, line)
    for needle in needles:
        assert needle in line, line
    return line


def test_an_error_under_json_is_a_json_document_on_stdout_as_well(db_url, run_env, tmp_path):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _json_error(_migrate_in_process(["status", "nosuch", "--json"], env), "'nosuch'")
    _json_error(_migrate_in_process(["rows", "nosuch", "--json"], env), "'nosuch'")
    _json_error(_migrate_in_process(["run", "--tenant", "bad name", "--json"], env), "not a valid tenant name")
    # the group's check of the settings, before the command has parsed its flags
    bad = _env(DATABASE_URL=UNREACHABLE, MIGRATE_HOME=str(tmp_path), MIGRATE_LANE_WIDTH="lots")
    _json_error(_migrate_in_process(["run", "--tenant", "x", "--source", "example", "--json"], bad), "MIGRATE_LANE_WIDTH")
    # a MIGRATE_HOME without an embedded database: refused, none made
    home = _env(MIGRATE_HOME=str(tmp_path / "nothing-here"))
    _json_error(_migrate_in_process(["status", "acme", "--json"], home), "no embedded database under")
    # without --json stdout stays empty: the line is on stderr alone
    plain = _migrate_in_process(["status", "nosuch"], env)
    assert plain.returncode == 2 and plain.stdout == "" and plain.stderr.startswith("error: "), plain
