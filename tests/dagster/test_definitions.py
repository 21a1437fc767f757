"""The Dagster face's shape: definitions load, one asset per phase chained by deps, dynamic tenant
partitions, the sensors, the lane limit keyed on what every launch path carries, the storage URL,
and the boundary (the engine imports no Dagster)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from dagster import AssetKey, DynamicPartitionsDefinition

from engine_core.providers.pipedrive.plan import PHASES as PIPEDRIVE_PHASES
from migration_pipeline import tags
from migration_pipeline.assets.phases import build_phase_assets
from migration_pipeline.instance import instance_config, to_url
from migration_pipeline.partitions import tenants

ROOT = Path(__file__).resolve().parents[2]


def _load(source: str):
    # a fresh interpreter per source: definitions.py reads MIGRATE_SOURCE at import
    code = (
        "import os, json; os.environ['MIGRATE_SOURCE'] = %r\n"
        "from migration_pipeline.definitions import defs, SOURCE\n"
        "defs.validate_loadable(defs)\n"
        "repo = defs.get_repository_def()\n"
        "g = repo.asset_graph\n"
        "print(json.dumps({'source': SOURCE,"
        " 'assets': sorted(k.to_user_string() for k in g.get_all_asset_keys()),"
        " 'jobs': sorted(j.name for j in repo.get_all_jobs()),"
        " 'sensors': {s.name: s.minimum_interval_seconds for s in repo.sensor_defs},"
        " 'checks': len(g.asset_check_keys)}))\n" % source
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def test_defs_load_on_the_example_source():
    got = _load("example")
    assert got["source"] == "example"
    assert got["assets"] == [
        "example/phase_1_companies", "example/phase_2_contacts", "example/phase_3_deals",
        "example/phase_4_activities", "example/phase_5_notes",
    ]
    assert {"migrate_tenant", "drain_tenant", "__ASSET_JOB"} <= set(got["jobs"])
    assert got["sensors"] == {"reaper": 300, "lane_poller": 15}
    assert got["checks"] == 4 * 5  # per phase: rows written once, ledger = target, kinds add up, all rows landed


def test_an_unknown_source_falls_back_to_the_example_provider():
    assert _load("no-such-source")["source"] == "example"


def test_one_asset_per_phase_of_the_pipedrive_plan_chained_by_deps():
    assets = build_phase_assets("pipedrive", phases=PIPEDRIVE_PHASES)
    assert len(assets) == len(PIPEDRIVE_PHASES) == 8
    keys = [a.key for a in assets]
    assert keys[0] == AssetKey(["pipedrive", "phase_1_fields_users_pipelines"])
    for previous, current in zip(assets, assets[1:]):
        deps = {d for deps in current.asset_deps.values() for d in deps}
        assert deps == {previous.key}, f"{current.key} should depend on {previous.key} only"
    assert not {d for deps in assets[0].asset_deps.values() for d in deps}
    for a in assets:
        assert a.partitions_def is tenants


def test_the_tenant_partitions_are_dynamic():
    assert isinstance(tenants, DynamicPartitionsDefinition)
    assert tenants.name == "tenants"


def test_the_lane_limit_counts_every_partitioned_run():
    config = instance_config(lane_width=4)
    limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
    assert {"key": tags.PARTITION, "limit": 4} in limits
    assert "run_coordinator" not in config  # the default QueuedRunCoordinator applies `concurrency:`
    for key in ("run_storage", "event_log_storage", "schedule_storage"):
        assert config[key]["module"] == "migration_pipeline.storage"
        assert config[key]["config"]["postgres_url"] == {"env": "MIGRATE_DAGSTER_STORAGE_URL"}
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["enabled"]
    assert config["telemetry"] == {"enabled": False}
    assert instance_config(lane_width=6)["concurrency"]["runs"]["tag_concurrency_limits"][0]["limit"] == 6


def test_the_instance_config_is_valid_for_dagster(tmp_path, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_config(lane_width=4)))
    monkeypatch.setenv("MIGRATE_DAGSTER_STORAGE_URL", "postgresql+psycopg2://u@/d?host=/tmp")
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["concurrency"]["runs"]["tag_concurrency_limits"][0]["key"] == "dagster/partition"


def test_the_workspace_loads_the_only_definitions():
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "migration_pipeline.definitions"


def test_the_drainer_job_is_partitioned_so_its_runs_count_in_the_lane():
    from migration_pipeline.jobs import drainer_job

    job = drainer_job()
    assert job.partitions_def is tenants
    assert job.tags[tags.ROLE] == tags.DRAINER


def test_storage_url_keeps_the_socket_host_in_the_query_and_uses_psycopg2():
    dsn = "user=postgres dbname=test_x host=/work/main/.migrate/pgdata"
    assert to_url(dsn) == "postgresql://postgres@/test_x?host=%2Fwork%2Fmain%2F.migrate%2Fpgdata"
    assert to_url("postgresql://postgres:s%40cret@db.example:5433/migrate?sslmode=require",
                  scheme="postgresql+psycopg2", dbname="dagster") == (
        "postgresql+psycopg2://postgres:s%40cret@db.example:5433/dagster?sslmode=require")


def test_the_engine_imports_no_dagster():
    code = (
        "import sys, importlib, pkgutil\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'dagster' or name.startswith('dagster.') or name.startswith('dagster_'):\n"
        "            raise ImportError('engine_core must not import ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import engine_core\n"
        "for m in pkgutil.walk_packages(engine_core.__path__, 'engine_core.'):\n"
        "    importlib.import_module(m.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def test_only_definitions_py_builds_definitions():
    offenders = [
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "migration_pipeline").rglob("*.py")
        if "Definitions(" in p.read_text() and p.name != "definitions.py"
    ]
    assert offenders == []


def test_a_fresh_clone_has_what_the_readme_and_the_instance_need():
    # issue 10, item 6: dagster.yaml is the instance file at the root, beside workspace.yaml (the
    # commands copy it into DAGSTER_HOME), and the README points at nothing outside the clone
    from migration_pipeline.instance import INSTANCE_TEMPLATE

    assert INSTANCE_TEMPLATE == ROOT / "dagster.yaml" and INSTANCE_TEMPLATE.exists()
    assert (ROOT / "workspace.yaml").exists() and not (ROOT / "migration_pipeline" / "dagster.yaml").exists()
    readme = (ROOT / "README.md").read_text()
    assert "../" not in readme, [ln for ln in readme.splitlines() if "../" in ln]
    for target in re.findall(r"\]\(([^)#\s]+)", readme):  # relative links resolve inside the clone
        if not re.match(r"^[a-z]+://|^mailto:", target):
            assert (ROOT / target).exists(), target
