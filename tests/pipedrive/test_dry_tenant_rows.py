"""`migrate rows` and `migrate explain` of a tenant whose runs are all dry runs say why they have
nothing to tell - a dry run writes nothing to the ledger - and where its counts are, instead of
"0 rows" and "no run has written, skipped or failed it" as of a tenant whose rows were lost. A
tenant with a real run keeps the usual words."""
from __future__ import annotations

from click.testing import CliRunner

from migration_pipeline.cli.inspect import explain, rows_command
from migration_pipeline.instance import to_url
from tests.pipedrive.support import migrate, sandbox


def test_rows_and_explain_of_a_dry_tenant_say_a_dry_run_writes_nothing(db, db_url) -> None:
    env = {"DATABASE_URL": to_url(db_url), "COLUMNS": "400"}
    with sandbox() as sb:
        assert migrate(db, sb, "dry", kinds=["users"], dry_run=True).status == "succeeded"
        assert migrate(db, sb, "real", kinds=["users"]).status == "succeeded"
        listed = CliRunner().invoke(rows_command, ["dry"], env=env)
        told = CliRunner().invoke(explain, ["dry", "users", "999999"], env=env)
        real = CliRunner().invoke(explain, ["real", "users", "999999"], env=env)
    said = "the tenant's runs are dry runs, which write nothing to the ledger (`migrate status dry` has their counts"
    assert listed.exit_code == 0 and said in " ".join(listed.output.split()), listed.output
    assert told.exit_code == 1 and said in " ".join(told.output.split()), told.output
    assert "no run has written, skipped or failed it" in " ".join(real.output.split()), real.output
