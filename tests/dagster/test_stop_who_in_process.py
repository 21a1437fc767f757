"""Who stopped a `migrate run` that executes its Dagster run in its own process (no daemon, no UI),
said alike by the command's closing line, its --json document and `migrate status`:

* Ctrl-C of `migrate run --json`: stdout holds the stopped run's document (the engine run
  stopping/stopped, the stop line as `message`), exit 130; `status` names the launching command,
  not "from Dagster" (the in-process watcher tags the run `migration/stopped_by` as
  `stop_launched_run` does on the daemon path);
* `migrate stop` from another shell: the running command's line says "`migrate stop`", and
  `status` has one stop line, not also "from Dagster (... terminated)". (The terminate that can
  follow it - the watcher interrupting the op that marked the run CANCELING for that stop - lands
  only now and then here; test_terminate_says_who makes it land every time.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from migration_pipeline.cli import output
# the module's slow sandbox account and each test's environment on it, as test_launch_in_process's
from tests.dagster.test_launch_in_process import (MIGRATE, _instance, _started_and_attached, _until,  # noqa: F401
                                                  slow_account, slow_env)

pytestmark = pytest.mark.timeout(420)


def _stop_lines(env: dict[str, str], tenant: str) -> list[str]:
    """The "stopped ..." entries among `migrate status TENANT --json`'s reasons."""
    got = subprocess.run([MIGRATE, "status", tenant, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr[-2000:]
    reasons = json.loads(got.stdout)["reasons"]
    return [g["example"] for g in reasons if g["kind"] == "run" and str(g["example"]).startswith("stopped ")]


def test_ctrl_c_of_an_in_process_run_is_the_commands_stop_in_json_and_in_status(slow_env):
    tenant = "ctrlc-json"
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--json", "--timeout", "400"], env=slow_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    instance = _instance(slow_env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, tenant), proc=proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
        doc = json.loads(out)  # stdout is the one JSON document, as on every other path
        said = [ln for ln in err.splitlines() if "resumes it" in ln]
        assert len(said) == 1 and "stopped by this command's Ctrl-C (SIGINT)" in said[0], err[-3000:]
        assert doc["message"] == said[0], doc
        assert doc["dagster_run_id"] == run.run_id and doc["dagster_status"] == "CANCELED", doc
        assert doc["engine"]["status"] in ("stopping", "stopped"), doc["engine"]
        assert str(doc["engine"]["run_id"]) == run.tags["migration/run_id"], doc["engine"]
        assert _stop_lines(slow_env, tenant) == \
            [f"stopped by the `migrate` command that launched it (Dagster run {run.run_id[:8]})"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()


def test_migrate_stop_of_an_in_process_run_is_said_as_migrate_stop_once(slow_env):
    tenant = "stopped-by-stop"
    proc = subprocess.Popen([MIGRATE, "run", "--tenant", tenant, "--timeout", "400"], env=slow_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    instance = _instance(slow_env)
    try:
        run = _until("a started run attached to an engine run", _started_and_attached(instance, tenant), proc=proc)
        stopped = subprocess.run([MIGRATE, "stop", tenant], env=slow_env, capture_output=True, text=True, timeout=200)
        assert stopped.returncode == 0, stopped.stderr[-2000:]
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == output.STOPPED_ELSEWHERE, (proc.returncode, out[-2000:], err[-3000:])
        said = [ln for ln in (out + err).splitlines() if "resumes it" in ln]
        assert len(said) == 1 and " stopped by `migrate stop` from elsewhere" in said[0], said
        assert _stop_lines(slow_env, tenant) == ["stopped by `migrate stop`"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        instance.dispose()
