"""What a new user's first commands say, one line each where something is refused:

* `migrate verify` on a tenant that only had a dry run refuses in one line (exit 2) saying nothing
  was migrated and what migrates it, instead of passing an empty proof of "left out" kinds;
* `migrate explain` and `migrate rows --kind` asked for `deals_archived` / `leads_archived` answer
  for the ledger kind the archived rows are kept under (`deals`, `leads`) and say so in one note
  line on stderr, instead of "not in the ledger";
* `migrate status TENANT --json` numbers the phase as the table and the phase assets do (a
  Pipedrive run without the opt-in phase ends at 9/9, not at plan index 8), and its `waiting` is
  the number of rows left to the catch-up (0, not null); the budget's wait is `budget_waiting`.
"""
from __future__ import annotations

import json

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline.instance import STORAGE_URL_ENV, to_url
from tests.dagster.test_cli_errors import _env, _migrate_in_process, _one_line_error
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
    direct = _migrate_in_process(["explain", "acme", kind, sid], env)
    assert direct.stdout == out.stdout and not direct.stderr.strip(), (direct.stdout, direct.stderr)
    rows = _migrate_in_process(["rows", "acme", "--kind", archived], env)
    assert rows.returncode == 0, rows.stderr
    assert rows.stderr.strip() == f"note: {archived} rows are kept in the ledger under {kind}: listing {kind} rows"
    assert rows.stdout == _migrate_in_process(["rows", "acme", "--kind", kind], env).stdout
    bad = _migrate_in_process(["explain", "acme", "nope", sid], env)
    line = _one_line_error(bad, "unknown kind 'nope'", kind)
    assert archived not in line, line  # the kinds offered are the ones explain reads


def test_status_json_numbers_the_phase_as_the_table_and_counts_waiting_rows(pipedrive_acme):
    env, _ = pipedrive_acme
    out = _migrate_in_process(["status", "acme", "--json"], env)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    overview = {o["tenant"]: o for o in json.loads(_migrate_in_process(["status", "--json"], env).stdout)}
    assert doc["phase"] == overview["acme"]["phase"] == "9/9", (doc["phase"], overview["acme"]["phase"])
    assert doc["current_phase"] == 9, doc["current_phase"]
    assert [p["label"] for p in doc["progress"]["phases"]][-1] == "9/9"
    assert doc["waiting"] == overview["acme"]["waiting"] == 0 and doc["budget_waiting"] is None, doc["waiting"]
