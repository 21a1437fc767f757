"""The deployment of docs/deploy.md started on the hosts of tests/deploy/hosts.py, from the files in
deploy/: dagster.yaml (instance), workspace.yaml (the control host's view of the code server),
celery.yaml (executor and workers), rabbitmq.conf (broker). Used by the cross-host test and by
bench/deploy_hosts.py.
"""
from __future__ import annotations

import json
import os
import tempfile
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from engine_core import db as dbmod
from migration_pipeline.instance import STORAGE_URL_ENV, to_url
from tests.deploy.hosts import BIN, DEPLOY, ROOT, Topology, tail
from tests.dagster.graphql import UI

TOKEN = "deploy-sandbox-tok-3c9e51a7b2"
UNLIMITED = 100_000
CODE_PORT = 4000
UI_PORT = 3000


@dataclass
class Deployment:
    top: Topology
    engine_url: str  # as the hosts reach it (over the bridge)
    storage_url: str
    broker: str
    home: Path
    env: dict[str, str]
    ui: UI
    sandbox_url: str
    workers: list[str]

    def instance(self):
        from dagster import DagsterInstance

        os.environ[STORAGE_URL_ENV] = self.storage_url
        return DagsterInstance.from_config(str(self.home))

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{tail(path, 25)}" for name, path in self.top.logs.items())


def render_instance(home: Path, lane_width: int) -> Path:
    """DAGSTER_HOME/dagster.yaml from deploy/dagster.yaml with the lane limit set to `lane_width`."""
    config = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    for limit in config["concurrency"]["runs"]["tag_concurrency_limits"]:
        if limit["key"] == "dagster/partition" and "value" not in limit:
            limit["limit"] = lane_width
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home


def host_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("DAGSTER_", "MIGRATE_", "PIPEDRIVE_"))}
    env.pop("DATABASE_URL", None)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def check_alive(procs: dict[str, Any], logs: dict[str, Path] | None, when: str) -> None:
    """Raise when one of `procs` (by log name) has exited: its name, exit code, command line and
    the last lines of its log (`logs[name]`) in the message, so the failure says why."""
    for name, p in procs.items():
        if p.poll() is not None:
            log = (logs or {}).get(name)
            output = tail(log, 60) if log is not None else "(no log)"
            argv = " ".join(str(a) for a in p.args) if isinstance(p.args, (list, tuple)) else str(p.args)
            raise RuntimeError(f"a deployment process ({name}) exited with {p.returncode} {when}\n"
                               f"command: {argv}\n--- last lines of {log}:\n{output}")


def wait_for_ui(url: str, timeout: float, procs: dict[str, Any], logs: dict[str, Path] | None = None) -> None:
    """Until the webserver at `url` serves every code location as LOADED; one of `procs` exiting
    first fails the wait (`check_alive`)."""
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_alive(procs, logs, "before the UI served")
        try:
            r = httpx.post(url, json={"query": query}, timeout=5)
            entries = r.json()["data"]["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return
        except (httpx.HTTPError, KeyError, TypeError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the webserver at {url} did not serve the code location in {timeout:.0f} s")


@contextmanager
def deployment(workers: int = 2, *, lane_width: int = 4, worker_slots: int = 2, scale: str = "tiny",
               latency: str = "none", settings: dict[str, str] | None = None) -> Iterator[Deployment]:
    """Hosts, servers and Dagster processes up; torn down (all of it) on exit."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    names = ["data", "control", "code", *[f"worker-{chr(ord('a') + i)}" for i in range(workers)]]
    workdir = Path(tempfile.mkdtemp(prefix="migrate-deploy-"))
    saved = os.environ.get(STORAGE_URL_ENV)  # Deployment.instance() sets it; later tests must not see it
    os.chmod(workdir, 0o755)  # the postgres and rabbitmq users write below it
    sandbox = None
    try:
        with Topology(names, workdir) as top:
            broker = top.start_rabbitmq("data")  # boots (~5 s) while the Postgres cluster is made
            admin = top.start_postgres("data")
            config = SandboxConfig(scale=scale, seed=1, token=TOKEN, burst_limit=UNLIMITED, latency=latency)
            sandbox, sandbox_url = start_subprocess(config, host=top.gateway)
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute('CREATE DATABASE "migrate"')
                c.execute('CREATE DATABASE "migrate_dagster"')
            engine_url = admin.rsplit("/", 1)[0] + "/migrate"
            dbmod.apply_schema(engine_url)
            storage_url = to_url(admin.rsplit("/", 1)[0] + "/migrate_dagster", scheme="postgresql+psycopg2")
            home = render_instance(workdir / "dagster_home", lane_width)
            env = host_env(
                dict(os.environ),
                DAGSTER_HOME=str(home),
                **{STORAGE_URL_ENV: storage_url},
                DATABASE_URL=engine_url,
                MIGRATE_SOURCE="pipedrive",
                MIGRATE_EXECUTOR="celery",
                MIGRATE_CELERY_BROKER=broker,
                MIGRATE_CELERY_CONFIG=str(DEPLOY / "celery.yaml"),
                MIGRATE_CODE_HOST=top.address("code"),
                MIGRATE_CODE_PORT=str(CODE_PORT),
                MIGRATE_LANE_WIDTH=str(lane_width),
                PIPEDRIVE_BASE_URL=sandbox_url,
                PIPEDRIVE_API_TOKEN=TOKEN,
                **(settings or {}),
            )
            # Dagster's storage is created here, once, before any Dagster process starts: the code
            # server, the celery workers, the daemon and the webserver each create it when it is
            # missing, and at once on an empty database one of them can lose dagster-postgres's
            # unguarded race (`type "instance_info" already exists`: DuplicateObject is not among the
            # errors it retries) and exit 1 - in CI a worker ("exited with 1 before the UI served"),
            # in a suite here the code server ("nothing listens on code:4000" after 120 s); 2 in 11
            # four-process starts on an empty storage. An operator runs `dagster instance migrate`
            # before starting the hosts for the same reason.
            os.environ[STORAGE_URL_ENV] = storage_url
            from dagster import DagsterInstance

            DagsterInstance.from_config(str(home)).dispose()
            top.wait_tcp("data", 5672, timeout=60)
            procs = {
                "code-grpc.log": top.spawn("code", [str(BIN / "dagster"), "api", "grpc", "-m", "migration_pipeline.definitions",
                                                    "-h", top.address("code"), "-p", str(CODE_PORT)], env, "code-grpc.log"),
            }
            worker_names = names[3:]
            for w in worker_names:
                procs[f"{w}-celery.log"] = top.spawn(
                    w, [str(BIN / "dagster-celery"), "worker", "start", "-A", "dagster_celery.app",
                        "-y", str(DEPLOY / "celery.yaml"), "-n", w, "-l", "INFO", "--",
                        f"--concurrency={worker_slots}"], env, f"{w}-celery.log")
            top.wait_tcp("code", CODE_PORT, timeout=120,
                         alive=lambda: check_alive(procs, top.logs, "before the code server listened"))
            workspace = ["-w", str(DEPLOY / "workspace.yaml")]
            procs["control-daemon.log"] = top.spawn("control", [str(BIN / "dagster-daemon"), "run", *workspace], env,
                                                    "control-daemon.log")
            procs["control-webserver.log"] = top.spawn("control", [str(BIN / "dagster-webserver"), "-h", top.address("control"),
                                                                   "-p", str(UI_PORT), *workspace], env, "control-webserver.log")
            url = f"http://{top.address('control')}:{UI_PORT}/graphql"
            dep = Deployment(top, engine_url, storage_url, broker, home, env, UI(url), sandbox_url, worker_names)
            try:
                wait_for_ui(url, 180, procs, top.logs)
            except BaseException:
                print(dep.logs())
                raise
            yield dep
    finally:
        if sandbox is not None:
            sandbox.terminate()
            sandbox.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
        if saved is None:
            os.environ.pop(STORAGE_URL_ENV, None)
        else:
            os.environ[STORAGE_URL_ENV] = saved


def launch_options() -> dict[str, Any]:
    """The run config of a tenant launch: no pacing (tests measure behaviour, not the burst limit)."""
    return {"resources": {"new_run": {"config": {"options_json": json.dumps({"burst_limit": UNLIMITED})}}}}


def launch_phases(ui, tenant: str) -> str:
    """The launchpad of the tenant job with every phase asset selected and the asset checks left out
    (the checks are proven in tests/dagster; here each would be one more celery task per phase)."""
    from tests.dagster.graphql import REPO, GraphQLError

    phases = [a["assetKey"]["path"] for a in ui.phase_assets() if a["assetKey"]["path"][0] == "pipedrive"]
    d = ui.q(
        """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
             __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
             ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }""",
        params={"selector": {**REPO, "jobName": "migrate_tenant", "assetSelection": [{"path": p} for p in phases],
                             "assetCheckSelection": []},
                "runConfigData": launch_options(),
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": tenant}]}})
    out = d["launchRun"]
    if out["__typename"] != "LaunchRunSuccess":
        raise GraphQLError(str(out))
    return out["run"]["runId"]


def celery_hosts(instance, run_id: str) -> list[tuple[int, str, str]]:
    """(storage id, step key, celery worker) of every 'Executing steps ... in celery worker' event."""
    from dagster import DagsterEventType

    out = []
    for rec in instance.get_records_for_run(run_id, of_type=DagsterEventType.ENGINE_EVENT).records:
        event = rec.event_log_entry.dagster_event
        md = event.engine_event_data.metadata if event and event.engine_event_data else {}
        worker = md.get("Celery worker")
        if worker is not None:
            out.append((rec.storage_id, event.step_key, str(worker.value)))
    return out
