"""What a `migrate run` imports: Dagster's SQL storage modules load with alembic deferred
(`migration_pipeline.alembic_later`) on the launch's own path, where the definitions reach the
storages through the lane's executor before the instance is opened. A run on a storage whose
tables exist imports neither alembic nor mako (~0.13 CPU-s of each launch's Dagster imports,
measured in fresh interpreters, 6 pairs); a new storage still imports them to stamp its schema."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dagster.support import example_env, example_instance

pytestmark = pytest.mark.timeout(300)

MIGRATE = str(Path(sys.executable).parent / "migrate")
SMALL = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 2, "activities": 2, "notes": 2}}


def imported_modules(stderr: str) -> set[str]:
    """The modules a process imported, from its `-X importtime` lines (PYTHONPROFILEIMPORTTIME)."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_migrate_run_on_an_existing_storage_does_not_import_alembic(db_url, tmp_path, monkeypatch):
    instance, _ = example_instance(db_url, tmp_path / "setup", monkeypatch)  # the storage's tables, stamped
    instance.dispose()
    env = {**example_env(db_url, tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}
    out = subprocess.run([MIGRATE, "run", "--tenant", "lean", "--options", json.dumps(SMALL), "--json"], env=env,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout)["dagster_status"] == "SUCCESS"
    imported = imported_modules(out.stderr)
    assert {"migration_pipeline.storage", "dagster_postgres.utils"} <= imported  # the launch loaded the storages
    assert not {m for m in imported if m.split(".")[0] in ("alembic", "mako")}
