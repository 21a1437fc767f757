"""Issue 11: a catch-up task walks up to `catchup.PAGES_PER_TASK` pages, from one list's last page
on to the next list's first (the catch-up was a chain of one task a page, each paying a claim, a
finish, a top-up and the barrier's check), moving its own cursor after each page and handing on a
finished ledger kind's deletes task; a task stopped between pages resumes at the next page and
lists no page twice. Real sandbox (pages capped at 15 rows: tiny's 60 persons are 4), real Postgres.
"""
from __future__ import annotations

import math
from typing import Any

from engine_core.context import TaskContext
from engine_core.errors import TaskStopped
from engine_core.providers.pipedrive import catchup, inventory
from tests.pipedrive.support import migrate, sandbox

KINDS = ["organizations", "persons"]


def _list_tasks(db, run_id: int) -> list[dict[str, Any]]:
    """The catch-up's list tasks (not its deletes or mail tasks), in order."""
    return db.sql("SELECT cursor_key, cursor, status, stats FROM migration_tasks WHERE migration_id = %(r)s"
                  " AND kind = 'catchup' AND cursor ? 'list' ORDER BY id", {"r": run_id})


def _listed(monkeypatch) -> list[tuple[str, Any]]:
    """Every catch-up list page asked, as (kind, where the walk stood), in order."""
    seen: list[tuple[str, Any]] = []
    real = inventory.list_step

    def list_step(meter, kind, at, since=None):  # the real step, recorded
        seen.append((kind, at.get("cursor") if kind in inventory.V2_PATHS else at.get("start")))
        return real(meter, kind, at, since)

    monkeypatch.setattr(catchup, "list_step", list_step)
    return seen


def _inventory(db, run_id: int) -> dict[str, int]:
    return {r["kind"]: r["n"] for r in db.sql("SELECT kind, count(*) AS n FROM migration_inventory"
                                              " WHERE migration_id = %(r)s GROUP BY kind", {"r": run_id})}


def test_a_catchup_task_walks_pages_per_task_pages_across_its_lists(db, monkeypatch) -> None:
    monkeypatch.setattr(catchup, "PAGES_PER_TASK", 3, raising=False)  # tiny's 60 persons are 4 pages of 15
    seen = _listed(monkeypatch)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=KINDS)
    assert run.status == "succeeded"
    pages = len(seen)
    assert pages >= math.ceil(len(truth["persons"]) / 15) + 1 and pages > 3, "the lists must outgrow one task"
    tasks = _list_tasks(db, run.id)
    assert len(tasks) == math.ceil(pages / 3), [t["cursor_key"] for t in tasks]
    assert sum(t["stats"]["requests"] for t in tasks) == pages, "no page listed twice"
    assert _inventory(db, run.id) == {k: len(truth[k]) for k in KINDS}


def test_a_catchup_task_walks_on_to_the_next_list_and_hands_on_the_finished_kinds_deletes(db, monkeypatch) -> None:
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=KINDS)
    assert run.status == "succeeded"
    tasks = _list_tasks(db, run.id)
    assert [t["cursor_key"] for t in tasks] == ["catchup:organizations:p0"], "one task walked both lists"
    assert tasks[0]["cursor"]["list"] == "persons", "its cursor moved on to the persons' list"
    deletes = db.sql("SELECT cursor_key, status FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'catchup'"
                     " AND cursor ? 'deletes' ORDER BY cursor_key", {"r": run.id})
    assert [(d["cursor_key"], d["status"]) for d in deletes] == [
        ("catchup:organizations:deletes", "succeeded"), ("catchup:persons:deletes", "succeeded")]
    assert _inventory(db, run.id) == {k: len(truth[k]) for k in KINDS}


def test_a_catchup_task_stopped_between_pages_resumes_at_the_next_page(db, monkeypatch) -> None:
    seen = _listed(monkeypatch)
    moved: list[dict[str, Any]] = []
    real = TaskContext.stop_point

    def stop_point(self: TaskContext) -> None:  # the walk's first stop point: a stop lands there
        if self.task.kind == "catchup" and "list" in self.task.cursor and not moved:
            row = self.db.sql("SELECT cursor FROM migration_tasks WHERE id = %(i)s", {"i": self.task.id})[0]
            moved.append(row["cursor"])
            raise TaskStopped()
        return real(self)

    monkeypatch.setattr(TaskContext, "stop_point", stop_point)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=KINDS)
    assert run.status == "succeeded"
    assert len(moved) == 1 and moved[0] != {"list": "organizations", "page": 0}, "the task had moved on when it stopped"
    assert len(seen) == len({(k, str(at)) for k, at in seen}), f"a page was listed twice: {seen}"
    assert _inventory(db, run.id) == {k: len(truth[k]) for k in KINDS}
