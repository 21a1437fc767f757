"""`migrate ui --sandbox` starts a sandbox source and `dagster dev` wired to the database: the
UI lists the Pipedrive phase assets, the sandbox answers, the instance file is in place. A second
`migrate ui` on the same instance refuses in one line naming the first one's address and starts
nothing (one daemon per instance). SIGTERM stops every child (the CLI restores its signal handlers,
so a script that started it with SIGINT ignored can stop it): checked when the shared stack is
stopped (tests/ui/conftest.py's `ui_stack` teardown).

Needs no browser: the stack is the browser flow's, started once for tests/ui.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from migration_pipeline import launch, stack
import migration_pipeline.launch.checks
import migration_pipeline.launch.daemon
from migration_pipeline.assets.specs import phase_specs
from tests.dagster.graphql import UI

pytestmark = pytest.mark.timeout(180)


def test_migrate_ui_with_a_sandbox_serves_the_pipedrive_assets_and_a_second_ui_refuses(ui_stack):
    paths = sorted(n["assetKey"]["path"] for n in UI(ui_stack.graphql).phase_assets())
    assert paths == sorted(list(s.key.path) for s in phase_specs("pipedrive")), paths
    assert httpx.get(f"{ui_stack.sandbox}/_sandbox/health", timeout=5).json()["scale"] == "tiny"
    assert (Path(ui_stack.env["MIGRATE_HOME"]) / "dagster" / "dagster.yaml").exists()
    assert len(ui_stack.children) >= 2  # the sandbox and dagster dev
    second = subprocess.run([str(Path(sys.executable).parent / "migrate"), "ui", "--port", str(stack.free_port())],
                            env=ui_stack.env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
    assert f"already serves this instance at {ui_stack.url}" in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    # a `migrate run` with the sandbox's own settings is let in; another account is not (the lock
    # said "default#no-token" - the shell's settings before the sandbox's - and refused every run)
    (lock,) = (Path(ui_stack.env["MIGRATE_HOME"]) / "dagster").glob("daemon-*.lock")
    launch.daemon.check_same_source(lock, {"PIPEDRIVE_BASE_URL": ui_stack.sandbox, "PIPEDRIVE_API_TOKEN": "sandbox-token"})
    with pytest.raises(launch.checks.LaunchError):
        launch.daemon.check_same_source(lock, {"PIPEDRIVE_BASE_URL": ui_stack.sandbox, "PIPEDRIVE_API_TOKEN": "other"})
