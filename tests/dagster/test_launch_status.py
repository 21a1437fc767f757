"""`migrate status` without a tenant: an overview of every tenant's latest run (issue 10's leftover:
it was a usage error, "Missing argument 'TENANT'", for a user who does not know the tenants' names)."""
from __future__ import annotations

import json
import os

from click.testing import CliRunner

from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline.cli.main import main

OPTIONS = {"counts": {"companies": 3, "contacts": 3, "deals": 2, "activities": 1, "notes": 1}}


def _status(args: list[str], db_url: str):
    from migration_pipeline.instance import to_url

    env = {k: None for k in os.environ if k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_"))}
    env.update(DATABASE_URL=to_url(db_url))
    return CliRunner().invoke(main, ["status", *args], env=env, catch_exceptions=False)


def test_status_without_a_tenant_lists_each_tenants_latest_run(db, db_url):
    provider = provider_for("example")
    first = runs.start_run(db, provider, "acme", options=OPTIONS)
    runs.stop(db, first.id)
    second = runs.start_run(db, provider, "globex", options=OPTIONS)

    out = _status(["--json"], db_url)
    assert out.exit_code == 0, out.output
    overview = {o["tenant"]: o for o in json.loads(out.output)}
    assert set(overview) == {"acme", "globex"}
    assert overview["acme"]["run_id"] == first.id and overview["acme"]["status"] in ("stopping", "stopped")
    assert overview["globex"]["run_id"] == second.id and overview["globex"]["status"] == "running"
    assert overview["globex"]["phase"] == f"1/{len(second.plan)}" and sum(overview["globex"]["tasks"].values()) >= 1

    out = _status([], db_url)
    assert out.exit_code == 0, out.output
    assert "acme" in out.output and "globex" in out.output and f"#{second.id}" in out.output
    assert "running" in out.output


def test_status_without_a_tenant_on_an_empty_database_says_how_to_start(db_url):
    out = _status([], db_url)
    assert out.exit_code == 0 and "no tenant has a migration run yet" in out.output
