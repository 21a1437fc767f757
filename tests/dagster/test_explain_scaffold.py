"""The `explain_row` launchpad pre-fills only what it explains: its scaffold (the run config
schema's default YAML, what the launchpad opens with: dagster-graphql's `rootDefaultYaml`) holds
the row to explain and no resource settings (the database's url and max_size were pre-filled there,
unexplained), and every field of the row has a description the launchpad shows."""
from __future__ import annotations

import yaml
from dagster._core.snap import JobSnap
from dagster_graphql.schema.run_config import default_values_yaml_from_type_snap

from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import EXPLAIN_JOB


def test_the_explain_row_scaffold_holds_only_the_explained_row():
    snap = JobSnap.from_job_def(build_definitions("example").resolve_job_def(EXPLAIN_JOB))
    schema = snap.config_schema_snapshot
    root = schema.get_config_snap(snap.mode_def_snaps[0].root_config_key)
    assert yaml.safe_load(default_values_yaml_from_type_snap(schema, root)) == {"ops": {"explain": {"config": {"source": ""}}}}
    ops = schema.get_config_snap(next(f.type_key for f in root.fields if f.name == "ops"))
    explain = schema.get_config_snap(next(f.type_key for f in ops.fields if f.name == "explain"))
    config = schema.get_config_snap(next(f.type_key for f in explain.fields if f.name == "config"))
    assert {f.name for f in config.fields} == {"tenant", "kind", "source_id", "source"}
    assert all(f.description for f in config.fields), [(f.name, f.description) for f in config.fields]
