"""The demo's tenant is one a newcomer finds again: `demo`, then `demo-2`, `demo-3`, ... (the
live demo: `demo-live`, `demo-live-2`, ...), never a process id; a second demo keeps the first as
it was and says so, with its status."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine_core import db as dbmod
from engine_core import runs, runs_reads
from migration_pipeline.cli.demo import demo_tenant
from migration_pipeline.instance import STORAGE_URL_ENV, to_url

pytestmark = pytest.mark.timeout(400)

MIGRATE = str(Path(sys.executable).parent / "migrate")


def test_demo_tenant_is_the_first_free_name_of_its_family():
    assert demo_tenant([]) == ("demo", [])
    assert demo_tenant(["demo", "acme"]) == ("demo-2", ["demo"])
    # an old pid-named demo is of the family but does not push the numbers up; a gap is filled
    assert demo_tenant(["demo", "demo-3", "demo-11480", "demo-live"]) == ("demo-2", ["demo", "demo-3", "demo-11480"])
    assert demo_tenant(["demo", "demo-live"], "demo-live") == ("demo-live-2", ["demo-live"])
    assert demo_tenant(["demo-x", "demo2", "demo-"]) == ("demo", [])


def test_a_second_demo_keeps_the_first_and_says_so(db_url, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})

    def demo() -> str:
        out = subprocess.run([MIGRATE, "demo", "--in-process"], env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
        return " ".join(out.stdout.split())

    first = demo()
    assert "tenant: 'demo' (a later demo keeps it and migrates 'demo-2')" in first, first[:600]
    assert "what now: tenant 'demo':" in first
    with dbmod.Database(db_url, max_size=2) as db:
        kept = runs.latest_run(db, "demo")
    second = demo()
    assert (f"tenant: 'demo-2'; the earlier demo tenant(s) are kept as they were ('demo' {kept.status}): "
            "`migrate status` lists them") in second, second[:600]
    assert "what now: tenant 'demo-2':" in second
    with dbmod.Database(db_url, max_size=2) as db:
        assert runs.latest_run(db, "demo").id == kept.id  # untouched: no run of the second demo on it
        assert runs_reads.tenants(db) == ["demo", "demo-2"]
