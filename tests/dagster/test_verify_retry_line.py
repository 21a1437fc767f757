"""`migrate verify` over a source that answers some requests 503 prints one line summing the
retries by cause (stderr), not a line per retry before its result; the result and --json are as
before."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from migration_pipeline.instance import to_url
from tests.pipedrive.support import TOKEN, failed_tasks, migrate, sandbox

pytestmark = pytest.mark.timeout(300)
MIGRATE = str(Path(sys.executable).parent / "migrate")


def test_verify_sums_its_retries_in_one_line(db, db_url, tmp_path):
    with sandbox() as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        sb.configure(faults="503:0.25")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
        env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), PIPEDRIVE_BASE_URL=sb.base_url,
                   PIPEDRIVE_API_TOKEN=TOKEN)
        out = subprocess.run([MIGRATE, "verify", "acme"], env=env, capture_output=True, text=True, timeout=240)
        as_json = subprocess.run([MIGRATE, "verify", "acme", "--json"], env=env, capture_output=True, text=True,
                                 timeout=240)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    assert "PASSED" in out.stdout
    assert not re.search(r"retry \d+/\d+", out.stderr + out.stdout), out.stderr[-2000:]
    (line,) = [ln for ln in out.stderr.splitlines() if ln.strip()]
    found = re.fullmatch(r"the source was retried (\d+) time\(s\) \(HTTP 503 x (\d+)\); .*", line)
    assert found and found[1] == found[2] and int(found[1]) > 0, line
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["passed"] is True
