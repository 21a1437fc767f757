"""Behaviour 5: a page is written in windows of 25 rows, one transaction each, one savepoint per
row, the checkpoint inside the window's transaction. A malformed row is rolled back alone, counted
and its reason logged; a page whose every row failed fails the task; a deadlock or serialization
failure releases the task to pending with its cursor intact."""
from __future__ import annotations

import pytest

from engine_core import runs
from engine_core.context import TaskContext
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.registry import provider_for, register, for_run
from engine_core.worker import Worker
from tests.engine.support import FAST, task_rows


class PageProvider:
    """One task writes one page of `rows` rows; run options say which rows misbehave."""

    source = "pages"

    def __init__(self, run: Run | None = None) -> None:
        pass

    def phases(self) -> list[list[str]]:
        return [["items"]]

    def account(self) -> str:
        return "pages"

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        return [Successor("items:0", {"start": 0})]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        o = ctx.run.options
        bad = set(o.get("bad", []))
        deadlock_at = o.get("deadlock_at")
        rows = [{"id": i} for i in range(int(o.get("rows", 60)))]

        def write(tx, row):
            if row["id"] in bad:
                tx.sql("INSERT INTO example_items (tenant_id, kind, source_id) VALUES ('x', 'items', %(s)s)", {"s": str(row["id"])})
                raise ValueError("malformed row: no name")  # after a write: the savepoint must undo it
            if row["id"] == deadlock_at and ctx.task.attempts == 1:
                # a real error from the server with the deadlock SQLSTATE, through the driver
                tx.sql("DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$")
            tx.sql("INSERT INTO example_items (tenant_id, kind, source_id) VALUES ('x', 'items', %(s)s)", {"s": str(row["id"])})
            return "imported"

        ctx.write_rows(rows, write)
        return TaskOutcome()


register("pages", PageProvider)


def _one(db, options):
    run = runs.start_run(db, provider_for("pages"), "acme", options=options, settings=FAST)
    task = task_rows(db, run.id)[0]
    return run, task, Worker(db, settings=FAST, providers=for_run)


def _written(db) -> list[int]:
    return sorted(int(r["source_id"]) for r in db.sql("SELECT source_id FROM example_items"))


def test_malformed_row_is_rolled_back_alone_counted_and_logged(db) -> None:
    run, task, w = _one(db, {"rows": 60, "bad": [7, 30]})
    assert w.execute(task["id"]) == "succeeded"
    assert _written(db) == [i for i in range(60) if i not in (7, 30)]
    t = task_rows(db, run.id)[0]
    assert t["processed_offset"] == 60
    assert t["stats"]["failed"] == 2 and t["stats"]["imported"] == 58
    log = db.sql("SELECT log FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["log"]
    assert log[0]["reason"] == "ValueError: malformed row: no name" and log[0]["count"] == 2


def test_a_page_whose_every_row_failed_fails_the_task(db) -> None:
    run, task, w = _one(db, {"rows": 30, "bad": list(range(30))})
    assert w.execute(task["id"]) == "failed"
    t = task_rows(db, run.id)[0]
    assert t["status"] == "failed" and "every row of the page failed" in t["error"]
    assert _written(db) == []


def test_deadlock_releases_the_task_with_its_cursor_and_committed_windows(db) -> None:
    run, task, w = _one(db, {"rows": 60, "deadlock_at": 40})
    assert w.execute(task["id"]) == "released"
    t = task_rows(db, run.id)[0]
    assert t["status"] == "pending" and t["cursor"] == {"start": 0}
    assert t["processed_offset"] == 25, "the first window committed with its checkpoint; the second rolled back"
    assert _written(db) == list(range(25))
    assert "TransientDatabaseError" in t["error"]
    # the retry resumes at the checkpoint and writes each row once
    db.sql("UPDATE migration_tasks SET not_before = NULL")
    assert w.execute(task["id"]) == "succeeded"
    assert _written(db) == list(range(60))


def test_checkpoint_is_inside_the_window_transaction(db) -> None:
    """A worker that lost its lock cannot commit a window: the checkpoint fails and rolls the rows back."""
    run, task, w = _one(db, {"rows": 60})
    claimed = db.sql("UPDATE migration_tasks SET status='running', locked_by='someone-else', attempts=1 WHERE id=%(i)s RETURNING *", {"i": task["id"]})[0]
    from engine_core.models import Task
    result = w.run_claimed(Task.from_row({**claimed, "locked_by": w.worker_id}), runs.get_run(db, run.id))
    assert result == "lost"
    assert _written(db) == []


@pytest.mark.parametrize("rows", [24, 25, 26, 51])
def test_windows_are_25_rows(db, rows) -> None:
    run, task, w = _one(db, {"rows": rows})
    offsets = []
    db.sql("CREATE TABLE offsets (o int)")
    db.sql("""CREATE FUNCTION note_offset() RETURNS trigger AS $$ BEGIN
              IF NEW.processed_offset <> OLD.processed_offset THEN INSERT INTO offsets VALUES (NEW.processed_offset); END IF;
              RETURN NEW; END $$ LANGUAGE plpgsql""")
    db.sql("CREATE TRIGGER t BEFORE UPDATE ON migration_tasks FOR EACH ROW EXECUTE FUNCTION note_offset()")
    w.execute(task["id"])
    offsets = [r["o"] for r in db.sql("SELECT o FROM offsets")]
    assert offsets == [min(rows, k) for k in range(25, rows + 25, 25)]


def test_a_task_moves_its_cursor_in_one_statement_and_with_its_successors_in_one_transaction(db, monkeypatch) -> None:
    """`TaskContext.move_cursor` without successors is one statement (no transaction
    opened and committed around it: a catch-up page paid three round trips for it); with
    successors they and the move commit together, and a move whose lock is lost raises LockLost."""
    from engine_core.errors import LockLost
    from tests.engine.test_optimistic_window import _context, _run

    run = _run(db, "moves")
    ctx = _context(db, run, "persons")
    opened: list[int] = []
    real = db.transaction

    def transaction():  # the real transaction, counted
        opened.append(1)
        return real()

    monkeypatch.setattr(db, "transaction", transaction)
    ctx.move_cursor({"page": 1})
    assert opened == [], "a move alone opened a transaction"
    ctx.move_cursor({"page": 2}, successors=[Successor("persons:mail", {"m": 1})])
    assert opened == [1, 1], "the move with its successor, then the lane's refill (`topup.top_up`)"
    rows = {r["cursor_key"]: r["cursor"] for r in db.sql("SELECT cursor_key, cursor FROM migration_tasks"
                                                         " WHERE migration_id = %(r)s", {"r": run.id})}
    assert rows == {"persons:a": {"page": 2}, "persons:mail": {"m": 1}}
    db.sql("UPDATE migration_tasks SET locked_by = 'someone else' WHERE cursor_key = 'persons:a'")
    with pytest.raises(LockLost):
        ctx.move_cursor({"page": 3})
