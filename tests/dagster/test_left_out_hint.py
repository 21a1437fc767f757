"""The `left_out` hint (after a run, in `migrate status`, on each phase asset) names both ways to
add the opt-in kinds a run left out: `--kinds` for the command line and, for whoever reads it in
the UI, the launchpad's run config key - a key the `migrate_tenant` job takes as written."""
from __future__ import annotations

import yaml
from dagster import validate_run_config

from engine_core.plan import LAUNCHPAD_WAY, left_out_line
from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import TENANT_JOB


def test_the_hint_names_the_flag_and_the_launchpad_key_the_job_takes(monkeypatch):
    monkeypatch.setenv("PIPEDRIVE_API_TOKEN", "tok")  # the job's config reads it at validation
    monkeypatch.setenv("PIPEDRIVE_BASE_URL", "http://127.0.0.1:9")
    text = left_out_line({"participants": "opt-in", "followers": "opt-in", "notes": "not chosen"})
    lines = text.splitlines()
    assert lines[1] == "to add them: a run of those kinds alone, --kinds participants,followers", lines
    assert lines[2] == ("or in the Dagster launchpad: resources.new_run.config.kinds: [participants, followers]"), lines
    assert left_out_line({"files": "opt-in"}).splitlines()[1:] == [
        "to add it: a run of that kind alone, --kinds files",
        "or in the Dagster launchpad: resources.new_run.config.kinds: [files]"]
    assert left_out_line({"notes": "not chosen"}) == "left out: notes (not chosen)"  # nothing opt-in to add

    # the launchpad line, as YAML a user types there, is run config the tenant job accepts
    key, value = lines[2].removeprefix(LAUNCHPAD_WAY + ": ").split(": ", 1)
    config: dict = yaml.safe_load(value)
    for part in reversed(key.split(".")):
        config = {part: config}
    job = build_definitions("pipedrive").resolve_job_def(TENANT_JOB)
    assert validate_run_config(job, config)["resources"]["new_run"]["config"]["kinds"] == ["participants", "followers"]
