"""`migrate status` right after a `kill -9` of the process draining a run: on real Postgres with a real
drainer process (`tests.engine.test_worker_death`'s child), SIGKILLed while it holds two tasks. Status
(text, --json, and the overview) says "no live worker since ..." with no ETA at once, not "running ...
ETA" until the stale-lock threshold has passed; while the drainer lives it says nothing of the kind.
A relaunch's note says it takes the run over, not that it joins a run another launch drives.
"""
from __future__ import annotations

import json
import os
import signal

import pytest
from click.testing import CliRunner

from engine_core import runs
from engine_core.providers.registry import provider_for
from migration_pipeline.cli.launching import ignored_on_relaunch
from migration_pipeline.cli.main import main
from migration_pipeline.instance import to_url
from tests.engine.support import FAST
from tests.engine.test_worker_death import KINDS, _spawn, _wait_for

pytestmark = pytest.mark.timeout(120)


def _status(args: list[str], db_url: str):
    env = {k: None for k in os.environ if k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_"))}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_STALE_LOCK_SECONDS="3600")  # the stale-lock rule cannot tell
    out = CliRunner().invoke(main, ["status", *args], env=env, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return out.output


def test_status_says_no_live_worker_at_once_after_the_drainer_is_killed(db, db_url, tmp_path) -> None:
    run = runs.start_run(db, provider_for("held_example"), "acme",
                         options={"page_size": 10, "counts": {k: 20 for k in KINDS}}, settings=FAST)
    child, _ = _spawn(db_url, run.id, tmp_path, {"companies:0": "go", "companies:10": "go"}, pool=4)
    try:
        _wait_for("both lanes holding a task",
                  lambda: (tmp_path / "holding-companies:0").exists() and (tmp_path / "holding-companies:10").exists())
        alive = json.loads(_status(["acme", "--json"], db_url))["progress"]
        assert alive["no_live_worker_since"] is None and not alive["unattended"], alive
        assert "no live worker" not in _status(["acme"], db_url)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert runs.get_run(db, run.id).status == "running"  # premise: its tasks still look claimed
    # some of the run done a minute after it began: a live run's status would give an ETA now
    db.sql("UPDATE migration_tasks SET status = 'succeeded', finished_at = now() WHERE migration_id = %(r)s"
           " AND status = 'pending'", {"r": run.id})
    db.sql("UPDATE migrations SET started_at = now() - interval '60 seconds' WHERE id = %(r)s", {"r": run.id})

    text = _status(["acme"], db_url)
    assert "no live worker since" in text and "ETA" not in text, text
    progress = json.loads(_status(["acme", "--json"], db_url))["progress"]
    assert progress["no_live_worker_since"] and progress["eta_seconds"] is None and progress["unattended"], progress
    overview = {o["tenant"]: o for o in json.loads(_status(["--json"], db_url))}
    assert overview["acme"]["no_live_worker_since"] and overview["acme"]["unattended"], overview
    assert "no live worker since" in _status([], db_url)
    # a relaunch takes the run over: it joins no one (nobody drives it)
    note = ignored_on_relaunch(db, "acme", run.source, {})
    assert note and "takes over the running" in note and "worker is gone" in note and "joins" not in note, note
