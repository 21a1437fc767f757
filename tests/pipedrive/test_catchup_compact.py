"""The catch-up's read-ahead holds the rows the ledger holds at their version as {id, version}
alone (`compact`), over the sandbox on real Postgres:
* a page read ahead keeps whole the rows to write (changed, unknown) and compacts the others;
* a row held compact that must be written when its walker takes the page is asked by id and
  written whole, never from the compact copy.
"""
from __future__ import annotations

from types import SimpleNamespace

from engine_core.context import TaskContext
from engine_core.providers.pipedrive import compact
from engine_core.providers.pipedrive.inventory import Step
from engine_core.worker import Worker
from engine_core.providers.registry import for_run
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox, start
from tests.pipedrive.test_live_listing import assert_current, change, finish

TENANT = "acme"


def test_a_page_read_ahead_keeps_the_rows_to_write_whole_and_the_others_compact(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT, kinds=["organizations"])
        rows = list(sb.truth_rows("organizations").values())
    assert run.status == "succeeded", failed_tasks(db, run.id)
    changed = {**rows[0], "update_time": "2099-01-01T00:00:00Z", "name": "changed"}
    unknown = {**rows[1], "id": 987654, "name": "new"}
    no_id = {"name": "no id"}
    page = Step((changed, unknown, no_id, *rows[2:]), {"cursor": "x"})
    ctx = SimpleNamespace(db=db, run=run)
    held = compact.compact(ctx, "organizations", page)  # type: ignore[arg-type]
    assert held.after == page.after and len(held.rows) == len(page.rows)
    assert held.rows[:3] == (changed, unknown, no_id)
    for row, source in zip(held.rows[3:], rows[2:]):
        assert row == {"id": source["id"], "update_time": source["update_time"], compact.COMPACT: True}


def test_a_row_held_compact_that_must_be_written_is_asked_by_id_and_written_whole(db, monkeypatch) -> None:
    """Every row read ahead held compact (as if the ledger changed between the read and the take):
    the rows the catch-up writes are asked by id and written as the source serves them."""
    monkeypatch.setattr(compact, "inventory_ledger", SimpleNamespace(unwritten=lambda *a, **k: set()))
    with sandbox() as sb:
        run = start(db, sb, TENANT, kinds=["organizations", "persons"])
        persons = next(i for i, group in enumerate(run.plan) if "persons" in group)
        Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=persons)
        person = min(int(i) for i in sb.truth("persons")["ids"]["persons"])
        change(sb, "update", "persons", person)
        sb.reset_stats()
        finish(db, run.id)
        asked = sb.stats()["requests"].get("/api/v2/persons/{id}", 0)
        row = assert_current(db, sb, "persons", person)
        source = sb.truth_rows("persons")[str(person)]
    assert asked >= 1
    assert row["name"] == source["name"] and row["name"]
