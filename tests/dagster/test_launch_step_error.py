"""A `migrate run` whose step fails says the engine's own error on its failure line (the innermost
cause of Dagster's STEP_FAILURE error), not only Dagster's wrapper
`DagsterExecutionStepExecutionError: Error occurred while executing op ...`: a fresh user found the
clear one-line engine error (here: `SourceMismatch`, a worker whose settings reach another source
than the run reads) only in DAGSTER_HOME/in-process-runs.log.
"""
from __future__ import annotations

import json

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from tests.dagster.support import example_env
from tests.dagster.test_cli_errors import _migrate_in_process

EXAMPLE = {"page_size": 20, "counts": {"companies": 10, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
OTHER = "company 6000003"


def _running_run_of_another_source(db_url: str, tenant: str) -> int:
    """An engine run of `tenant` that is running and reads another source (its recorded identity is
    not the example source's account): the command's worker joins it and refuses it (SourceMismatch).
    A dry run: the launch's own check of the tenant's source (`launch.check_tenant_source`) goes by
    the runs that wrote, so the refusal comes from the step, as it does for a launch from the UI."""
    with dbmod.Database(db_url, max_size=2) as db:
        run = runs.start_run(db, provider_for("example"), tenant, options=EXAMPLE, dry_run=True)
        db.sql("UPDATE migrations SET source_identity = %(o)s WHERE id = %(r)s RETURNING 1", {"o": OTHER, "r": run.id})
    return run.id


def test_a_failed_steps_line_names_the_engine_error(db_url, tmp_path):
    env = example_env(db_url, tmp_path)
    run_id = _running_run_of_another_source(db_url, "mixed")
    out = _migrate_in_process(["run", "--tenant", "mixed", "--timeout", "120"], env)
    assert out.returncode == 1, (out.stdout[-3000:], out.stderr[-3000:])
    said = [ln for ln in out.stdout.splitlines() if " failed: " in ln]
    assert len(said) == 1, out.stdout[-3000:]
    line = said[0]
    assert line.startswith("example/phase_1_companies failed: engine_core.errors.SourceMismatch: "), line
    assert f"run #{run_id} (example for tenant 'mixed') reads {OTHER}" in line, line
    assert "this worker's source settings reach example-account" in line, line
    assert "DagsterExecutionStepExecutionError" not in out.stdout, out.stdout[-3000:]
    # and on stderr, where a launch whose stdout is piped away still says why it exits 1
    assert "FAILURE: example/phase_1_companies failed: engine_core.errors.SourceMismatch: " in out.stderr, out.stderr[-3000:]

    # --json carries the same line as the phase's message
    out = _migrate_in_process(["run", "--tenant", "mixed", "--timeout", "120", "--json"], env)
    assert out.returncode == 1, (out.stdout[-3000:], out.stderr[-3000:])
    payload = json.loads(out.stdout)
    failed = [p for p in payload["phases"] if p["status"] == "failed"]
    assert [p["message"].split(": ", 1)[0] for p in failed] == ["engine_core.errors.SourceMismatch"], failed
    assert OTHER in failed[0]["message"]

    # the in-process run hands the console back following sys.stdout, not pinned to the stream it had
    # then (every later in-process command of this process printed nowhere it could be read)
    from migration_pipeline import cli
    import migration_pipeline.cli.output

    assert cli.output.console._file is None, cli.output.console._file


def test_the_line_is_the_first_non_dagster_cause_or_the_wrapper_when_there_is_none():
    from dagster._utils.error import SerializableErrorInfo as Info

    from migration_pipeline.launch.results import step_error_line

    inner = Info("psycopg.OperationalError: connection refused\n", [], "OperationalError")
    engine = Info("engine_core.errors.EngineError: the ledger is unreachable\nmore\n", [], "EngineError", cause=inner)
    wrapper = Info('dagster._core.errors.DagsterExecutionStepExecutionError: Error occurred while executing op "x":\n',
                   [], "DagsterExecutionStepExecutionError", cause=engine)
    assert step_error_line(wrapper) == "engine_core.errors.EngineError: the ledger is unreachable"
    alone = Info("dagster._core.errors.DagsterInvariantViolationError: bad\n", [], "DagsterInvariantViolationError")
    assert step_error_line(alone) == "dagster._core.errors.DagsterInvariantViolationError: bad"
