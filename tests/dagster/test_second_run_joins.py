"""Two `migrate run` of one tenant at once: the second joins the first's engine run (the engine's
admission: one live run per tenant and source) and says so on stderr when it launches and in its
"what now" (its first phase op tags its Dagster run `migration/joined`); both end with the same run
succeeded, every row written once. A launch that joins a run which ends before the launch's phase ops
start works on that run all the same: it reports it succeeded, exit 0."""
from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from tests.dagster.test_cli_what_now import MIGRATE, SMALL, env  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)


# Test-only, on the first `migrate run`'s PYTHONPATH: its workers close the run's last phase (and so
# end the run) only once the test has seen the second launch decide to join - however slowly the
# second starts on a busy machine, it finds the run live (a run that ended first refuses it, rightly).
_HOLD_THE_END = """\
import os, time
import engine_core.worker as worker

_advance, _release = worker.advance_phase, os.environ["JOIN_TEST_RELEASE"]


def _after_the_second_joined(db, run_id, phase, *args, **kwargs):
    if phase >= 4:  # the example plan's last phase: closing it ends the run
        deadline = time.monotonic() + 200
        while not os.path.exists(_release) and time.monotonic() < deadline:
            time.sleep(0.05)
    return _advance(db, run_id, phase, *args, **kwargs)


worker.advance_phase = _after_the_second_joined
"""


def _with_site(env: dict[str, str], site, text: str) -> dict[str, str]:
    site.mkdir()
    (site / "sitecustomize.py").write_text(text)
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)}


def test_a_second_run_of_a_running_tenant_says_it_joined(env, db_url, tmp_path):  # noqa: F811
    slow = {**SMALL, "malformed": {}, "dangling": {}, "row_delay": 0.05}
    args = ["run", "--tenant", "twice", "--timeout", "240"]
    release = tmp_path / "release"
    first = subprocess.Popen([MIGRATE, *args, "--options", json.dumps(slow)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**_with_site(env, tmp_path / "hold", _HOLD_THE_END), "JOIN_TEST_RELEASE": str(release)})
    second = None
    try:
        with dbmod.Database(db_url, max_size=2) as db:
            deadline = time.monotonic() + 120
            live = None
            while live is None and time.monotonic() < deadline and first.poll() is None:
                live = runs.live_run(db, "twice", "example")
                time.sleep(0.2)
            assert live is not None, first.communicate()
            second = subprocess.Popen([MIGRATE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            said = []
            for line in second.stderr:  # its note comes before its launch; the first run may end from then on
                said.append(line)
                if "note: this launch joins" in line:
                    break
            release.touch()
            out2, err2 = second.communicate(timeout=240)
            err2 = "".join(said) + err2
            out, err = first.communicate(timeout=240)
            assert first.returncode == 0 and second.returncode == 0, (err[-2000:], err2[-2000:])
            assert f"note: this launch joins the running {live.name}" in err2, err2[-2000:]
            assert "joins" not in err and "(joined" not in out, err[-2000:]  # the first started it
            # and its ending says so too (also when both launched before either had an engine run)
            assert f"what now: tenant 'twice': {live.name} succeeded (joined: another launch had started it)" \
                in out2, out2[-2000:]
            assert runs.get_run(db, live.id).status == "succeeded"
            assert [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'twice'")] == [live.id]
            dup = db.sql("SELECT kind, source_id FROM migration_records WHERE tenant_id = 'twice'"
                         " GROUP BY 1, 2 HAVING count(*) > 1")
            assert dup == []
    finally:
        release.touch()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()


# Test-only, on the joining `migrate run`'s PYTHONPATH: once the launch has decided to join (its note
# printed), the run it joins is driven to its end here, before the Dagster run is placed - the moment
# the joined run ends while the launch is still joining, made certain.
_END_BEFORE_PLACING = """\
import os
import migration_pipeline.launch.place as place
from engine_core import db as dbmod, runs
from engine_core.providers.registry import for_run
from engine_core.worker import drain_threads

_place = place.place_tenant_run


def _after_the_joined_run_ended(*args, **kwargs):
    with dbmod.Database(os.environ["DATABASE_URL"], max_size=2) as db:
        run = runs.live_run(db, "ended", "example")
        drain_threads(db, run.id, width=2, providers=for_run)
        assert runs.get_run(db, run.id).status == "succeeded"
    return _place(*args, **kwargs)


place.place_tenant_run = _after_the_joined_run_ended
"""


def test_a_launch_joining_a_run_that_ends_before_its_phases_start_reports_it_succeeded(env, db_url, tmp_path):  # noqa: F811
    with dbmod.Database(db_url, max_size=2) as db:
        live = runs.start_run(db, provider_for("example"), "ended", options=SMALL)  # live, nobody drives it yet
        joining = subprocess.run([MIGRATE, "run", "--tenant", "ended", "--timeout", "240"], capture_output=True,
                                 text=True, timeout=240, env=_with_site(env, tmp_path / "end_before_placing",
                                                                        _END_BEFORE_PLACING))
        assert f"note: this launch joins the running {live.name}" in joining.stderr, joining.stderr[-2000:]
        assert joining.returncode == 0, (joining.stdout[-2000:], joining.stderr[-2000:])
        assert f"what now: tenant 'ended': {live.name} succeeded (joined: another launch had started it)" \
            in joining.stdout, joining.stdout[-2000:]
        assert [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'ended'")] == [live.id]
