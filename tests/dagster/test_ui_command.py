"""`migrate ui --sandbox` starts a sandbox source and `dagster dev` wired to the database: the
UI lists the Pipedrive phase assets, the sandbox answers, and SIGTERM stops every child (the CLI
restores its signal handlers, so a script that started it with SIGINT ignored can stop it). A second
`migrate ui` on the same instance refuses in one line naming the first one's address and starts
nothing (one daemon per instance)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from migration_pipeline import stack
from migration_pipeline.assets.phases import phase_specs
from migration_pipeline.instance import STORAGE_URL_ENV, to_url
from tests.dagster.graphql import UI

pytestmark = pytest.mark.timeout(180)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_migrate_ui_with_a_sandbox_serves_the_pipedrive_assets_and_stops_cleanly(db_url, tmp_path):
    port, sandbox_port = stack.free_port(), stack.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE")}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    log = open(tmp_path / "ui.log", "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "migrate"), "ui", "--sandbox", "--port", str(port),
         "--sandbox-port", str(sandbox_port), "--scale", "tiny"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a script's `&` would
    )
    try:
        gql = stack.wait_for_webserver(port, proc, timeout=150)
        paths = sorted(n["assetKey"]["path"] for n in UI(gql).phase_assets())
        assert paths == sorted(list(s.key.path) for s in phase_specs("pipedrive")), paths
        assert httpx.get(f"http://127.0.0.1:{sandbox_port}/_sandbox/health", timeout=5).json()["scale"] == "tiny"
        assert (tmp_path / "home" / "dagster" / "dagster.yaml").exists()
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        assert len(children) >= 2  # the sandbox and dagster dev
        second = subprocess.run([str(Path(sys.executable).parent / "migrate"), "ui", "--port", str(stack.free_port())],
                                env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert f"already serves this instance at http://127.0.0.1:{port}" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == 0, (tmp_path / "ui.log").read_text()[-3000:]
    deadline = time.monotonic() + 20
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [c for c in children if _alive(c)], "children outlived `migrate ui`"
