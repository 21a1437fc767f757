"""What a new user's first commands say, one line each where something is refused:

* `migrate verify` on a tenant that only had a dry run refuses in one line (exit 2) saying nothing
  was migrated and what migrates it, instead of passing an empty proof of "left out" kinds.
"""
from __future__ import annotations

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from tests.dagster.test_cli_errors import _migrate_in_process, _one_line_error
from tests.dagster.test_cli_finds import EXAMPLE, migrated  # noqa: F401 - the fixture


def test_verify_of_a_tenant_with_only_a_dry_run_refuses_in_one_line(migrated, db_url):  # noqa: F811
    with dbmod.Database(db_url, max_size=2) as db:
        run = runs.start_run(db, provider_for("example"), "dry1", options=EXAMPLE, dry_run=True)
    out = _migrate_in_process(["verify", "dry1"], migrated)
    line = _one_line_error(out, "only a dry run", f"run #{run.id}", "nothing was migrated",
                           "`migrate run --tenant dry1`")
    assert "PASSED" not in out.stdout and "left out" not in out.stdout + line, out.stdout
