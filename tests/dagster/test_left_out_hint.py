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
    # a kind not chosen: a launch without kinds takes the default kinds the tenant lacks
    # (tests/dagster/test_covered_kinds.py), and the links owed to it are filled by that run
    assert left_out_line({"notes": "not chosen"}).splitlines() == [
        "left out: notes (not chosen)",
        "to add notes: a run without --kinds (or the UI's Materialize) takes the default kinds the tenant lacks; "
        "links owed to them are filled by that run"]
    assert lines[3].startswith("to add notes: a run without --kinds"), lines

    # the launchpad line, as YAML a user types there, is run config the tenant job accepts
    key, value = lines[2].removeprefix(LAUNCHPAD_WAY + ": ").split(": ", 1)
    config: dict = yaml.safe_load(value)
    for part in reversed(key.split(".")):
        config = {part: config}
    job = build_definitions("pipedrive").resolve_job_def(TENANT_JOB)
    assert validate_run_config(job, config)["resources"]["new_run"]["config"]["kinds"] == ["participants", "followers"]


def test_migrate_status_prints_the_launchpad_line_whole(db_url, tmp_path):
    # the command line prints the hint through rich, which took `[file_contents, ...]` for a markup
    # tag and printed "kinds: " alone
    from engine_core import db as dbmod
    from migration_pipeline.instance import STORAGE_URL_ENV, to_url
    from tests.dagster.test_cli_errors import _env, _migrate_in_process
    from tests.pipedrive.support import sandbox, start

    env = _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="pipedrive",
               **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        start(db, sb, "lean", kinds=["+followers"])
        out = _migrate_in_process(["status", "lean"], dict(env, PIPEDRIVE_BASE_URL=sb.base_url))
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("or in the Dagster launchpad: resources.new_run.config.kinds: [file_contents, participants, deal_history]"
            in out.stdout), out.stdout
