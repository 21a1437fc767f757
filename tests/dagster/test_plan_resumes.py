"""`migrate plan TENANT` for a tenant whose latest run was stopped says what the next `migrate run`
does: it resumes that run (with --new-run and --kinds alike, as `runs.attach` decides), so the
plan names the run and prices what is left of it - the kinds of its phases not closed yet, the
run's own kinds, not the default kinds of a full run."""
from __future__ import annotations

import json
from types import SimpleNamespace

import psycopg
import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.pipedrive.provider import PipedriveProvider
from migration_pipeline.cli.plan import kinds_left
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.pipedrive.support import TOKEN, sandbox, start

pytestmark = pytest.mark.timeout(300)


def test_the_plan_of_a_stopped_tenant_says_it_resumes_that_run_and_prices_its_kinds(db_url, run_env):  # noqa: F811
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        run = start(db, sb, "halt", kinds=["persons", "deals"])
        assert runs.stop(db, run.id).status == "stopped"
        plain = _migrate_in_process(["plan", "halt"], env)
        anew = _migrate_in_process(["plan", "halt", "--kinds", "notes"], env)
        doc = _migrate_in_process(["plan", "halt", "--json"], env)
        provider = PipedriveProvider(base_url=sb.base_url)
        # what the plan says is what the launch does: --new-run resumes the stopped run too
        assert runs.attach(db, provider, "halt", new_run=True, start_kwargs={"kinds": None}).run.id == run.id
    assert plain.returncode == 0, (plain.stdout[-2000:], plain.stderr[-2000:])
    head = plain.stdout.splitlines()[0]
    assert head.startswith(f"plan for halt: the next `migrate run --tenant halt` resumes the stopped run #{run.id} "
                           "where it stopped"), plain.stdout[:400]
    assert "--new-run and --kinds do not change that" in head and "a full run" not in plain.stdout, plain.stdout[:400]
    left = kinds_left(run)
    assert plain.stdout.splitlines()[1].startswith(f"what is left of it: the kinds of its phases not closed yet "
                                                   f"({', '.join(left)})"), plain.stdout[:600]
    priced = {ln.split()[0] for ln in plain.stdout.splitlines()[3:] if ln}
    assert {"persons", "deals"} <= priced and "activities" not in priced, plain.stdout  # its kinds, not the defaults
    assert anew.returncode == 0 and anew.stdout.splitlines()[0] == head, anew.stdout[:400]
    payload = json.loads(doc.stdout)
    assert payload["next"] == "resume" and payload["run"]["run_id"] == run.id, payload
    assert payload["run"]["kinds_left"] == left, payload
    assert [k["kind"] for k in payload["kinds"] if k["kind"] not in ("start", "catchup")] == left, payload
    assert "opt-in" not in plain.stdout, plain.stdout  # a resumed run keeps its kinds: no --kinds +K to add


def test_what_is_left_is_the_kinds_of_the_phases_not_closed():
    run = SimpleNamespace(plan=(("users",), ("persons", "organizations"), ("deals",), ("catchup",)), current_phase=1)
    assert kinds_left(run) == ["persons", "organizations", "deals"]
    assert kinds_left(SimpleNamespace(plan=run.plan, current_phase=3)) == []


def test_a_run_stopped_in_its_catch_up_is_priced_by_the_catch_up_of_all_its_kinds(db_url, run_env):  # noqa: F811
    """A run stopped in its last phase has no list phase left, yet its catch-up walks every list
    of the run: the plan prices that walk, as a plan of the run's kinds prices its catch-up."""
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        run = start(db, sb, "late", kinds=["persons", "deals"])
        assert runs.stop(db, run.id).status == "stopped"
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("UPDATE migrations SET current_phase = %s WHERE id = %s", (len(run.plan) - 1, run.id))
        stopped = json.loads(_migrate_in_process(["plan", "late", "--json"], env).stdout)
        said = _migrate_in_process(["plan", "late"], env).stdout.splitlines()[0]
        fresh = json.loads(_migrate_in_process(["plan", "anew", "--kinds", "persons,deals", "--json"], env).stdout)
    assert stopped["next"] == "resume" and stopped["run"]["kinds_left"] == [], stopped
    # numbered as phase_9_catchup and `migrate status` number it, not in the run's own 3 phases
    assert "where it stopped (at phase 9 of 9," in said, said
    catchup = {k["kind"]: k for k in stopped["kinds"]}["catchup"]
    assert catchup["requests"] > 0 and catchup["rows"] > 0, stopped
    anew = {k["kind"]: k for k in fresh["kinds"]}["catchup"]
    assert [catchup[f] for f in ("rows", "requests", "tokens")] == [anew[f] for f in ("rows", "requests", "tokens")], \
        (catchup, anew)
