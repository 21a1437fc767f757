"""Fixtures of the Dagster face: engine URLs, a test instance, and a whole running Dagster stack.

The stack (`dagster dev`: webserver, daemon with the QueuedRunCoordinator and the sensors, code
server, Postgres storage) is started once per module that asks for it, on a database of its own
that holds both the engine's tables and Dagster's storage.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterInstance

from engine_core import db as dbmod
from migration_pipeline import stack as stackmod
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, to_url
from tests.conftest import _with_dbname
from tests.dagster.graphql import UI
from tests.dagster.support import tmpfs_instance


@pytest.fixture
def engine_url(db_url: str) -> str:
    """The test database as a postgresql:// URL (the fixtures hand out key=value DSNs)."""
    return to_url(db_url)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with tmpfs_instance() as inst:
        yield inst


@dataclass
class Stack:
    ui: UI
    instance: DagsterInstance
    db: dbmod.Database
    engine_url: str
    home: Path
    log: Path
    env: dict[str, str]


# Test-only: the backfill daemon sleeps `dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`
# (30 s) between passes - read by `dagster._daemon.backfill.execute_backfill_iteration_loop` at every
# pass, and no instance setting reaches it - and a backfill waits one pass to launch its run and
# another to see it done. The stack's processes get this `sitecustomize` first on PYTHONPATH: it sets
# the constant in the module as it is imported (nothing is imported early, nothing in the product
# changes; the AssetDaemon's pre-sensor interval reads it too and this project has no automation).
# What the tests prove does not depend on how often the backfill daemon passes. The sensor daemon's
# 5 s pass (`dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME`) is left as it is: each pass asks the code
# server, which already timed out (60 s) under load with the stack's runs.
BACKFILL_LOOP_SECONDS = 1
_SITECUSTOMIZE = """\
# Written by tests/dagster/conftest.py (the stack fixture): a shorter backfill daemon pass, test-only.
import importlib.abc
import importlib.machinery
import sys

_MODULE, _ATTR, _VALUE = "dagster._daemon.controller", "DEFAULT_DAEMON_INTERVAL_SECONDS", %(loop)r


class _ShortBackfillPass(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module, run=run):
            run(module)
            setattr(module, _ATTR, _VALUE)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _ShortBackfillPass())
"""


def _short_backfill_pass(home: Path, env: dict[str, str]) -> None:
    """Put the sitecustomize above first on the stack processes' PYTHONPATH (env changed in place)."""
    site = home / "short_backfill_pass"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE % {"loop": BACKFILL_LOOP_SECONDS})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)


@pytest.fixture(scope="module")
def stack(server_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    name = f"test_stack_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = to_url(_with_dbname(server_url, name))
    home = tmp_path_factory.mktemp("dagster_home")
    log = home / "dagster-dev.log"
    env = dict(os.environ)
    for key in ("DAGSTER_HOME", STORAGE_URL_ENV):
        env.pop(key, None)
    env.update(
        DATABASE_URL=url,
        MIGRATE_SOURCE="example",
        MIGRATE_LANE_WIDTH="4",
        # One lane thread per launch: these tests prove the lane's limit and fairness with drainer
        # runs (sensor-requested processes) and a run page's retries; a launch's own threads (the
        # default) are proven in-process by test_lane_threads.py and test_overhead_lanes.py.
        MIGRATE_LAUNCH_THREADS="1",
        MIGRATE_HEARTBEAT_SECONDS="0",
        MIGRATE_LANE_INTERVAL_SECONDS="2",
        MIGRATE_REAPER_INTERVAL_SECONDS="5",
        **{STORAGE_URL_ENV: to_url(url, scheme="postgresql+psycopg2")},
    )
    env = dagster_env(home, env)
    _short_backfill_pass(home, env)
    port = stackmod.free_port()
    proc = stackmod.dagster_dev(env, port, log_path=log, cwd=str(Path(__file__).resolve().parents[2]))
    saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", STORAGE_URL_ENV)}
    db = dbmod.Database(url, max_size=4)
    try:
        gql = stackmod.wait_for_webserver(port, proc, timeout=150)
        os.environ[STORAGE_URL_ENV] = env[STORAGE_URL_ENV]
        inst = DagsterInstance.from_config(str(home))
        yield Stack(UI(gql), inst, db, url, home, log, env)
        inst.dispose()
    finally:
        stackmod.stop(proc)
        db.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with psycopg.connect(server_url, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
