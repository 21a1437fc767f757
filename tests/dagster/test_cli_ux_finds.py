"""What the CLI's tables, `migrate db` and the phase metadata say where a reader took them wrong:

* a dry run's phase assets read "materialized" (data written): the launch's per-phase table says
  "dry run: nothing written", and each phase materialisation's metadata opens with `dry_run_note`;
* `migrate status`'s table numbers a running run's phase as its --json does, in the run's own plan,
  with the phase asset's number beside it where they differ (a run of users alone: "2/2 (phase
  asset 9/9)", where it had said 9/9 beside the JSON's two phases);
* a reason group's example sentence is the reason of its first sample id (it was the group's
  alphabetically least reason, another row's: "e.g. 1.2 KiB" beside the id of a 8.8 KiB file);
* `migrate status`'s overview names a "waiting" column in its title only when it has one (no row
  waits: the column is left out, and the title had still named it);
* `migrate db stop` while a `migrate ui` of the same MIGRATE_HOME serves is refused in one line
  naming it (it had stopped the UI's database silently); --force stops it all the same;
* `migrate db url` where MIGRATE_HOME holds no embedded database (outside the project's root) says
  where it looked in one line and starts none (it had started an empty server there silently).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads

pytestmark = pytest.mark.timeout(120)
SMALL = {"page_size": 20, "counts": {"companies": 30, "contacts": 20, "deals": 10, "activities": 10, "notes": 10}}


def _captured(print_fn, *args, width: int = 220) -> str:
    from migration_pipeline.cli.output import console

    saved = console.width
    console.width = width
    try:
        with console.capture() as captured:
            print_fn(*args)
    finally:
        console.width = saved
    return captured.get()


def test_a_dry_runs_phases_say_nothing_was_written(db):
    from migration_pipeline.assets.metadata import phase_metadata
    from migration_pipeline.cli.tables import print_phase_results
    from migration_pipeline.launch.results import PhaseResult

    run = runs.start_run(db, provider_for("example"), "dry", dry_run=True, options=SMALL)
    drain_threads(db, run.id, width=2, providers=for_run)
    md = phase_metadata(db, rollups.rollup(db, run.id), 0)
    first = next(iter(md))
    assert first == "dry_run_note" and "nothing was written" in md[first].value, list(md)
    assert md["dry_run"].value is True and "imported" in md  # what the asset records is kept

    results = [PhaseResult("example/phase_1_companies", "materialized", {"imported": 30}),
               PhaseResult("example/phase_2_contacts", "failed", {}, "boom")]
    text = _captured(print_phase_results, results, True)
    assert "dry run: nothing written" in text and "materialized" not in text, text
    assert "dry run: failed" in text, text
    real = _captured(print_phase_results, results, False)
    assert "materialized" in real and "dry run" not in real, real


def _running(plan: list[list[str]], at: int) -> SimpleNamespace:
    """What print_rollup reads of a running pipedrive run of `plan` at phase index `at`."""
    kinds = [SimpleNamespace(phase=i, kind=k, tasks={"succeeded": 1}, seen=1, imported=1, matched=0, already_here=0,
                             updated=0, skipped=0, waiting=0, failed=0, deleted_at_source=0, caught_up={}, left={})
             for i, group in enumerate(plan) for k in group]
    return SimpleNamespace(name="run #3 (pipedrive for tenant 'acme')", status="running", dry_run=False, source="pipedrive",
                           tenant_id="acme", current_phase=at, phases=plan, kinds=kinds, incomplete=[], unfinished=[],
                           reasons=[], seconds=None, tasks={}, run_id=3)


def test_the_status_title_numbers_the_phase_once_as_the_phase_assets_and_progress_lines_do():
    from migration_pipeline.assets.specs import plan_of
    from migration_pipeline.cli.tables import print_rollup, run_phase

    assert run_phase("pipedrive", [["users"], ["catchup"]], 1) == (2, "2/2", "9/9")
    assert run_phase("pipedrive", [["users"], ["catchup"]], 2) == (2, "2/2", "9/9")  # finished: its last phase
    text = _captured(print_rollup, _running([["users"], ["catchup"]], 1))
    assert "running phase 9/9" in text and "2/2" not in text and "phase asset" not in text, text
    from migration_pipeline.cli.progress import Progress

    running = _running([["users"], ["catchup"]], 1)
    running.phase_kinds = lambda phase, at_close=False: []
    assert _captured(Progress._line, running, 1, "running").startswith("  phase 9/9 (catchup) running: ")  # the same count
    full = plan_of("pipedrive")
    text = _captured(print_rollup, _running(full, 2))
    assert "running phase 3/9" in text and "phase asset" not in text, text


def test_a_reason_groups_example_is_its_first_sample_rows_reason(db):
    from engine_core.rollup import grouped_reasons
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.tables import reasons_table

    run = runs.start_run(db, provider_for("example"), "why", options={**SMALL, "dangling": {"notes": [5, 9, 7]}})
    drain_threads(db, run.id, width=2, providers=for_run)
    sizes = {"5": 9001, "7": 5000, "9": 1200}  # the least reason ("1200 bytes") is not the first sample's (5)
    for sid, size in sizes.items():
        db.sql("UPDATE migration_records SET reason = %(why)s WHERE migration_id = %(r)s AND kind = 'notes' "
               "AND source_id = %(sid)s RETURNING 1", {"why": f"body not kept: {size} bytes over the cap", "r": run.id, "sid": sid})
    group = next(g for g in grouped_reasons(db, run.id) if g["kind"] == "notes")
    assert group["samples"] == ["5", "7", "9"] and group["count"] == 3, group
    assert group["example"] == "body not kept: 9001 bytes over the cap", group
    text = _captured(console.print, reasons_table([group], "why"))
    assert "e.g. 8.8 KiB" in text and "5, 7, 9" in text, text
    # a dry run's log: a group whose first note named no row takes its example from the note that did
    log = [{"level": "warning", "kind": "notes", "reason": "body not kept: 1200 bytes over the cap", "count": 1},
           {"level": "warning", "kind": "notes", "reason": "body not kept: 9001 bytes over the cap", "count": 1,
            "samples": ["5"]}]
    group = grouped_reasons(db, 0, log, dry_run=True)[0]
    assert group["samples"] == ["5"] and group["example"] == "body not kept: 9001 bytes over the cap", group


def test_the_overviews_title_names_waiting_only_with_its_column():
    from datetime import datetime, timezone

    from migration_pipeline.cli.tables import print_overview

    def tenant(name: str, waiting: int) -> dict:
        return {"tenant": name, "source": "example", "run_id": 1, "mode": "full", "status": "succeeded",
                "dry_run": False, "phase": "5/5", "tasks": {"succeeded": 9}, "started_at": datetime.now(timezone.utc),
                "finished_at": None, "idle_seconds": None, "unattended": False, "no_live_worker_since": None,
                "skipped": 2, "waiting": waiting, "failed": 0}

    none_wait = _captured(print_overview, [tenant("a", 0)], width=250)
    assert "waiting" not in none_wait and "skipped and failed" in none_wait, none_wait
    some_wait = _captured(print_overview, [tenant("a", 0), tenant("b", 3)], width=250)
    assert some_wait.count("waiting") == 2, some_wait  # the title's word and the column's header


def test_db_stop_refuses_while_a_ui_uses_the_database(tmp_path):
    import os

    from migration_pipeline.launch.daemon import DaemonLock, lock_path
    from tests.dagster.test_cli_errors import _env, _migrate_in_process, _one_line_error

    home = tmp_path / "home"
    (home / "pgdata").mkdir(parents=True)
    (home / "pgdata" / "postmaster.pid").write_text("")  # a server's mark; the refusal comes before pg_ctl
    lock = DaemonLock(lock_path(home / "dagster", "postgresql://postgres@127.0.0.1:5432/migrate"))
    assert lock.acquire()
    try:
        lock.record(by="migrate ui", pid=os.getpid(), address="http://127.0.0.1:3999", daemon_id=None)
        out = _migrate_in_process(["db", "stop"], _env(MIGRATE_HOME=str(home)))
        line = _one_line_error(out, "the Dagster UI started by migrate ui", f"pid {os.getpid()}",
                               "http://127.0.0.1:3999", "`migrate db stop --force`")
        assert "stopped" not in out.stdout, (line, out.stdout)
    finally:
        lock.release()


def test_db_url_without_an_embedded_database_says_where_it_looked_and_starts_none(tmp_path):
    from tests.conftest import stop_embedded_server
    from tests.dagster.test_cli_errors import _env, _migrate_in_process, _one_line_error

    home = tmp_path / "elsewhere" / ".migrate"
    try:
        out = _migrate_in_process(["db", "url"], _env(MIGRATE_HOME=str(home)))
        _one_line_error(out, f"no embedded database under {home} (MIGRATE_HOME)", "`migrate db url --create`")
        assert not home.exists(), list(home.iterdir())
    finally:
        if (home / "pgdata" / "postmaster.pid").exists():  # the server the command had started: not left running
            stop_embedded_server(home / "pgdata")
