"""`migrate status --json` (every tenant's latest run) writes its times in ISO 8601, as `migrate
status TENANT --json` does (a fresh user's find: the overview wrote "2026-12-07 13:47:05...", the
tenant's document "2026-12-07T13:47:05...")."""
from __future__ import annotations

import json
from datetime import datetime

from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline.instance import to_url
from tests.dagster.test_cli_errors import _migrate_in_process
from tests.engine.support import FAST


def test_the_overview_json_writes_its_times_as_the_tenants_document_does(db, db_url):
    opts = {"page_size": 10, "counts": {"companies": 4, "contacts": 3, "deals": 2, "activities": 2, "notes": 2}}
    run = runs.start_run(db, provider_for("example"), "isotimes", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    env = {"DATABASE_URL": to_url(db_url)}
    out = _migrate_in_process(["status", "--json"], env)
    assert out.returncode == 0, out.stderr[-2000:]
    (row,) = [o for o in json.loads(out.stdout) if o["tenant"] == "isotimes"]
    tenant = json.loads(_migrate_in_process(["status", "isotimes", "--json"], env).stdout)
    for key in ("started_at", "finished_at"):
        assert "T" in row[key] and datetime.fromisoformat(row[key]) == datetime.fromisoformat(tenant[key]), \
            (key, row[key], tenant[key])
    assert row["no_live_worker_since"] is None
