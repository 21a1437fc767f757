"""Two `migrate run` of one tenant at once: the second joins the first's engine run (the engine's
admission: one live run per tenant and source) and says so on stderr when it launches and in its
"what now" (its first phase op tags its Dagster run `migration/joined`); both end with the same run
succeeded, every row written once."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from engine_core import db as dbmod
from engine_core import runs
from tests.dagster.test_cli_what_now import MIGRATE, SMALL, env  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)


def test_a_second_run_of_a_running_tenant_says_it_joined(env, db_url):  # noqa: F811
    slow = {**SMALL, "malformed": {}, "dangling": {}, "row_delay": 0.05}
    args = ["run", "--tenant", "twice", "--timeout", "240"]
    first = subprocess.Popen([MIGRATE, *args, "--options", json.dumps(slow)], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        with dbmod.Database(db_url, max_size=2) as db:
            deadline = time.monotonic() + 120
            live = None
            while live is None and time.monotonic() < deadline and first.poll() is None:
                live = runs.live_run(db, "twice", "example")
                time.sleep(0.2)
            assert live is not None, first.communicate()
            second = subprocess.run([MIGRATE, *args], env=env, capture_output=True, text=True, timeout=240)
            out, err = first.communicate(timeout=240)
            assert first.returncode == 0 and second.returncode == 0, (err[-2000:], second.stderr[-2000:])
            assert f"note: this launch joins the running {live.name}" in second.stderr, second.stderr[-2000:]
            assert "joins" not in err and "(joined" not in out, err[-2000:]  # the first started it
            # and its ending says so too (also when both launched before either had an engine run)
            assert f"what now: tenant 'twice': {live.name} succeeded (joined: another launch had started it)" \
                in second.stdout, second.stdout[-2000:]
            assert runs.get_run(db, live.id).status == "succeeded"
            assert [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'twice'")] == [live.id]
            dup = db.sql("SELECT kind, source_id FROM migration_records WHERE tenant_id = 'twice'"
                         " GROUP BY 1, 2 HAVING count(*) > 1")
            assert dup == []
    finally:
        if first.poll() is None:
            first.kill()
