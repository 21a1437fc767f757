"""`migrate status TENANT` fits the width it is given:

* piped (not a terminal) with COLUMNS set, its rows are at most COLUMNS wide (they were laid out in
  220 columns whatever COLUMNS said: 150-column rows under COLUMNS=80); without COLUMNS a pipe
  still gets the wide layout;
* a kind's name is never wrapped or cut ("organization" / "s" on an 80-column terminal): the tasks
  fold, then the least important columns are left out (the caption names them), down to kind,
  what it would import and failed; the cells under each header are that header's.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import drain_threads
from migration_pipeline.instance import to_url

pytestmark = pytest.mark.timeout(120)
MIGRATE = str(Path(sys.executable).parent / "migrate")
PLAN = [["fields", "users", "pipelines"], ["organizations", "stages"], ["persons"],
        ["deals", "deals_archived", "leads", "leads_archived"], ["activities"], ["notes"], ["emails"], ["catchup"]]


def _rollup(dry_run: bool) -> SimpleNamespace:
    """What print_rollup reads of an engine rollup: a pipedrive run's kinds, six-digit counts."""
    kinds = [SimpleNamespace(phase=i, kind=k, tasks={"succeeded": 12, "failed": 1}, seen=123456, imported=120000,
                             matched=2000, already_here=1456, updated=345, skipped=12, waiting=4, failed=3, deleted_at_source=7,
                             caught_up={}, left={})
             for i, group in enumerate(PLAN) for k in group]
    return SimpleNamespace(name="run #12 (pipedrive for tenant 'acme')", status="succeeded", dry_run=dry_run,
                           current_phase=len(PLAN), phases=PLAN, kinds=kinds, incomplete=[], unfinished=[], reasons=[],
                           seconds=12.5, stopped_seconds=0.0, tasks={"succeeded": 200})


@pytest.mark.parametrize("width", [80, 60, 40])
def test_the_kinds_table_fits_the_width_with_every_kind_name_whole(width):
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.tables import print_rollup

    saved = console.width
    console.width = width
    try:
        with console.capture() as captured:
            print_rollup(_rollup(dry_run=True))
    finally:
        console.width = saved
    text = captured.get()
    assert all(len(line) <= width for line in text.splitlines()), text
    for group in PLAN:
        for kind in group:
            assert re.search(rf"^│ {kind} +│", text, re.M), (kind, text)
    # the cell under "would import" is the count it would import, also when the tasks are left out
    assert re.search(r"^│ organizations +│ (.*│ )?120000 │", text, re.M), text
    assert "1 failed" in text or "tasks" in text.split("left out at")[1], text


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k not in ("DATABASE_URL", "COLUMNS")}
    env.update(extra)
    return env


def test_piped_status_respects_columns(db, db_url, tmp_path):
    run = runs.start_run(db, provider_for("example"), "narrow", dry_run=True,
                         options={"page_size": 20, "counts": {"companies": 30, "contacts": 20, "deals": 10,
                                                              "activities": 10, "notes": 10}})
    drain_threads(db, run.id, width=2, providers=for_run)
    env = _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"))
    narrow = subprocess.run([MIGRATE, "status", "narrow"], env={**env, "COLUMNS": "80"}, capture_output=True,
                            text=True, timeout=60)
    assert narrow.returncode == 0, narrow.stderr[-2000:]
    lines = narrow.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, narrow.stdout
    assert any(re.match(r"│ activities +│", line) for line in lines), narrow.stdout
    wide = subprocess.run([MIGRATE, "status", "narrow"], env=env, capture_output=True, text=True, timeout=60)
    assert wide.returncode == 0, wide.stderr[-2000:]
    assert max(len(line) for line in wide.stdout.splitlines()) > 80, wide.stdout  # no COLUMNS: the wide layout
