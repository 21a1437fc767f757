"""What a new user's first commands say, one line each where something is refused:

* `migrate verify` on a tenant that only had a dry run refuses in one line (exit 2) saying nothing
  was migrated and what migrates it, instead of passing an empty proof of "left out" kinds;
* `migrate explain` and `migrate rows --kind` asked for `deals_archived` / `leads_archived` answer
  for the ledger kind the archived rows are kept under (`deals`, `leads`) and say so in one note
  line on stderr, instead of "not in the ledger", and the row's line ends ", archived";
* `migrate status TENANT --json` numbers `current_phase`, `phase` and every other phase number (each
  kind's, each progress and completeness entry's) from 1 in the run's own `phases` it lists (a
  Pipedrive run without the opt-in phase ends at 8/8), and `phase_asset` as the overview
  and the phase assets do (9/9; it had said 9 beside eight phases), and its `waiting` is
  the number of rows left to the catch-up (0, not null); the budget's wait is `budget_waiting`;
* a launch refused because the daemon serving the instance reads another source says which
  setting differs (the host, or "a different API token") and shows nothing derived from a token;
* `migrate plan`'s `fields` figure counts field lists, and its line says so (a run counts the
  definitions in them: 152 of 7 lists at the tiny sandbox).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
import migration_pipeline.launch.daemon
from migration_pipeline import launch
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, to_url
from tests.dagster.test_cli_errors import _env, _migrate, _migrate_in_process, _one_line_error
from tests.pipedrive.support import failed_tasks, migrate, sandbox
from tests.dagster.test_cli_finds import EXAMPLE, migrated  # noqa: F401 - the fixture


def test_verify_of_a_tenant_with_only_a_dry_run_refuses_in_one_line(migrated, db_url):  # noqa: F811
    with dbmod.Database(db_url, max_size=2) as db:
        run = runs.start_run(db, provider_for("example"), "dry1", options=EXAMPLE, dry_run=True)
    out = _migrate_in_process(["verify", "dry1"], migrated)
    line = _one_line_error(out, "only a dry run", f"run #{run.id}", "nothing was migrated",
                           "`migrate run --tenant dry1`")
    assert "PASSED" not in out.stdout and "left out" not in out.stdout + line, out.stdout


@pytest.fixture
def pipedrive_acme(db_url, tmp_path):
    """Tenant "acme" migrated from a tiny sandbox account (in this process): the env `migrate`
    needs for it, with the account's truth; the sandbox serves until the test ends."""
    with sandbox(seed=1) as sb, dbmod.Database(db_url, max_size=6) as db:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        yield _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="pipedrive",
                   PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=sb.config.token,
                   **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")}), sb.truth()


@pytest.mark.parametrize("archived", ["deals_archived", "leads_archived"])
def test_explain_and_rows_answer_an_archived_kind_under_its_ledger_kind(pipedrive_acme, archived):
    env, truth = pipedrive_acme
    kind = archived.removesuffix("_archived")
    sid = str(truth["ids"][archived][0])
    out = _migrate_in_process(["explain", "acme", archived, sid], env)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stderr.strip() == (f"note: {archived} rows are kept in the ledger under {kind}: "
                                  f"explaining {kind} {sid}"), out.stderr
    assert out.stdout.startswith(f"{kind} {sid}: imported by run #"), out.stdout
    # an archived row says so (it had read as any deal's): its product row's archived flag
    assert out.stdout.splitlines()[0].endswith(", archived"), out.stdout
    live = str(truth["ids"][kind][0])  # one of the unarchived list: no such word
    assert "archived" not in _migrate_in_process(["explain", "acme", kind, live], env).stdout
    direct = _migrate_in_process(["explain", "acme", kind, sid], env)
    assert direct.stdout == out.stdout and not direct.stderr.strip(), (direct.stdout, direct.stderr)
    rows = _migrate_in_process(["rows", "acme", "--kind", archived], env)
    assert rows.returncode == 0, rows.stderr
    assert rows.stderr.strip() == f"note: {archived} rows are kept in the ledger under {kind}: listing {kind} rows"
    assert rows.stdout == _migrate_in_process(["rows", "acme", "--kind", kind], env).stdout
    bad = _migrate_in_process(["explain", "acme", "nope", sid], env)
    line = _one_line_error(bad, "unknown kind 'nope'", kind)
    assert archived not in line, line  # the kinds offered are the ones explain reads


def test_status_json_numbers_the_phase_in_its_own_phases_and_counts_waiting_rows(pipedrive_acme):
    env, _ = pipedrive_acme
    out = _migrate_in_process(["status", "acme", "--json"], env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    overview = {o["tenant"]: o for o in json.loads(_migrate_in_process(["status", "--json"], env).stdout)}
    # read against the run's own `phases` (8 without the opt-in phase; it had said 9 beside them), the
    # asset's number beside it as the overview and the table number it
    assert len(doc["phases"]) == 8 and doc["current_phase"] == 8 and doc["phase"] == "8/8", doc["phase"]
    assert doc["phases"][doc["current_phase"] - 1] == ["catchup"], doc["phases"]
    assert doc["phase_asset"] == overview["acme"]["phase"] == "9/9", (doc["phase_asset"], overview["acme"]["phase"])
    assert len(doc["phase_assets"]) == len(doc["phases"]) and doc["phase_assets"][-1] == "9/9", doc["phase_assets"]
    assert [p["label"] for p in doc["progress"]["phases"]][-1] == "9/9"
    # every phase number of the document from 1 in its `phases`, as `current_phase` (kinds' and the
    # progress's had been from 0 beside it: the catch-up's kind said 7, its progress 7, current_phase 8)
    for k in doc["kinds"]:
        assert k["kind"] in doc["phases"][k["phase"] - 1], (k["kind"], k["phase"])
    assert [(p["phase"], p["kinds"]) for p in doc["progress"]["phases"]] == list(enumerate(doc["phases"], 1))
    assert [c["phase"] for c in doc["completeness"]] == list(range(1, len(doc["phases"]) + 1))
    assert next(k["phase"] for k in doc["kinds"] if k["kind"] == "catchup") == doc["current_phase"]
    assert doc["waiting"] == overview["acme"]["waiting"] == 0 and doc["budget_waiting"] is None, doc["waiting"]


def test_a_launch_refused_for_the_daemons_other_source_names_the_difference_without_the_token(pipedrive_acme):
    env, _ = pipedrive_acme
    full = dagster_env(env=env)
    theirs = {"PIPEDRIVE_BASE_URL": env["PIPEDRIVE_BASE_URL"], "PIPEDRIVE_API_TOKEN": "the-uis-other-token"}
    lock = launch.daemon.DaemonLock(launch.daemon.lock_path(Path(full["DAGSTER_HOME"]), full[STORAGE_URL_ENV]))
    assert lock.acquire()
    try:  # `migrate ui` serves the instance with another token of the same account host
        lock.record(by="migrate ui", pid=4242, address="http://127.0.0.1:3999", daemon_id=None,
                    source=launch.daemon.source_record(theirs))
        out = _migrate(["run", "--tenant", "acme", "--new-run"], env, timeout=120)
        recorded = lock.path.read_text()
    finally:
        lock.release()
    host = env["PIPEDRIVE_BASE_URL"].split("//", 1)[1]
    line = _one_line_error(out, "pid 4242", f"reads the source at {host}", "PIPEDRIVE_API_TOKEN is a different API token")
    assert "#" not in line and "PIPEDRIVE_BASE_URL reaches" not in line, line  # the same host is no difference
    for token in (env["PIPEDRIVE_API_TOKEN"], theirs["PIPEDRIVE_API_TOKEN"]):
        unsalted = hashlib.sha256(token.encode()).hexdigest()
        assert token not in line + recorded and unsalted[:12] not in line + recorded, line


def test_plan_says_its_fields_figure_counts_field_lists(pipedrive_acme):
    env, _ = pipedrive_acme
    out = _migrate_in_process(["plan", "fresh"], env)
    assert out.returncode == 0, (out.stdout, out.stderr)
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("fields "))
    lists = int(line.split()[1])
    assert line.endswith(f"({lists} field lists: the run counts the definitions in them)"), line
    doc = json.loads(_migrate_in_process(["plan", "fresh", "--json"], env).stdout)
    fields = next(k for k in doc["kinds"] if k["kind"] == "fields")
    assert fields["unit"] == "field lists" and fields["rows"] == lists, fields
