"""What a newcomer reads after a command ends:

* `migrate run` (and `sync`, `demo`: the same ending) ends with a short "what now": the verdict
  with the tenant's skipped and failed rows (as `migrate rows` counts them), `migrate rows T` when
  there are any, `migrate status T` and a psql line with a query for the tenant; under --json
  stdout stays one JSON document;
* `migrate stop T` on a succeeded or stopped tenant says "nothing to stop" with its state, and
  changes nothing;
* after a sync, `migrate run` refuses the migrated tenant naming the run that migrated it (not the
  sync's number) and pointing to `migrate sync`;
* a stopped `migrate run` ends with one line, whoever stopped it: who (this command's Ctrl-C,
  `migrate stop`, the UI's Terminate, the engine's pause) and the command that resumes it (the
  runs: test_launch_in_process's terminate and signal tests).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from engine_core import db as dbmod
from engine_core import ledger_reads, runs
from engine_core.config import Settings
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from migration_pipeline.cli.output import (SOURCE_FAILED, STOPPED_ELSEWHERE, again_line, stopped_by, stopped_exit_code,
                                          stopped_line, what_now)
from migration_pipeline.instance import STORAGE_URL_ENV, to_url

pytestmark = pytest.mark.timeout(300)

MIGRATE = str(Path(sys.executable).parent / "migrate")
# the demo's example options, smaller: two malformed contacts fail, two dangling notes are skipped
SMALL = {"page_size": 20, "counts": {"companies": 20, "contacts": 30, "deals": 10, "activities": 10, "notes": 20},
         "malformed": {"contacts": [3, 7]}, "dangling": {"notes": [5, 9]}}


@pytest.fixture
def env(db_url, tmp_path) -> dict[str, str]:
    """A `migrate` subprocess's environment on the test database, the example source."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    out.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="example",
               MIGRATE_LANE_INTERVAL_SECONDS="3600", MIGRATE_REAPER_INTERVAL_SECONDS="3600",
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    return out


def _migrate(args: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([MIGRATE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _migrated(db: dbmod.Database, tenant: str) -> runs.Run:
    run = runs.start_run(db, provider_for("example"), tenant, options=SMALL)
    drain_threads(db, run.id, width=2, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    return runs.get_run(db, run.id)


@pytest.mark.parametrize("state", ["succeeded", "stopped"])
def test_stop_on_a_finished_tenant_says_nothing_to_stop(env, db_url, state):
    with dbmod.Database(db_url, max_size=6) as db:
        if state == "succeeded":
            run = _migrated(db, "finished")
        else:
            run = runs.start_run(db, provider_for("example"), "finished", options=SMALL)
            runs.stop(db, run.id, Settings.from_env())
            run = runs.get_run(db, run.id)
            assert run.status == "stopped"
        out = _migrate(["stop", "finished"], env, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == f"{run.name} {state}: nothing to stop", out.stdout
        assert runs.get_run(db, run.id).status == state
        as_json = json.loads(_migrate(["stop", "finished", "--json"], env, timeout=60).stdout)
        assert as_json == {"run_id": run.id, "status": state, "running_tasks": 0, "nothing_to": "stop"}


def test_run_after_a_sync_names_the_run_that_migrated_the_tenant(env, db_url):
    with dbmod.Database(db_url, max_size=6) as db:
        first = _migrated(db, "synced")
        sync = runs.start_sync(db, provider_for("example"), "synced")
        drain_threads(db, sync.id, width=2, providers=for_run)
        assert runs.get_run(db, sync.id).status == "succeeded" and sync.id != first.id
    out = _migrate(["run", "--tenant", "synced"], env, timeout=120)
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    line = out.stderr.strip()
    assert f"already migrated by {first.name}" in line and f"synced by {sync.name}" in line, line
    assert "`migrate sync synced`" in line, line


def test_what_now_names_the_tenant_its_bad_rows_and_where_to_look():
    bad = {"contacts": {"skipped": 0, "failed": 2}, "notes": {"skipped": 3, "failed": 0}}
    lines = what_now("acme", "run #4 (example for tenant 'acme') succeeded", bad, "http://127.0.0.1:3000", changed={},
                     env={})
    assert lines[0] == "what now: tenant 'acme': run #4 (example for tenant 'acme') succeeded, 3 row(s) skipped, 2 failed"
    text = "\n".join(lines)
    assert "http://127.0.0.1:3000" in text and "migrate rows acme" in text and "migrate status acme" in text
    assert 'psql "$(migrate db url)" -c "SELECT' in text and "tenant_id = 'acme'" in text
    clean = "\n".join(what_now("acme", "run #4 succeeded", {}, None, changed={}))
    assert "migrate rows" not in clean and "UI" not in clean and "0 row(s) skipped, 0 failed" in clean
    assert again_line("acme", "succeeded") is None
    stopped = what_now("acme", "run #4 stopped", {}, None, again=again_line("acme", "stopped"))
    assert stopped[1].split() == ["migrate", "run", "--tenant", "acme", "resumes", "it", "where", "it", "stopped",
                                  "(each", "task", "from", "its", "checkpoint)"], stopped
    failed = what_now("acme", "sync #5 failed", {}, None, again=again_line("acme", "failed", sync=True))
    assert failed[1].split()[:4] == ["migrate", "sync", "acme", "retries"], failed
    # a dry run left the ledger empty: not a psql query on it, but its counts and the run that writes
    dry = what_now("acme", "run #6 succeeded (a dry run)", {}, None, "left out: files (opt-in)\nto add it: ...",
                   dry_run=True)
    text = "\n".join(dry)
    assert "migration_records" not in text and "migrate rows" not in text, text
    assert "nothing was written" in dry[0] and "migrate status acme" in text and "migrate run --tenant acme" in text
    assert dry[1:3] == ["  left out: files (opt-in)", "  to add it: ..."], dry  # each line of `left_out` indented


def test_run_ends_with_what_now_and_json_stays_clean(env, db_url):
    out = _migrate(["run", "--tenant", "newcomer", "--options", json.dumps(SMALL), "--timeout", "200"], env)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    with dbmod.Database(db_url, max_size=2) as db:
        bad = ledger_reads.bad_row_counts(db, "newcomer")
        run = runs.latest_run(db, "newcomer")
    skipped = sum(v["skipped"] for v in bad.values())
    failed = sum(v["failed"] for v in bad.values())
    assert skipped and failed, bad
    tail = out.stdout[out.stdout.index("what now: "):].splitlines()
    assert tail[0] == f"what now: tenant 'newcomer': {run.name} succeeded, {skipped} row(s) skipped, {failed} failed", tail
    assert any("migrate rows newcomer" in ln for ln in tail) and any("migrate status newcomer" in ln for ln in tail)
    (psql,) = [ln for ln in tail if "psql" in ln and "tenant_id = 'newcomer'" in ln]
    query = psql.split(' -c "', 1)[1].rstrip('"')
    with psycopg.connect(db_url) as c:  # the printed query runs and counts the tenant's bad rows as above
        counted = {(kind, action): n for kind, action, n in c.execute(query).fetchall()}
    assert sum(n for (_, action), n in counted.items() if action == "skipped") == skipped, counted
    # a sync ends the same way; under --json stdout is the JSON document alone
    synced = _migrate(["sync", "newcomer", "--json", "--timeout", "200"], env)
    assert synced.returncode == 0, (synced.stdout[-2000:], synced.stderr[-3000:])
    assert json.loads(synced.stdout)["engine"]["status"] == "succeeded"
    assert "what now" not in synced.stdout + synced.stderr


def test_a_stopped_runs_line_says_who_stopped_it_and_how_it_resumes():
    assert stopped_by(signal.SIGINT) == "this command's Ctrl-C (SIGINT)"
    assert stopped_by(signal.SIGTERM) == "SIGTERM to this command"
    # a stop from elsewhere, told apart by the phase step's own line (migration_pipeline.assets.phases)
    assert stopped_by(step_messages=("run #4 (x) was stopped before phase 7 closed (a stop from `migrate stop` or "
                                     "another launch); launch the partition again to resume from the checkpoints",)) \
        == "`migrate stop` from elsewhere"
    assert stopped_by(step_messages=("stopped by a terminate request; relaunch resumes engine run 4",)) \
        == "a Terminate from elsewhere (the Dagster UI's)"
    assert stopped_by(step_messages=("run #4 was stopped before phase 3 closed (paused: the source failed every "
                                     "request for 5m00s (last: HTTP 503)); launch the partition again to resume",)) \
        == "the engine's pause (the source failed every request for 5m00s (last: HTTP 503))"
    line = stopped_line("run #4 (pipedrive for tenant 'acme')", "stopped", "`migrate stop` from elsewhere", "acme",
                        "Dagster run R: CANCELED")
    assert line == ("run #4 (pipedrive for tenant 'acme') stopped by `migrate stop` from elsewhere; "
                    "`migrate run --tenant acme` resumes it where it stopped (Dagster run R: CANCELED)")
    assert "`migrate sync acme` resumes it" in stopped_line("sync #5", "stopping", "x", "acme", "d", sync=True)
    assert "launch the partition" not in line and "failed" not in line


def test_the_engines_pause_is_said_as_the_sources_failure_with_its_own_exit_code():
    """A failing source's pause is not an operator's stop: its line names the source's failure and
    the resume once the source answers, its exit code is SOURCE_FAILED; the stops keep theirs."""
    by = stopped_by(step_messages=("run #4 was stopped before phase 3 closed (paused: the source failed every "
                                   "request for 5m00s (last: HTTP 503)); launch the partition again to resume",))
    line = stopped_line("run #4 (x)", "stopped", by, "acme", "Dagster run R: CANCELED")
    assert line == ("run #4 (x) paused by the engine: the source failed every request for 5m00s (last: HTTP 503); "
                    "`migrate run --tenant acme` resumes it where it stopped once the source answers "
                    "(Dagster run R: CANCELED)")
    assert stopped_exit_code(by) == SOURCE_FAILED
    for stop in ("`migrate stop` from elsewhere", "a Terminate from elsewhere (the Dagster UI's)"):
        assert stopped_exit_code(stop) == STOPPED_ELSEWHERE
