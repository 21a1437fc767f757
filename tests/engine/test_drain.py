"""Behaviour 15: a drain loop claims and runs a run's tasks until nothing is claimable,
heartbeating; many threads and processes drain one run at once and every row lands once."""
from __future__ import annotations

import multiprocessing as mp

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker, drain_threads
from tests.engine.support import FAST

COUNTS = {"companies": 120, "contacts": 150, "deals": 100, "activities": 80, "notes": 80}


def _drain(url: str, run_id: int) -> None:
    database = dbmod.Database(url, max_size=6)
    drain_threads(database, run_id, width=3, settings=FAST, providers=for_run)
    database.close()


def test_threads_and_processes_drain_one_run_exactly_once(db, db_url) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", options={"page_size": 10, "counts": COUNTS}, settings=FAST)
    db.sql("UPDATE migrations SET heartbeat_at = now() - interval '1 hour'")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_drain, args=(db_url, run.id)) for _ in range(2)]
    for p in procs:
        p.start()
    drain_threads(db, run.id, width=3, settings=FAST, providers=for_run)
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    assert runs.get_run(db, run.id).status == "succeeded"
    per = {r["kind"]: (r["n"], r["d"]) for r in db.sql(
        "SELECT kind, count(*) AS n, count(DISTINCT source_id) AS d FROM example_items GROUP BY kind")}
    assert per == {k: (v, v) for k, v in COUNTS.items()}
    workers = db.sql("SELECT count(DISTINCT split_part(locked_by, ':', 2)) AS n FROM migration_tasks")
    beat = db.sql("SELECT heartbeat_at > now() - interval '1 minute' AS fresh FROM migrations")[0]["fresh"]
    assert beat, "draining heartbeats the run"


def test_drain_exits_when_nothing_is_claimable(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"], options={"page_size": 10, "counts": {"companies": 5}}, settings=FAST)
    result = Worker(db, settings=FAST, providers=for_run).drain(run.id)
    assert result.reason == "succeeded" and result.executed["succeeded"] == 4


def _seen_as(identity: str | None, account: str = "example-account"):  # type: ignore[no-untyped-def]
    """The example provider as a worker whose source settings reach `identity` (None: the source
    cannot say now) through the account key `account`."""

    class Seen:
        def __init__(self, run) -> None:  # type: ignore[no-untyped-def]
            self._inner = provider_for("example", run)

        def __getattr__(self, name):  # type: ignore[no-untyped-def]
            return getattr(self._inner, name)

        def account(self) -> str:
            return account

        def identity(self) -> str:
            if identity is None:
                raise ConnectionError("the source did not answer")
            return identity

    return Seen


def test_a_worker_that_reaches_another_source_claims_nothing(db) -> None:
    """A run reads one source (its identity is recorded at start: for Pipedrive, the company). A
    worker whose settings reach another - a drainer started with the environment's token for a
    tenant launched with another company's - would write that company's rows into this tenant; it
    refuses before its first claim. A rotated token of the same company (another budget account,
    the same identity) drains, and so does a worker whose source cannot say (the tasks meet that)."""
    import pytest

    from engine_core.errors import SourceMismatch

    run = runs.start_run(db, _seen_as("company 1")(None), "acme", options={"page_size": 10, "counts": COUNTS}, settings=FAST)
    assert runs.get_run(db, run.id).source_identity == "company 1"

    worker = Worker(db, settings=FAST, providers=_seen_as("company 2"))
    with pytest.raises(SourceMismatch) as info:
        worker.drain(run.id)
    assert "company 1" in str(info.value) and "company 2" in str(info.value)
    task = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s ORDER BY id LIMIT 1", {"r": run.id})[0]["id"]
    with pytest.raises(SourceMismatch):
        worker.execute(task)
    assert db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status <> 'pending'",
                  {"r": run.id})[0]["n"] == 0, "nothing claimed, nothing run"

    assert Worker(db, settings=FAST, providers=_seen_as(None)).drain(run.id, max_tasks=2).reason == "max_tasks"
    rotated = Worker(db, settings=FAST, providers=_seen_as("company 1", account="example-account#rotated"))
    assert rotated.drain(run.id).reason == "succeeded"


def test_a_tenant_stays_with_the_source_its_data_came_from(db) -> None:
    """A sync with another company's settings would update the tenant's rows with that company's
    and mark its leads deleted: each run binds its workers to its own identity, and the tenant's
    next run is bound too. A new run, a sync and a verify that reach another
    source are refused before they read or write anything; the same company through a rotated
    token goes on, and a dry run (it wrote nothing) binds nothing."""
    import pytest

    from engine_core import verify
    from engine_core.errors import TenantSourceMismatch

    options = {"page_size": 10, "counts": COUNTS}
    dry = runs.start_run(db, _seen_as("company 2")(None), "acme", options=options, settings=FAST, dry_run=True)
    db.sql("UPDATE migrations SET status = 'stopped', finished_at = now() WHERE id = %(r)s RETURNING 1", {"r": dry.id})
    run = runs.start_run(db, _seen_as("company 1")(None), "acme", options=options, settings=FAST)
    assert Worker(db, settings=FAST, providers=_seen_as("company 1")).drain(run.id).reason == "succeeded"
    before = db.sql("SELECT count(*) AS n FROM migrations")[0]["n"]

    with pytest.raises(TenantSourceMismatch) as info:
        runs.start_run(db, _seen_as("company 2")(None), "acme", options=options, settings=FAST)
    assert str(info.value) == (f"tenant 'acme' holds data of company 1 (run #{run.id}), but these source settings reach "
                               "company 2; a tenant holds one source's data: use the settings it was migrated with, or "
                               "another tenant name for this source")
    with pytest.raises(TenantSourceMismatch):
        runs.start_sync(db, _seen_as("company 2")(None), "acme", options=options, settings=FAST)
    with pytest.raises(TenantSourceMismatch):
        verify.verify(db, _seen_as("company 2")(None), "acme", FAST)
    assert db.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == before, "nothing started"

    rotated = runs.start_sync(db, _seen_as("company 1", account="example-account#rotated")(None), "acme",
                              options=options, settings=FAST)
    assert rotated.mode == "sync" and rotated.source_identity == "company 1"
    other = runs.start_run(db, _seen_as("company 2")(None), "globex", options=options, settings=FAST)
    assert other.source_identity == "company 2", "another tenant name takes the other company"


def test_an_identity_unknown_at_start_is_bound_by_the_first_worker_that_learns_it(db) -> None:
    import pytest

    from engine_core.errors import SourceMismatch

    run = runs.start_run(db, _seen_as(None)(None), "acme", options={"page_size": 10, "counts": COUNTS}, settings=FAST)
    assert runs.get_run(db, run.id).source_identity is None
    assert Worker(db, settings=FAST, providers=_seen_as("company 1")).drain(run.id, max_tasks=1).reason == "max_tasks"
    assert runs.get_run(db, run.id).source_identity == "company 1"
    with pytest.raises(SourceMismatch):
        Worker(db, settings=FAST, providers=_seen_as("company 2")).drain(run.id)


def test_a_lane_with_nothing_to_claim_looks_at_its_run_in_one_round_trip(db, monkeypatch) -> None:
    """A lane that found nothing to claim reads the run and its task counts in one
    statement (`drain_look`), not two: idle lanes look after every wake-up. The run's one task is
    held by another worker, so this lane only waits, until its cancel Event is set."""
    import threading

    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"],
                         options={"counts": {"companies": 5}, "page_size": 10}, settings=FAST)
    for _ in range(4):  # every stripe held by another worker
        db.fetch_one("claim_next", {"run_id": run.id, "worker": "elsewhere", "max_phase": None})
    asked: list[str] = []
    real = db.fetch_one

    def fetch_one(name, params=None):  # the real statement, its name recorded
        asked.append(name)
        return real(name, params)

    monkeypatch.setattr(db, "fetch_one", fetch_one)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    result = Worker(db, settings=FAST, cancel=stop, providers=for_run).drain(run.id, poll_seconds=0.05)
    assert result.reason == "cancelled"
    looks = asked.count("drain_look")
    assert looks >= 2, asked
    assert asked.count("get_run") <= 1 and "inflight_count" not in asked, asked  # one get_run: the drain's first look


def test_a_stopped_run_is_not_reopened_by_settings_that_reach_another_source(db) -> None:
    """A relaunch with another company's settings must not flip the tenant's stopped run to
    running before its tasks refuse to claim (SourceMismatch): status would show it running with
    an ETA and nothing working on it. resume and retry refuse first and change nothing."""
    import pytest

    from engine_core.errors import SourceMismatch

    run = runs.start_run(db, _seen_as("company 1")(None), "acme", options={"page_size": 10, "counts": COUNTS}, settings=FAST)
    assert Worker(db, settings=FAST, providers=_seen_as("company 1")).drain(run.id, max_tasks=2).reason == "max_tasks"
    runs.stop(db, run.id)
    db.sql("UPDATE migration_tasks SET status = 'cancelled' WHERE migration_id = %(r)s AND status IN ('pending', 'running')"
           " RETURNING 1", {"r": run.id})
    db.sql("UPDATE migrations SET status = 'stopped', finished_at = now() WHERE id = %(r)s RETURNING 1", {"r": run.id})
    before = db.sql("SELECT status, (SELECT array_agg(status ORDER BY id) FROM migration_tasks WHERE migration_id = %(r)s) AS tasks"
                    " FROM migrations WHERE id = %(r)s", {"r": run.id})[0]
    for reopen in (runs.resume, runs.retry):
        with pytest.raises(SourceMismatch):
            reopen(db, run.id, _seen_as("company 2")(None), FAST)
        after = db.sql("SELECT status, (SELECT array_agg(status ORDER BY id) FROM migration_tasks WHERE migration_id = %(r)s)"
                       " AS tasks FROM migrations WHERE id = %(r)s", {"r": run.id})[0]
        assert after == before, (reopen.__name__, after)
    assert runs.resume(db, run.id, _seen_as("company 1")(None), FAST).status == "running"
