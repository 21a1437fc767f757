"""Fixtures of the browser tests: a whole `migrate ui --sandbox` stack and a headless chromium.

The browser is Debian's chromium (`apt-get install chromium`, /usr/bin/chromium, or the path in
MIGRATE_CHROMIUM) driven by Playwright's Python package (the `dev` extras); Playwright never
downloads a browser of its own here. Without either the tests are skipped with the reason - except
under CI (CI=true), where .ci/run installs chromium and a missing browser is a failure, so the
browser test cannot pass in CI by being skipped.

Screenshots of each step go to MIGRATE_UI_SCREENSHOTS (a directory) when set, else to the test's
temporary directory; their paths are printed (`pytest -s` shows them).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from migration_pipeline import stack
from migration_pipeline.instance import STORAGE_URL_ENV, to_url
from tests.conftest import _with_dbname

CHROMIUM = Path(os.environ.get("MIGRATE_CHROMIUM", "/usr/bin/chromium"))
# The sandbox starts slow (twice its realistic per-endpoint delays): the first run's early phases
# drain for well over the 5 s between progress reports, so a report comes while most of the run
# is still ahead, with time to terminate it. The test then makes the source fast
# (POST /_sandbox/config) so the relaunch finishes quickly.
SANDBOX_LATENCY = os.environ.get("MIGRATE_UI_TEST_LATENCY", "realistic:2")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright's Python package is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return (f"no chromium at {CHROMIUM} (Debian: apt-get install chromium; or set MIGRATE_CHROMIUM); "
                "Playwright's own browser downloads are not used")
    return None


def require_browser() -> None:
    """Skip (fail under CI=true, where .ci/run installs chromium) when the browser is missing."""
    why = browser_missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"browser test cannot run under CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless chromium (Debian's binary; --no-sandbox because CI runs as root)."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                              args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--disable-quic"])
        try:
            yield b
        finally:
            b.close()


@dataclass
class UIStack:
    """A running `migrate ui --sandbox`: the UI's address, its GraphQL URL, the sandbox's address,
    the process, its log, the engine's database (to pick a row for explain_row), the environment it
    was started with, the pids of its children (the sandbox and dagster dev)."""

    url: str
    graphql: str
    sandbox: str
    proc: subprocess.Popen | None
    log: Path
    db_url: str
    env: dict[str, str]
    children: list[int]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="package")
def ui_stack(server_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UIStack]:
    """`migrate ui --sandbox --scale tiny` on free ports, as a user starts it - from a script that
    ignores SIGINT, as a `&` would - on a private MIGRATE_HOME (so a private DAGSTER_HOME) and a
    database of its own for both the engine and Dagster's storage (the documented override, so
    nothing outlives the database). Started once for tests/ui (the browser flow and the command's
    own checks share it: one start less).

    Teardown is a check too: SIGTERM ends `migrate ui` with exit code 0 and every child it started
    (the sandbox, dagster dev) exits - a failure there is an error at the last test's teardown."""
    name = f"test_ui_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    db_url = _with_dbname(server_url, name)
    tmp_path = tmp_path_factory.mktemp("ui_stack")
    port, sandbox_port = stack.free_port(), stack.free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", STORAGE_URL_ENV, "MIGRATE_SOURCE")}
    env.update(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"),
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    log_path = tmp_path / "ui.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "migrate"), "ui", "--sandbox", "--port", str(port),
         "--sandbox-port", str(sandbox_port), "--scale", "tiny", "--latency", SANDBOX_LATENCY],
        env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # as a script's `&` would
    )
    children: list[int] = []
    try:
        try:
            graphql = stack.wait_for_webserver(port, proc, timeout=180)
        except Exception:
            print(f"--- tail of {log_path}:\n{log_path.read_text(errors='replace')[-4000:]}")
            raise
        children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                   text=True).stdout.split()]
        yield UIStack(f"http://127.0.0.1:{port}", graphql, f"http://127.0.0.1:{sandbox_port}", proc, log_path,
                      to_url(db_url), env, children)
        # `migrate ui` stops its children (sandbox, dagster dev) on SIGTERM
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode == 0, log_path.read_text(errors="replace")[-3000:]
        deadline = time.monotonic() + 20
        while any(_alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [c for c in children if _alive(c)], "children outlived `migrate ui`"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def screenshots(tmp_path: Path) -> Path:
    """Where the test's screenshots go (MIGRATE_UI_SCREENSHOTS, else the test's temporary directory)."""
    given = os.environ.get("MIGRATE_UI_SCREENSHOTS", "").strip()
    where = Path(given) if given else tmp_path / "screenshots"
    where.mkdir(parents=True, exist_ok=True)
    return where
