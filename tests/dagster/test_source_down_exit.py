"""A `migrate run` whose source goes down mid-run (every request answered 503) is paused by the
engine after MIGRATE_SOURCE_DOWN_SECONDS, and the command says so apart from an operator's stop:
its own exit code (`output.SOURCE_FAILED`, not `STOPPED_ELSEWHERE`, which `migrate stop` and the
UI's Terminate keep) and a closing line naming the source's failure and the command that resumes
the run once the source answers. The real path: a sandbox whose faults turn to `503:1.0` once the
run is working, the command executing its Dagster run in its own process."""
from __future__ import annotations

import os
import signal
import subprocess

import httpx
import pytest

from migration_pipeline.cli import output
from tests.dagster.support import migrate_env, sandbox_account
from tests.dagster.test_launch_in_process import MIGRATE, _instance, _started_and_attached, _until

pytestmark = pytest.mark.timeout(420)


def run_while_the_source_goes_down(db_url: str, tmp_path, tenant: str, **env_extra: str):
    """`migrate run --tenant TENANT` in its own process over a small sandbox account with realistic
    latency (the run is still reading when the source starts failing), MIGRATE_SOURCE_DOWN_SECONDS=2;
    once its Dagster run is attached to an engine run, every request answers 503. Returns the
    finished process, its Dagster run, stdout and stderr. `env_extra`: more of the command's
    environment."""
    with sandbox_account(scale="small", latency="realistic") as base_url:
        env = migrate_env(db_url, str(tmp_path / "home"), base_url, MIGRATE_SOURCE_DOWN_SECONDS="2",
                          MIGRATE_RETRY_BACKOFF_SECONDS="0.2", **env_extra)
        proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        instance = _instance(env)
        try:
            run = _until("a started run attached to an engine run", _started_and_attached(instance, tenant), proc=proc)
            # the sandbox "killed": every request from now on answers 503
            httpx.post(f"{base_url}/_sandbox/config", json={"faults": "503:1.0"}, timeout=10).raise_for_status()
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            instance.dispose()
    return proc, run, out, err


def test_a_run_the_engine_paused_for_a_failing_source_has_its_own_exit_code_and_line(db_url, tmp_path):
    tenant = "down"
    proc, run, out, err = run_while_the_source_goes_down(db_url, tmp_path, tenant)
    assert proc.returncode == output.SOURCE_FAILED != output.STOPPED_ELSEWHERE, \
        (proc.returncode, out[-2000:], err[-3000:])
    engine = run.tags["migration/run_id"]
    said = [ln for ln in (out + err).splitlines() if "resumes it" in ln]
    assert len(said) == 1, out + err
    assert said[0].startswith(f"run #{engine} (") and "paused by the engine: the source failed every request" in said[0] \
        and "(last: HTTP 503)" in said[0], said
    assert f"`migrate run --tenant {tenant}` resumes it where it stopped once the source answers" in said[0], said
    assert "`migrate stop`" not in said[0] and "from elsewhere" not in said[0], said
