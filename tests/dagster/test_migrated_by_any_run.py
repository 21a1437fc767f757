"""A tenant is migrated when its succeeded full runs together took what a launch asks for, not only
its latest run: after a full run of the default kinds and a run of one opt-in kind alone
(`--kinds deal_history`, as the README says to add one), a plain `migrate run` (and the engine's
attach policy, and `migrate plan`) points to `migrate sync` instead of starting a whole new full run;
`+deal_history` is covered too (the two runs took it together). A launch asking for a kind no
succeeded full run took still starts a run, and a sync never makes a kind count as migrated."""
from __future__ import annotations

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.engine.support import FAST
from tests.pipedrive.support import TOKEN, failed_tasks, migrate, sandbox

pytestmark = pytest.mark.timeout(300)

TINY = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def test_a_run_of_one_opt_in_kind_leaves_the_tenant_migrated(db_url, run_env):  # noqa: F811
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        full = migrate(db, sb, "dee")
        alone = migrate(db, sb, "dee", kinds=["deal_history"])
        assert (full.status, alone.status) == ("succeeded", "succeeded"), failed_tasks(db, alone.id)
        provider = PipedriveProvider(base_url=sb.base_url)
        for kinds in (None, ["+deal_history"], ["persons", "deal_history"]):
            with pytest.raises(runs.AlreadyMigrated) as refused:  # named: the latest, as `migrate status` shows it
                runs.attach(db, provider, "dee", start_kwargs={"kinds": kinds})
            assert refused.value.run.id == alone.id, (kinds, refused.value.run.name)
        out = _migrate_in_process(["run", "--tenant", "dee"], env)
        plan = _migrate_in_process(["plan", "dee"], env)
        assert [r.id for r in runs_of(db, "dee")] == [full.id, alone.id]  # nothing launched
        wider = runs.attach(db, provider, "dee", start_kwargs={"kinds": ["+participants"]})
        assert wider.action == "started" and "participants" in wider.run.kinds
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    assert f"already migrated by {alone.name} with the runs before it:" in out.stderr, out.stderr
    assert "`migrate sync dee`" in out.stderr, out.stderr
    assert plan.stdout.startswith(f"plan for dee: already migrated by run #{alone.id}; the next run is a sync"), plan.stdout[:300]


def runs_of(db: dbmod.Database, tenant: str) -> list[runs.Run]:
    return [runs.Run.from_row(r) for r in db.sql("SELECT * FROM migrations WHERE tenant_id = %(t)s ORDER BY id",
                                                 {"t": tenant})]


def _run(db: dbmod.Database, tenant: str, **kwargs) -> runs.Run:
    run = runs.start_run(db, provider_for("example"), tenant, options=TINY, settings=FAST, **kwargs)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded"
    return runs.get_run(db, run.id)


def test_kinds_taken_run_by_run_count_together_and_a_sync_counts_for_none(db):
    provider = provider_for("example")
    first = _run(db, "piece", kinds=["companies", "contacts"])
    second = _run(db, "piece", kinds=["deals", "activities"])
    started = runs.attach(db, provider, "piece", start_kwargs={"options": TINY})  # notes: no run took them
    assert started.action == "started"
    drain_threads(db, started.run.id, width=2, settings=FAST, providers=for_run)
    with pytest.raises(runs.AlreadyMigrated) as refused:
        runs.attach(db, provider, "piece", start_kwargs={"kinds": ["companies", "deals"], "options": TINY})
    assert refused.value.run.id in (first.id, second.id, started.run.id)
    synced = _run(db, "synced", kinds=["companies"])
    sync = runs.start_sync(db, provider, "synced", kinds=["companies", "contacts"], settings=FAST)
    drain_threads(db, sync.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, sync.id).status == "succeeded"
    with pytest.raises(runs.AlreadyMigrated) as refused:
        runs.attach(db, provider, "synced", start_kwargs={"kinds": ["companies"], "options": TINY})
    assert refused.value.run.id == synced.id
    # contacts came over only as a sync's changes: a run of contacts is a migration, not a repeat
    assert runs.attach(db, provider, "synced", start_kwargs={"kinds": ["contacts"], "options": TINY}).action == "started"


def test_a_dry_run_migrates_nothing_but_covers_a_dry_launch(db):
    provider = provider_for("example")
    dry = _run(db, "dry", dry_run=True)
    with pytest.raises(runs.AlreadyMigrated) as refused:
        runs.attach(db, provider, "dry", start_kwargs={"dry_run": True, "options": TINY})
    assert refused.value.run.id == dry.id
    assert runs.attach(db, provider, "dry", start_kwargs={"options": TINY}).action == "started"
