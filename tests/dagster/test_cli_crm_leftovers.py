"""What the command line says of a tenant's kinds, its plan and its runs, as a newcomer reads it:

* `migrate verify` proves the kinds some run of the tenant took; a kind no run took (opt-in, or
  not chosen: the runs named other kinds) is "left out", never "missing", and the proof passes;
* `migrate status` says what the tenant left out: the kinds neither its shown run nor any
  succeeded run took (a kind run alone later leaves out nothing the tenant already has);
* the command line issues no statement of its own: its reads of the run tables are functions of
  `engine_core.runs_reads`.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from engine_core import db as dbmod
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox

pytestmark = pytest.mark.timeout(300)

CLI = Path(__file__).resolve().parents[2] / "migration_pipeline" / "cli"


def test_verify_says_left_out_for_the_kinds_no_run_of_the_tenant_took(db):
    with sandbox() as sb:
        run = migrate(db, sb, "bee", kinds=["organizations", "persons"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), "bee", FAST)
    by_kind = {k.kind: k for k in proof.kinds}
    assert by_kind["persons"].checked and by_kind["organizations"].checked
    for kind in ("deals", "notes", "emails", "files"):
        assert not by_kind[kind].checked and not by_kind[kind].missing, by_kind[kind].as_dict()
        assert by_kind[kind].note.startswith("left out (not chosen): no run of the tenant took it"), by_kind[kind].note
    assert by_kind["followers"].note.startswith("left out (opt-in)")
    assert "`migrate run --tenant bee --kinds deals` migrates it" in by_kind["deals"].note
    assert proof.passed and proof.differences == 0, proof.lines()


def test_status_says_what_the_tenant_left_out_not_only_its_last_run(db_url, run_env):  # noqa: F811
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        first = migrate(db, sb, "cee", kinds=["users", "organizations"])
        later = migrate(db, sb, "cee", kinds=["persons", "followers"])
        assert (first.status, later.status) == ("succeeded", "succeeded"), failed_tasks(db, later.id)
        out = _migrate_in_process(["status", "cee", "--json"], dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url))
        text = _migrate_in_process(["status", "cee"], dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url))
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    left = json.loads(out.stdout)["left_out"]
    assert not {"users", "organizations", "persons", "followers"} & set(left), left
    assert left["deals"] == "not chosen" and left["participants"] == "opt-in", left
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("left out:"))
    assert "users" not in line and "organizations" not in line and "deals" in line, line


def test_the_command_line_issues_no_statement_of_its_own():
    calls = []
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("sql", "fetch_one", "fetch_all", "sql_rowcount", "raw")):
                calls.append(f"{path.name}:{node.lineno} .{node.func.attr}(")
    assert not calls, calls


def test_plan_says_opt_in_days_are_unknown_without_a_daily_limit():
    from migration_pipeline.cli.plan import plan_lines

    class Est:  # the shape plan_lines reads (engine_core.providers.pipedrive.estimate.Estimate)
        kinds, requests, tokens, days, daily_limit, share, burst_limit, wall_seconds = [], 1, 2, None, None, 0.8, 80, 1.0
        burst_seconds, trip_seconds, in_flight, round_trips = 0.025, 1.0, 8.0, {"list": 0.3}
        opt_in = [type("K", (), {"kind": "followers", "requests": 140, "tokens": 1400, "days": None})()]
        spent = {"requests": 3, "tokens": 30}

    line = next(ln for ln in plan_lines(Est()) if ln.startswith("opt-in followers"))
    assert "+-" not in line and "days unknown without the account's daily limit" in line, line
    Est.opt_in[0].days, Est.daily_limit = 0.25, 1000
    assert "+0.25 days" in next(ln for ln in plan_lines(Est()) if ln.startswith("opt-in followers"))


def test_a_relaunch_names_the_kinds_and_options_a_run_keeps_never_an_empty_dict():
    from migration_pipeline.cli.launching import started_with

    bare = type("Run", (), {"kinds": ("persons", "deals"), "options": {}})()
    assert started_with(bare) == "the kinds it started with (persons, deals) and no options"
    given = type("Run", (), {"kinds": ("persons",), "options": {"burst_limit": 40}})()
    assert started_with(given) == 'the kinds it started with (persons) and its options ({"burst_limit": 40})'
    assert "{}" not in started_with(bare)


def test_the_sandbox_command_takes_the_daily_budget_the_readme_names(db_url, run_env):  # noqa: F811
    readme = " ".join((CLI.parents[1] / "README.md").read_text().split())
    assert "`migrate sandbox --daily-budget TOKENS`" in readme
    out = _migrate_in_process(["sandbox", "--help"], run_env)
    assert "--daily-budget" in out.stdout, out.stdout
    from pipedrive_sandbox.config import SandboxConfig

    assert SandboxConfig.from_options(scale="tiny", daily_budget=5000).daily_budget == 5000


def test_explain_of_a_bare_deal_history_id_says_the_form_it_takes(db_url, run_env):  # noqa: F811
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        run = migrate(db, sb, "dee", kinds=["deals", "deal_history"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        key = db.sql("SELECT source_id FROM migration_records WHERE tenant_id = 'dee' AND kind = 'deal_history'"
                     " ORDER BY source_id LIMIT 1")[0]["source_id"]
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url)
        bare = _migrate_in_process(["explain", "dee", "deal_history", key.split(":")[0]], env)
        found = _migrate_in_process(["explain", "dee", "deal_history", key], env)
    assert bare.returncode == 1 and len(bare.stdout.strip().splitlines()) == 1, bare.stdout
    said = " ".join(bare.stdout.split())
    assert "keyed DEAL_ID:CHANGE_HASH" in said and f"LIKE '{key.split(':')[0]}:%'" in said, said
    assert found.returncode == 0 and key in found.stdout, found.stdout


def test_plan_says_a_changed_default_once_not_every_default_again():
    from migration_pipeline.cli.plan import run_words

    defaults = ["users", "persons", "notes", "deals"]
    assert run_words(["+deal_history", "-notes"], ["users", "persons", "deals", "deal_history"]) == (
        "the default kinds and deal_history, without notes (4 kinds)")
    assert run_words(None, defaults).startswith("the default kinds (4 kinds;")
    assert run_words(["persons", "deals"], ["persons", "deals"]) == "persons, deals"
    assert "users" not in run_words(["+deal_history"], [*defaults, "deal_history"])


def test_plan_of_a_migrated_tenant_says_the_next_run_is_a_sync_and_its_cost(db_url, run_env):  # noqa: F811
    import json

    from engine_core import runs_reads
    from tests.pipedrive.support import TOKEN, sync

    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        before = _migrate_in_process(["plan", "gee"], env)
        run = migrate(db, sb, "gee")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        after = _migrate_in_process(["plan", "gee"], env)
        synced = sync(db, sb, "gee")
        cost = runs_reads.run_cost(db, synced.id)
        again = _migrate_in_process(["plan", "gee", "--json"], env)
    assert before.stdout.startswith("plan for gee: a full run of the default kinds"), before.stdout[:300]
    first = after.stdout.splitlines()[0]
    assert first.startswith(f"plan for gee: already migrated by run #{run.id}; the next run is a sync "
                            "(`migrate sync gee`)"), first
    assert "--new-run" in after.stdout.splitlines()[1]
    plan = json.loads(again.stdout)
    assert plan["next"] == "sync" and plan["sync"]["last"] == {"run_id": synced.id, **cost}, plan
    # nothing changed: the sync spent its floor (the floor also counts the start's identity request)
    assert abs(plan["sync"]["requests"] - cost["requests"]) <= 1 and abs(plan["sync"]["tokens"] - cost["tokens"]) <= 2, (
        plan["sync"], cost)


def test_file_contents_reasons_are_grouped_once(db):
    from engine_core import rollup

    with sandbox() as sb:
        run = migrate(db, sb, "hh", kinds=["files", "file_contents"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    groups = [(g["kind"], g["reason"]) for g in rollup.grouped_reasons(db, run.id) if g["kind"] == "file_contents"]
    assert groups and len(groups) == len(set(groups)), groups


def test_a_grouped_reason_shows_sizes_humanly_and_no_placeholder_braces():
    from migration_pipeline.cli.tables import human_bytes, shown_reason

    assert (human_bytes(512), human_bytes(1_000_000), human_bytes(100 * 1024 * 1024)) == (
        "512 bytes", "976.6 KiB", "100.0 MiB")
    group = {"reason": "file content not kept: larger than MIGRATE_FILE_MAX_BYTES ({n} bytes)", "count": 1,
             "example": "file content not kept: larger than MIGRATE_FILE_MAX_BYTES (1,000,000 bytes)"}
    assert shown_reason(group) == "file content not kept: larger than MIGRATE_FILE_MAX_BYTES (976.6 KiB)"
    assert shown_reason({**group, "count": 3}).endswith("(e.g. 976.6 KiB)")
    other = {"reason": "not linked to any record: organizations {n} is not here", "count": 2,
             "example": "not linked to any record: organizations 7 is not here"}
    assert shown_reason(other) == "not linked to any record: organizations N is not here"
    assert shown_reason({**other, "count": 1}) == other["example"]
    assert shown_reason({"reason": "name is not text: {value}", "count": 4, "example": "name is not text: 3"}) == \
        "name is not text: ..."


def test_progress_numbers_a_phase_by_the_providers_plan_as_the_assets_are():
    from migration_pipeline.assets.specs import plan_of
    from migration_pipeline.cli.progress import phase_label

    full = plan_of("pipedrive")
    opt_in = {"participants", "followers", "deal_history", "file_contents"}
    plan = [[k for k in g if k not in opt_in] for g in full]
    plan = [g for g in plan if g]  # a default run: the opt-in phase left out
    r = type("R", (), {"source": "pipedrive", "phases": plan})()
    assert len(plan) == len(full) - 1
    assert phase_label(r, len(plan) - 1) == f"{len(full)}/{len(full)}"  # the catch-up, as its asset is numbered
    assert phase_label(r, 0) == f"1/{len(full)}"
    gone = type("R", (), {"source": "no-such-source", "phases": plan})()
    assert phase_label(gone, 0) == f"1/{len(plan)}"


def test_status_tables_asset_metadata_and_bars_number_a_phase_as_the_progress_lines_do():
    # the progress lines said "phase 9/9 (catchup)" where `migrate status` said 8/8, the rollup
    # table 8, the catch-up asset's metadata 8/8 and the terminal's bar "phase 8"
    import io

    from rich.console import Console

    from engine_core.progress import ProgressBoard
    from migration_pipeline.assets.metadata import asset_phase
    from migration_pipeline.assets.specs import plan_of
    from migration_pipeline.cli import inspect, tables
    from migration_pipeline.cli.progress import phase_label

    full = plan_of("pipedrive")
    opt_in = {"participants", "followers", "deal_history", "file_contents"}
    plan = [g for g in ([k for k in g if k not in opt_in] for g in full) if g]
    last = len(plan) - 1
    r = type("R", (), {"source": "pipedrive", "phases": plan, "plan": plan, "current_phase": len(plan)})()
    said = phase_label(r, last)
    assert said == f"{len(full)}/{len(full)}"
    assert inspect._phase(r) == said and asset_phase(r, last) == said
    assert tables.phase_labels("pipedrive", plan)[last] == said
    shown = io.StringIO()
    board = ProgressBoard(1, plan, console=Console(file=shown, width=200), labels=tables.phase_labels("pipedrive", plan))
    assert board.labels[last] == said
