"""`migrate status` of a run whose source fails every request says so: the tasks released with the
source's error are being retried, since when, and that the engine pauses the run once the source
has failed every request for MIGRATE_SOURCE_DOWN_SECONDS - without an ETA (it had shown the run as
running with a growing ETA and no word of retrying until the engine paused it). Over a sandbox whose
faults turn to `503:1.0` once the run has worked, its tasks drained by a real worker on real
Postgres; the status is read as the command prints it (`source_retries`)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from engine_core import runs
from engine_core.providers.registry import for_run
from engine_core.source_retries import source_retries
from engine_core.worker import Worker
from migration_pipeline.cli.inspect import status
from migration_pipeline.instance import to_url
from tests.pipedrive.support import FAST, sandbox, start

TENANT = "down"


def test_status_says_the_source_is_failing_and_being_retried(db, db_url, quick_retries) -> None:
    env = {"DATABASE_URL": to_url(db_url), "COLUMNS": "400", "MIGRATE_SOURCE_DOWN_SECONDS": "180"}
    with sandbox() as sb:
        run = start(db, sb, TENANT)
        worker = Worker(db, settings=FAST, providers=for_run)
        worker.drain(run.id, max_tasks=2)  # the run works...
        assert source_retries(db, run.id) is None
        sb.configure(faults="503:1.0")  # ...then every request answers 503
        worker.drain(run.id, max_tasks=1)
        first = source_retries(db, run.id)
        # a retry releases the task again (its updated_at moves on): the failing began no later
        db.sql("UPDATE migration_tasks SET updated_at = updated_at + interval '1 minute' "
               "WHERE migration_id = %(r)s AND error IS NOT NULL", {"r": run.id})
        assert source_retries(db, run.id).since == first.since and first.failing_all
        said = CliRunner().invoke(status, [TENANT], env=env)
        overview = CliRunner().invoke(status, [], env=env)
        doc = json.loads(CliRunner().invoke(status, [TENANT, "--json"], env=env).output)
    assert runs.get_run(db, run.id).status == "running"
    assert said.exit_code == 0, said.output
    text = " ".join(said.output.split())
    assert "the source is failing: every task that asked it since " in text, text
    assert "failed (last: TransientHTTPError: " in text and "HTTP 503" in text, text
    assert ("1 task is being retried; the engine pauses the run once the source has failed every request for 3m00s "
            f"(MIGRATE_SOURCE_DOWN_SECONDS), and `migrate run --tenant {TENANT}` resumes it once it answers") in text, text
    assert "ETA" not in text, text
    # the overview says it beside the run's status
    assert overview.exit_code == 0, overview.output
    assert "(source failing: retrying)" in " ".join(overview.output.split()), overview.output
    retrying = doc["source_retrying"]
    assert retrying["tasks"] == 1 and retrying["failing_all"] is True and "HTTP 503" in retrying["last_error"], retrying
    assert doc["progress"]["eta_seconds"] is None
