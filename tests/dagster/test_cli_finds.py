"""A fresh user's finds at the command line, each pinned at the level it lives (no launch):

* a relaunch that joins, retries or resumes an existing run says, in one line on stderr, that the
  --options (--kinds) it was given are ignored: the run keeps what it started with; a --dry-run
  launch that would work on a run that writes is refused (exit 2), and one without --dry-run that
  works on a dry run says it writes nothing;
* a Ctrl-C before `migrate run`'s launch line (here: while the source's token is asked about) is one
  line saying nothing was launched, exit 130, not click's "Aborted!" with 1; one while the command
  imports its own modules is one line too, not a traceback;
* `migrate report --stat` names the stats the run's tasks count when given another;
* `migrate resume` / `retry` of a succeeded run says there is nothing to do (exit 0), not "no daemon";
* `migrate explain` of an id neither the ledger nor the run's kept source listing holds says both;
"""
from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from migration_pipeline.assets.metadata import NO_KIND_IN_RUN
from migration_pipeline.cli.launching import ignored_on_relaunch
from migration_pipeline.instance import STORAGE_URL_ENV, to_url
from migration_pipeline.launch.checks import new_run_config
from tests.dagster.test_cli_errors import _env, _migrate_in_process, _nothing_launched, _one_line_error

MIGRATE = str(Path(sys.executable).parent / "migrate")

EXAMPLE = {"page_size": 20, "counts": {"companies": 10, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}


def _cfg(**kw) -> dict:
    return new_run_config(**kw)["resources"]["new_run"]["config"]


def test_options_given_to_a_relaunch_of_an_existing_run_are_said_to_be_ignored(db_url):
    with dbmod.Database(db_url, max_size=4) as db:
        assert ignored_on_relaunch(db, "t1", "example", _cfg(options={"page_size": 5})) is None  # a new run: used
        run = runs.start_run(db, provider_for("example"), "t1", options=EXAMPLE)
        line = ignored_on_relaunch(db, "t1", "example", _cfg(options={"page_size": 5}))
        assert line is not None and "\n" not in line
        assert line.startswith("note: --options ignored: this launch joins the running run #")
        assert '"page_size": 20' in line  # the options it keeps
        # nothing given: a join is still said (two launches at once), nothing ignored
        assert ignored_on_relaunch(db, "t1", "example", _cfg()).startswith(f"note: this launch joins the running {run.name}")
        runs.stop(db, run.id)
        assert ignored_on_relaunch(db, "t1", "example", _cfg()) is None  # a resume without flags: nothing to say
        line = ignored_on_relaunch(db, "t1", "example", _cfg(kinds=["notes"], options={"page_size": 5}))
        assert "--options and --kinds ignored: this launch resumes the stopped run #" in line


def _refused(capsys, db, tenant: str, cfg: dict) -> str:
    with pytest.raises(SystemExit) as exited:
        ignored_on_relaunch(db, tenant, "example", cfg)
    assert exited.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --dry-run refused: "), lines
    return lines[0]


def test_a_dry_run_launch_never_resumes_retries_or_joins_a_run_that_writes(db_url, capsys):
    # a fresh user's `migrate run --tenant T --dry-run` said "--dry-run ignored: this launch resumes
    # the stopped run #27" and imported 970 rows: refused now, before anything is launched
    with dbmod.Database(db_url, max_size=4) as db:
        assert ignored_on_relaunch(db, "t2", "example", _cfg(dry_run=True)) is None  # a new dry run starts
        run = runs.start_run(db, provider_for("example"), "t2", options=EXAMPLE)
        line = _refused(capsys, db, "t2", _cfg(dry_run=True))
        assert f"would join the running run #{run.id} " in line and "let it finish first" in line
        runs.stop(db, run.id)
        line = _refused(capsys, db, "t2", _cfg(dry_run=True, kinds=["notes"]))
        assert f"would resume the stopped run #{run.id} " in line and "not a dry run" in line
        assert "finish or resume it first with `migrate run --tenant t2` (without --dry-run)" in line
        db.sql("UPDATE migrations SET status = 'failed' WHERE id = %(r)s", {"r": run.id})
        line = _refused(capsys, db, "t2", _cfg(dry_run=True))
        assert f"would retry the failed run #{run.id} " in line and "finish or retry it first" in line


def test_a_launch_that_writes_on_a_dry_run_says_it_writes_nothing(db_url):
    with dbmod.Database(db_url, max_size=4) as db:
        dry = runs.start_run(db, provider_for("example"), "t3", options=EXAMPLE, dry_run=True)
        # what it asked for: only the join is said
        assert ignored_on_relaunch(db, "t3", "example", _cfg(dry_run=True)).startswith(
            f"note: this launch joins the running run #{dry.id} ")
        line = ignored_on_relaunch(db, "t3", "example", _cfg())  # no flag given: still said
        assert line is not None and "\n" not in line
        assert line.startswith(f"note: this launch joins the running run #{dry.id} ") and "a dry run: it writes nothing" in line
        runs.stop(db, dry.id)
        line = ignored_on_relaunch(db, "t3", "example", _cfg(kinds=["notes"]))
        assert line.startswith(f"note: this launch resumes the stopped run #{dry.id} ")
        assert "a dry run: it writes nothing" in line and "; --kinds ignored: it keeps the kinds" in line
        assert ignored_on_relaunch(db, "t3", "example", _cfg(dry_run=True, kinds=["notes"])).startswith(
            "note: --kinds ignored: this launch resumes the stopped")  # --dry-run is not ignored on a dry run


@pytest.mark.timeout(120)
# SIG_IGN: a background job (`migrate run ... &` from a non-interactive shell) inherits SIGINT
# ignored; the command restores the default at its start, so `kill -INT` stops it there too
@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["SIG_DFL", "SIG_IGN"])
def test_ctrl_c_before_the_launch_line_says_nothing_was_launched(db_url, tmp_path, inherited):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, reads the request, never answers
    silent.settimeout(60)
    env = _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="pipedrive",
               PIPEDRIVE_BASE_URL=f"http://127.0.0.1:{silent.getsockname()[1]}", PIPEDRIVE_API_TOKEN="tok",
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", "acme"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    held = []
    try:
        while True:  # the reachability check connects and closes; the token check sends GET /v1/users/me
            conn, _ = silent.accept()
            held.append(conn)
            conn.settimeout(10)
            if conn.recv(1024).startswith(b"GET /v1/users/me"):
                break
        proc.send_signal(signal.SIGINT)  # the user's Ctrl-C while the launch's checks wait
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        for conn in held:
            conn.close()
        silent.close()
    assert proc.returncode == 128 + signal.SIGINT, (proc.returncode, err[-2000:])
    assert [ln for ln in err.splitlines() if ln.strip()] == ["SIGINT before the launch: nothing was launched"], err
    assert "launched Dagster run" not in out
    _nothing_launched(db_url)


def test_ctrl_c_while_the_command_imports_its_modules_is_one_line_not_a_traceback():
    # a fresh user's Ctrl-C in the first ~0.3 s of `migrate run` printed the traceback of whichever
    # module was being imported. The installed entry point is loaded as its console script does, and
    # a real SIGINT arrives while the command-line module imports rich.console.
    script = """
import signal, sys
from importlib.metadata import entry_points


class InterruptOnRich:
    def find_spec(self, name, path=None, target=None):
        if name == "rich.console":
            signal.raise_signal(signal.SIGINT)
        return None


(entry,) = entry_points(group="console_scripts", name="migrate")
sys.meta_path.insert(0, InterruptOnRich())
sys.argv = ["migrate", "run", "--tenant", "acme"]
sys.exit(entry.load()())
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, (proc.returncode, proc.stderr[-2000:])
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == ["SIGINT while migrate was starting: nothing was done"], \
        proc.stderr[-2000:]


def test_a_stop_signal_before_the_dagster_run_exists_says_nothing_was_launched(capsys):
    # inside the launch's signal handling, before place_tenant_run made the run, with no daemon of ours:
    # the line after "stopping what this command started" had been nothing at all
    from migration_pipeline import launch
    import migration_pipeline.launch.signals
    from migration_pipeline.cli.launching import stop_what_we_started

    class NoDaemonOfOurs:
        proc = None

        def close(self, limit: float) -> None:
            pass

    stop_what_we_started(None, NoDaemonOfOurs(), None, "acme", launch.signals.Interrupted(signal.SIGINT))
    assert capsys.readouterr().err.splitlines() == ["SIGINT: stopping what this command started", "nothing was launched"]


@pytest.fixture
def migrated(db_url, tmp_path):
    """Tenant "done" migrated by the example source (a few hundred rows, in this process); the env
    `migrate` needs for it."""
    from engine_core.worker import drain_threads

    with dbmod.Database(db_url, max_size=6) as db:
        run = runs.start_run(db, provider_for("example"), "done", options=EXAMPLE)
        drain_threads(db, run.id, width=2, providers=for_run)
        assert runs.get_run(db, run.id).status == "succeeded"
    return _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="example",
                **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})


def test_report_refuses_a_stat_no_task_counts_and_names_those_they_do(migrated):
    # a fresh user's `--stat bogus` grouped every task under 0
    line = _one_line_error(_migrate_in_process(["report", "done", "--stat", "bogus"], migrated),
                           "unknown --stat 'bogus'", "imported", "seen")
    assert "run #" in line
    _one_line_error(_migrate_in_process(["report", "done", "--kind", "notes", "--stat", "bogus"], migrated),
                    "succeeded notes tasks count")
    for good in (["--stat", "seen"], []):
        out = _migrate_in_process(["report", "done", *good], migrated)
        assert out.returncode == 0, out.stderr


def test_report_reaches_an_earlier_run_of_the_tenant(migrated, db_url):
    # after a sync, the full run before it could not be reported on: report read only the latest run
    with dbmod.Database(db_url, max_size=2) as db:
        later = runs.start_run(db, provider_for("example"), "done", options=EXAMPLE)
    out = _migrate_in_process(["report", "done"], migrated)
    first, second = out.stdout.splitlines()[:2]
    assert out.returncode == 0 and first.startswith(f"reporting run #{later.id} "), out.stdout
    assert "the tenant's latest run" in first and second.startswith(f"run #{later.id} "), out.stdout
    out = _migrate_in_process(["report", "done", "--run", "1"], migrated)
    assert out.returncode == 0 and out.stdout.startswith("run #1 "), (out.stdout, out.stderr)
    # the tenant's repr, not a possessive after it ("'done''s", a fresh user's find)
    line = _one_line_error(_migrate_in_process(["report", "other", "--run", "1"], migrated))
    assert line == "error: run #1 belongs to tenant 'done', not to tenant 'other'", line
    _one_line_error(_migrate_in_process(["report", "done", "--run", "99"], migrated), "no migration run #99")


@pytest.mark.parametrize("action", ["resume", "retry"])
def test_resume_or_retry_of_a_succeeded_run_says_there_is_nothing_to_do(migrated, action):
    # it had said that no daemon would work on the run (exit 2), as if there were something to resume
    out = _migrate_in_process([action, "done"], migrated)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert lines == [f"run #1 (example for tenant 'done') succeeded: nothing to {action} (`migrate sync done` brings "
                     "what changed at the source since)"], out.stdout
    assert "daemon" not in out.stdout + out.stderr


def test_explain_of_an_id_the_source_did_not_list_says_so(migrated, db_url):
    # it said only "not in the ledger"; what the run's catch-up listed (its inventory) can say more
    # (the example source has no catch-up: its inventory is written here as a catch-up writes it)
    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("INSERT INTO migration_inventory (migration_id, kind, source_id)"
               " SELECT 1, 'contacts', unnest(ARRAY['1', '2', '99998']) RETURNING 1")
    out = _migrate_in_process(["explain", "done", "contacts", "99999"], migrated)
    assert out.returncode == 1 and "not in the ledger" in out.stdout, (out.stdout, out.stderr)
    assert "nor did the source list it (run #1's catch-up listed 3 contacts ids, not this one)" in out.stdout, out.stdout
    out = _migrate_in_process(["explain", "done", "contacts", "99998"], migrated)
    assert out.returncode == 1 and "not in the ledger" in out.stdout and "catch-up listed it at the source" in out.stdout
    out = _migrate_in_process(["explain", "done", "notes", "99999"], migrated)  # no listing kept: nothing said of the source
    assert out.returncode == 1 and "list" not in out.stdout, out.stdout


def test_explain_takes_an_id_with_spaces_around_it_and_a_negative_id(migrated):
    # a pasted " 2" was not found, and "-1" was read as an unknown option
    out = _migrate_in_process(["explain", "done", "contacts", " 2 "], migrated)
    assert out.returncode == 0 and out.stdout.startswith("contacts 2: imported by run #1"), (out.stdout, out.stderr)
    out = _migrate_in_process(["explain", "done", "contacts", "-1"], migrated)
    assert out.returncode == 1 and "contacts -1 of tenant 'done' is not in the ledger" in out.stdout, (out.stdout, out.stderr)
    out = _migrate_in_process(["explain", "done", "contacts", "2", "--json"], migrated)  # options still work
    assert out.returncode == 0 and '"action": "created"' in out.stdout, out.stdout


def test_explain_normalises_the_id_as_the_ledger_keys_it_and_refuses_an_empty_one(migrated, db_url):
    # an uppercase lead UUID and "02" were not found (the ledger keys "...abc" lowercase and 2), and ""
    # was taken ("contacts  of tenant ..."); the example source's ids are integers: a UUID is put here
    # as the ledger keys a lead's, and "0004" as a row whose id was kept as served
    lead = "5c0b4e3a-1f2d-4c6b-9a8e-0d7f6e5a4b3c"
    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("UPDATE migration_records SET source_id = %s WHERE tenant_id = 'done' AND kind = 'contacts'"
               " AND source_id = '3' RETURNING 1", (lead,))
        db.sql("UPDATE migration_records SET source_id = '0004' WHERE tenant_id = 'done' AND kind = 'contacts'"
               " AND source_id = '4' RETURNING 1")
    out = _migrate_in_process(["explain", "done", "contacts", lead.upper()], migrated)
    assert out.returncode == 0 and out.stdout.startswith(f"contacts {lead}: imported by run #1"), (out.stdout, out.stderr)
    out = _migrate_in_process(["explain", "done", "contacts", "02"], migrated)
    assert out.returncode == 0 and out.stdout.startswith("contacts 2: imported by run #1"), (out.stdout, out.stderr)
    out = _migrate_in_process(["explain", "done", "contacts", "0004"], migrated)  # "4" is not there: the text as given
    assert out.returncode == 0 and '"source_id": "0004"' in _migrate_in_process(
        ["explain", "done", "contacts", "0004", "--json"], migrated).stdout, (out.stdout, out.stderr)
    for empty in ("", "  "):
        _one_line_error(_migrate_in_process(["explain", "done", "contacts", empty], migrated), "SOURCE_ID is empty")


def test_explain_tells_a_row_without_a_readable_id_by_its_id_as_served(migrated, db_url):
    # a fresh user's badrow sandbox: a person served with id "abc" was counted failed and explain
    # said "not in the ledger"; it is kept beside the ledger (migration_unreadable), as a run's
    # window records it (context._write_row), and explain tells it by the served id or the whole key
    key = "abc sha256:0123456789abcdef"
    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("INSERT INTO migration_unreadable (migration_id, tenant_id, source, kind, raw_key, reason, excerpt)"
               " VALUES (1, 'done', 'example', 'contacts', %s, %s, %s) RETURNING 1",
               (key, "MalformedRow: id is not a positive integer: 'abc'", '{"id":"abc","label_ids":[1]}'))
    for asked in ("abc", key):
        out = _migrate_in_process(["explain", "done", "contacts", asked], migrated)
        assert out.returncode == 0 and out.stdout.startswith(f"contacts {asked}: failed by run #1"), (out.stdout, out.stderr)
        assert "no readable id" in out.stdout and 'as served: {"id":"abc","label_ids":[1]}' in out.stdout, out.stdout
    out = _migrate_in_process(["explain", "done", "contacts", "77777"], migrated)  # perhaps one of them
    assert out.returncode == 1 and "1 contacts record(s) are kept without a readable id (latest in run #1: rows served" \
        in out.stdout and "`migrate rows done --kind contacts` lists their keys" in out.stdout, out.stdout


def test_a_launch_with_settings_that_reach_another_source_is_refused_before_any_run(migrated, db_url):
    # a fresh user's `migrate sync` / `run --new-run` with another company's settings launched a
    # Dagster run that failed its first step (TenantSourceMismatch) and stayed FAILURE in the
    # partition's history; a relaunch of a stopped tenant flipped its engine run to running first
    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("UPDATE migrations SET source_identity = 'pipedrive company 6000003' WHERE tenant_id = 'done' RETURNING 1")
        before = db.sql("SELECT count(*) AS n FROM migrations")[0]["n"]
    for args in (["run", "--tenant", "done", "--new-run"], ["sync", "done"]):
        out = _migrate_in_process(args, migrated)
        line = _one_line_error(out, "tenant 'done' holds data of pipedrive company 6000003 (run #1)",
                               "these source settings reach example-account")
        assert "launched Dagster run" not in out.stdout, (args, out.stdout)
    with dbmod.Database(db_url, max_size=2) as db:
        assert db.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == before, "no engine run started"


def test_a_numeric_run_option_given_as_a_string_is_stored_as_its_number(db_url, tmp_path, monkeypatch):
    # `--options '{"burst_limit":"40"}'` was stored as the string "40" (the checks read it as 40)
    import json

    from click.testing import CliRunner

    from migration_pipeline import cli
    import migration_pipeline.cli.main
    import migration_pipeline.cli.tables

    launched: list[dict] = []
    monkeypatch.setattr(cli.run, "launch_through_dagster", lambda tenant, source, config, as_json, **kw: launched.append(config) or 0)
    given = {"page_size": "20", "burst_limit": " 40 ", "snapshot_margin_seconds": "2.5", "name": "4a", "flag": "true",
             "counts": {"companies": "5"}}
    result = CliRunner().invoke(cli.main.main, ["run", "--tenant", "typed", "--source", "example", "--options", json.dumps(given)],
                                env={"DATABASE_URL": to_url(db_url), "MIGRATE_HOME": str(tmp_path / "home")})
    assert result.exit_code == 0 and launched, (result.output, result.exception)
    stored = json.loads(launched[0]["resources"]["new_run"]["config"]["options_json"])
    assert stored == {"page_size": 20, "burst_limit": 40, "snapshot_margin_seconds": 2.5, "name": "4a", "flag": "true",
                      "counts": {"companies": "5"}}, stored  # top-level numbers only; the rest as given


def _results_at(width: int, monkeypatch) -> str:
    """`migrate run`'s results tables (per phase, then the engine run's per kind) of a Pipedrive
    run, as a console `width` columns wide shows them."""
    from rich.console import Console

    from engine_core.rollup import KindRollup, RunRollup
    from migration_pipeline import cli
    import migration_pipeline.cli.main
    import migration_pipeline.cli.tables
    from migration_pipeline.assets.specs import phase_specs
    from migration_pipeline.launch.results import PhaseResult

    out = Console(width=width, record=True, force_terminal=False)
    monkeypatch.setattr(cli.tables, "console", out)
    figures = {"imported": 123456, "matched": 7, "already_here": 3, "updated": 1, "skipped": 2, "failed": 0,
               "deleted_at_source": 4, "tasks": 104, "rows_per_second": 1234.5}
    cli.tables.print_phase_results([PhaseResult(spec.key.to_user_string(), "materialized", figures)
                             for spec in phase_specs("pipedrive")])
    provider = provider_for("pipedrive")
    kinds = [KindRollup(k, p, {"succeeded": 104, "failed": 2}, 123456, 123000, 7, 3, 1, 2, 0, deleted_at_source=5,
                        caught_up={"seen": 9}) for p, group in enumerate(provider.phases()) for k in group]
    cli.tables.print_rollup(RunRollup(1, "run #1 (pipedrive for tenant 'acme')", "acme", "pipedrive", "succeeded", False, 8,
                               [list(g) for g in provider.phases()], {"succeeded": 300}, kinds, [], None, None, 12.5))
    return out.export_text()


def test_the_results_tables_cut_no_cell_short_on_an_80_column_terminal(monkeypatch):
    # rich had cut every cell to fit: "123…" for 123456, "pip…" for the phase asset
    text = _results_at(80, monkeypatch)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    kinds = sum(len(group) for group in provider_for("pipedrive").phases())
    from migration_pipeline.assets.specs import phase_specs

    phases = len(phase_specs("pipedrive"))
    assert text.count("123456") == phases and text.count("123000") == kinds, text  # whole numbers, in every row
    assert "left out at 80 columns:" in text  # what a narrow terminal does not show is named
    wide = _results_at(220, monkeypatch)
    assert "…" not in wide and "left out" not in wide and "deleted at source" in wide and "by catch-up" in wide


def test_the_tenant_overview_cuts_no_cell_short_on_an_80_column_terminal(monkeypatch):
    # `migrate status` without a tenant had cut its cells at 80 columns, as the results tables had
    from datetime import datetime, timezone

    from rich.console import Console

    from migration_pipeline import cli
    import migration_pipeline.cli.main
    import migration_pipeline.cli.tables

    def overview_at(width: int) -> str:
        out = Console(width=width, record=True, force_terminal=False)
        monkeypatch.setattr(cli.tables, "console", out)
        when = datetime(2026, 12, 2, 18, 0, 0, tzinfo=timezone.utc)
        cli.tables.print_overview([{"tenant": f"customer-with-a-long-name-{i}", "source": "pipedrive", "run_id": 12345 + i,
                             "mode": "sync" if i else "full", "status": "succeeded", "dry_run": bool(i % 2),
                             "phase": "8/8", "tasks": {"succeeded": 104, "failed": 2}, "started_at": when,
                             "finished_at": when, "skipped": 3, "waiting": 17 if i == 1 else 0, "failed": 2}
                            for i in range(3)])
        return out.export_text()

    text = overview_at(80)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert all(f"#{12345 + i}" in text for i in range(3)) and text.count("104") == 3, text
    # a long name folds over lines, whole: the first column's pieces, top to bottom
    folded = "".join(re.split("[│┃]", ln)[1].strip() for ln in text.splitlines() if len(re.split("[│┃]", ln)) > 3)
    assert all(f"customer-with-a-long-name-{i}" in folded for i in range(3)), text
    assert "left out at 80 columns:" in text
    wide = overview_at(200)
    assert "left out" not in wide and wide.count("2026-12-02 18:00:00") == 6, wide
    # rows left to the catch-up's walk are their own column, not counted as skipped
    header = next(ln for ln in wide.splitlines() if "┃ skipped" in ln)
    assert [c.strip() for c in re.split("[│┃]", header)][6:9] == ["skipped", "waiting", "failed"], wide
    assert " 17 " in wide, wide


def test_status_and_reports_reasons_table_says_what_it_leaves_out():
    # the tables showed the 20 biggest groups and said nothing of the rest (a fresh user's account had
    # 86 groups; its email failures were not in `migrate status`)
    import io

    from rich.console import Console

    from migration_pipeline.cli.tables import REASON_GROUPS_SHOWN, reasons_table

    groups = [{"kind": "notes", "action": "failed", "count": 30 - i, "reason": f"reason {i}", "samples": [str(i)]}
              for i in range(REASON_GROUPS_SHOWN + 5)]
    shown = Console(file=io.StringIO(), width=200, record=True)
    shown.print(reasons_table(groups, "acme"))
    text = shown.export_text()
    assert "reason 19" in text and "reason 20" not in text
    assert "5 more group(s) of 40 row(s) or task(s) not shown: `--json` has every group, `migrate rows acme` every row" \
        in " ".join(text.split()), text
    shown = Console(file=io.StringIO(), width=200, record=True)
    shown.print(reasons_table(groups[:REASON_GROUPS_SHOWN], "acme"))
    assert "not shown" not in shown.export_text()


def test_the_sandbox_commands_help_names_the_values_and_the_truth():
    # a fresh user found the scales, latencies and fault kinds only in `python -m pipedrive_sandbox --help`
    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    for command in (["sandbox", "--help"], ["ui", "--help"]):
        text = " ".join(CliRunner().invoke(main, command).output.split())
        assert "tiny, small or seed-customer" in text and "badrow" in text and "realistic:F" in text, text
    assert "/_sandbox/truth" in " ".join(CliRunner().invoke(main, ["sandbox", "--help"]).output.split())


def test_the_phase_pages_capped_row_list_keeps_the_failed_rows_first(migrated, db_url):
    # a fresh user's phase page listed 50 skipped rows of 111 and none of the 59 failed ones (the
    # query sorted 'skipped' before 'failed'); failed rows, without a readable id too, come first
    from migration_pipeline.assets.metadata import phase_rows

    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("UPDATE migration_records SET action = 'skipped', reason = 'not linked' WHERE tenant_id = 'done'"
               " AND kind = 'contacts' AND source_id IN ('1', '2') RETURNING 1")
        db.sql("UPDATE migration_records SET action = 'failed', reason = 'MalformedRow: x' WHERE tenant_id = 'done'"
               " AND kind = 'contacts' AND source_id = '9' RETURNING 1")
        db.sql("INSERT INTO migration_unreadable (migration_id, tenant_id, source, kind, raw_key, reason)"
               " VALUES (1, 'done', 'example', 'contacts', 'sha256:00', 'MalformedRow: id is missing') RETURNING 1")
        assert [(r["action"], r["source_id"]) for r in phase_rows(db, 1, ["contacts"], limit=2)] == \
            [("failed", "9"), ("failed", "sha256:00")]
        assert [r["action"] for r in phase_rows(db, 1, ["contacts"])] == ["failed", "failed", "skipped", "skipped"]


def test_resume_drain_shows_the_runs_progress_as_migrate_run_does(migrated, db_url):
    # `migrate resume T --drain` said "resume -> running, phase 1" and then nothing until its table,
    # minutes later under latency
    with dbmod.Database(db_url, max_size=4) as db:
        run = runs.start_run(db, provider_for("example"), "paused", options=EXAMPLE)
        runs.stop(db, run.id)
    out = _migrate_in_process(["resume", "paused", "--drain"], migrated)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = [ln.strip() for ln in out.stdout.splitlines()]
    phases = [ln for ln in lines if ln.startswith("phase ") and f"run #{run.id}" in ln]
    assert len(phases) >= len(run.plan) and any("contacts" in ln and "closed" in ln for ln in phases), out.stdout


def test_resume_drain_materialises_the_phases_it_closed_for_the_ui(migrated, db_url):
    # after `migrate resume T --drain` the UI showed the tenant's phases "Missing": the drain had no
    # Dagster run to materialise them, and the launch's run had ended canceled at the stop
    from migration_pipeline.instance import dagster_env, open_instance

    instance = open_instance(dagster_env(env=migrated))  # Dagster used here, as after a launch
    try:
        with dbmod.Database(db_url, max_size=4) as db:
            run = runs.start_run(db, provider_for("example"), "shown", options=EXAMPLE)
            runs.stop(db, run.id)
        out = _migrate_in_process(["resume", "shown", "--drain"], migrated)
        assert out.returncode == 0, (out.stdout, out.stderr)
        from dagster import AssetRecordsFilter

        from migration_pipeline.assets.specs import phase_specs
        shown = [spec.key for spec in phase_specs("example") if instance.fetch_materializations(
            AssetRecordsFilter(asset_key=spec.key, asset_partitions=["shown"]), limit=1).records]
        assert len(shown) == len(run.plan), shown
    finally:
        instance.dispose()


def test_resume_drain_materialises_an_unplanned_phase_and_tags_the_canceled_launch_done(migrated, db_url):
    # after a stop and `migrate resume T --drain` of a run without deals, the deals phase stayed
    # unmaterialised between green phases, and the launch's Dagster run stayed Canceled with nothing
    # saying the tenant was done
    from dagster import AssetRecordsFilter, DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from migration_pipeline.assets.specs import phase_specs
    from migration_pipeline.cli.control import FINISHED_BY_DRAIN
    from migration_pipeline.instance import dagster_env, open_instance

    instance = open_instance(dagster_env(env=migrated))
    try:
        with dbmod.Database(db_url, max_size=4) as db:
            run = runs.start_run(db, provider_for("example"), "nodeals", options=EXAMPLE,
                                 kinds=["companies", "contacts", "activities", "notes"])
            runs.stop(db, run.id)
        launch = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.CANCELED,
                                     tags={"migration/run_id": str(run.id), "dagster/partition": "nodeals"})
        out = _migrate_in_process(["resume", "nodeals", "--drain"], migrated)
        assert out.returncode == 0, (out.stdout, out.stderr)
        deals = next(spec for spec in phase_specs("example") if "deals" in spec.kinds)
        records = instance.fetch_materializations(AssetRecordsFilter(asset_key=deals.key,
                                                                     asset_partitions=["nodeals"]), limit=1).records
        assert records, "the unplanned deals phase was not materialised"
        md = records[0].event_log_entry.asset_materialization.metadata
        assert md["phase_status"].value == "not in this run's plan" and md["engine_run_id"].value == run.id, md
        # the drainer's materialisation says first what the phase op's does: none of its kinds was taken
        assert next(iter(md)) == "run_kinds" and md["run_kinds"].value.startswith(NO_KIND_IN_RUN), md
        said = instance.get_run_by_id(launch.run_id).tags.get(FINISHED_BY_DRAIN, "")
        assert said.startswith("succeeded: every row accounted for"), said
        assert "nodeals is done" in out.stderr, out.stderr
    finally:
        instance.dispose()
