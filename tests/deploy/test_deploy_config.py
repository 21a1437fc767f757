"""The files in deploy/ load as Dagster config: each instance file passes Dagster's instance schema
and its run launcher's (and compute log manager's) own config schema, the workspace file passes the
workspace schema, and the celery file passes the celery executor's schema and is what the project's
executor selection (migration_pipeline/lane/executors.py) hands to Dagster. The docker and k8s launchers
cannot run here (no daemon, no cluster); this is how far their files are tested."""
from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config

from engine_core.errors import ConfigError
from migration_pipeline.lane import executors

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
INSTANCES = [DEPLOY / "dagster.yaml", *sorted((DEPLOY / "alternatives").glob("*.yaml"))]
ENV = {"MIGRATE_DAGSTER_STORAGE_URL": "postgresql+psycopg2://migrate@db:5432/migrate_dagster",
       "MIGRATE_IMAGE": "migrate:1", "MIGRATE_CELERY_BROKER": "pyamqp://migrate@broker:5672//",
       "MIGRATE_CODE_HOST": "code", "MIGRATE_CODE_PORT": "4000"}


def _instance_config(path: Path, tmp_path: Path) -> dict:
    from dagster._core.instance.config import dagster_instance_config

    shutil.copy(path, tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    return config


@pytest.mark.parametrize("path", INSTANCES, ids=lambda p: p.name)
def test_instance_files_pass_dagster_and_their_launchers_schemas(path, tmp_path, monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    config = _instance_config(path, tmp_path)
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "MIGRATE_DAGSTER_STORAGE_URL"}
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": "dagster/partition", "limit": 4} in limits  # the lane, as on one machine
    for key in ("run_launcher", "compute_logs"):
        block = config.get(key)
        if not block:
            continue
        pytest.importorskip(block["module"].split(".")[0])
        cls = getattr(importlib.import_module(block["module"]), block["class"])
        result = process_config(cls.config_type(), block.get("config") or {})
        assert result.success, (path.name, key, [e.message for e in result.errors or []])


def test_a_misspelt_launcher_key_is_caught(tmp_path, monkeypatch):
    """The check above has teeth: a key the launcher does not know fails its schema."""
    pytest.importorskip("dagster_docker")
    from dagster_docker import DockerRunLauncher

    block = yaml.safe_load((DEPLOY / "alternatives" / "dagster-docker.yaml").read_text())["run_launcher"]
    block["config"]["netwrok"] = block["config"].pop("network")
    monkeypatch.setenv("MIGRATE_IMAGE", "migrate:1")
    assert not process_config(DockerRunLauncher.config_type(), block["config"]).success


def test_workspace_points_at_the_code_server(monkeypatch):
    from dagster._core.workspace.config_schema import WORKSPACE_CONFIG_SCHEMA
    from dagster._config import Shape

    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    workspace = yaml.safe_load((DEPLOY / "workspace.yaml").read_text())
    result = process_config(Shape(WORKSPACE_CONFIG_SCHEMA), workspace)
    assert result.success, result.errors
    server = result.value["load_from"][0]["grpc_server"]
    assert (server["host"], server["port"], server["location_name"]) == ("code", 4000, "migration_pipeline.definitions")


def test_celery_file_is_the_executor_and_the_workers_config(monkeypatch):
    pytest.importorskip("dagster_celery")
    from dagster_celery import celery_executor
    from dagster_celery.cli import get_validated_config

    monkeypatch.setenv("MIGRATE_CELERY_BROKER", ENV["MIGRATE_CELERY_BROKER"])
    worker = get_validated_config(str(DEPLOY / "celery.yaml"))  # what `dagster-celery worker start -y` reads
    assert worker["broker"] == ENV["MIGRATE_CELERY_BROKER"]
    assert worker["config_source"]["task_acks_late"] is True  # a dead worker host hands its step back

    assert executors.executor_def({}).name == "in_process"
    executor = executors.executor_def({"MIGRATE_EXECUTOR": "celery"})
    assert executor.name == "celery" and executor is not celery_executor
    with pytest.raises(ConfigError, match="MIGRATE_EXECUTOR='dask'"):
        executors.executor_def({"MIGRATE_EXECUTOR": "dask"})
    with pytest.raises(ConfigError, match="no such file"):
        executors.executor_def({"MIGRATE_EXECUTOR": "celery", "MIGRATE_CELERY_CONFIG": "/nonexistent.yaml"})
