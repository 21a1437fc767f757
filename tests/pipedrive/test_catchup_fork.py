"""Issue 11: the catch-up's last level - activities and notes, lists nothing links to - is walked at
once, each list in a task of its own (`kinds.LAST_LEVEL`), once the lists before it are walked;
the catch-up was one sequential chain of every list while the other lanes waited. Still every page
listed once and every id in the inventory. Real sandbox (pages capped at 15 rows), real Postgres.
"""
from __future__ import annotations

from typing import Any

import pytest

from engine_core.providers.pipedrive import catchup, inventory
from tests.pipedrive.support import migrate, sandbox


def _list_tasks(db, run_id: int) -> list[dict[str, Any]]:
    return db.sql("SELECT cursor_key, cursor, status, stats FROM migration_tasks WHERE migration_id = %(r)s"
                  " AND kind = 'catchup' AND cursor ? 'list' ORDER BY id", {"r": run_id})


def _inventory(db, run_id: int) -> dict[str, int]:
    return {r["kind"]: r["n"] for r in db.sql("SELECT kind, count(*) AS n FROM migration_inventory"
                                              " WHERE migration_id = %(r)s GROUP BY kind", {"r": run_id})}


@pytest.mark.parametrize("kinds", [["persons", "activities", "notes"], ["activities", "notes"]])
def test_activities_and_notes_are_walked_at_once_in_tasks_of_their_own(db, monkeypatch, kinds: list[str]) -> None:
    monkeypatch.setattr(catchup, "PAGES_PER_TASK", 1000)  # one task would walk every list
    seen: list[tuple[str, Any]] = []
    real = inventory.list_step

    def list_step(meter, kind, at, since=None):
        seen.append((kind, at.get("cursor") if kind in inventory.V2_PATHS else at.get("start")))
        return real(meter, kind, at, since)

    monkeypatch.setattr(catchup, "list_step", list_step)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=kinds)
    assert run.status == "succeeded"
    tasks = _list_tasks(db, run.id)
    keys = [t["cursor_key"] for t in tasks]
    assert "catchup:notes:p0" in keys, keys
    notes_task = next(t for t in tasks if t["cursor_key"] == "catchup:notes:p0")
    assert notes_task["cursor"]["list"] == "notes"
    walker = next(t for t in tasks if t["cursor_key"] != "catchup:notes:p0")
    assert walker["cursor"]["list"] == "activities", "the task walking activities did not walk the notes too"
    assert len(keys) == 2, keys
    assert len(seen) == len(set(seen)), f"a page was listed twice: {seen}"
    assert _inventory(db, run.id) == {k: len(truth[k]) for k in kinds}
