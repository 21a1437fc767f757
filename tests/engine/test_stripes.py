"""Behaviour 3: page-walking kinds are seeded as 4 stripes; each finishing task creates the next
task of its stripe by find-or-create, so a retried page cannot create a second successor."""
from __future__ import annotations

from engine_core import runs
from engine_core.models import Successor
from engine_core.topup import insert_tasks
from engine_core.providers.registry import provider_for, for_run
from engine_core.worker import Worker
from tests.engine.support import FAST, task_rows


def test_seeded_as_four_stripes_and_each_finisher_creates_its_successor(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", options={"page_size": 10, "counts": {"companies": 95}}, settings=FAST)
    seeded = task_rows(db, run.id)
    assert [t["cursor_key"] for t in seeded] == ["companies:0", "companies:10", "companies:20", "companies:30"]
    w = Worker(db, settings=FAST, providers=for_run)
    assert w.execute(seeded[0]["id"]) == "succeeded"
    keys = [t["cursor_key"] for t in task_rows(db, run.id)]
    assert "companies:40" in keys  # 0 + 4 stripes x 10 rows
    assert len(keys) == 5


def test_a_retried_page_cannot_create_a_second_successor(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", options={"page_size": 10, "counts": {"companies": 95}}, settings=FAST)
    first = task_rows(db, run.id)[0]
    w = Worker(db, settings=FAST, providers=for_run)
    w.execute(first["id"])
    # the same page runs again (a retry after its worker died between successor and finish)
    db.sql("UPDATE migration_tasks SET status = 'pending', processed_offset = 0 WHERE id = %(i)s", {"i": first["id"]})
    assert w.execute(first["id"]) == "succeeded"
    keys = [t["cursor_key"] for t in task_rows(db, run.id)]
    assert keys.count("companies:40") == 1
    with db.transaction() as tx:
        assert insert_tasks(tx, run, 0, "companies", [Successor("companies:40", {"start": 40})]) == 0


def test_stripes_walk_the_whole_collection_once(db) -> None:
    from engine_core.worker import drain_threads

    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"],
                         options={"page_size": 10, "counts": {"companies": 95}}, settings=FAST)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    starts = sorted(t["cursor"]["start"] for t in task_rows(db, run.id))
    # every page of the collection walked once; at most one empty page past the end per stripe
    assert [s for s in starts if s < 95] == list(range(0, 100, 10))
    assert len(starts) == len(set(starts)) and all(s < 95 + 10 * 4 for s in starts)
    assert db.sql("SELECT count(*) AS n FROM example_items")[0]["n"] == 95
