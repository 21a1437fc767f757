"""The entity path: a page's set-based windows hold `TaskContext.set_window` rows (no
savepoints, so the subxid cache does not bound them); a window the database refuses, or one that
leaves more than `window` rows to write per row, rolls back and goes in windows of `window` rows,
each set-based first - so its ledger, product rows and counts are the per-row path's, and a
malformed row still fails alone. Real Postgres; the shapes of tests/engine/test_optimistic_window.
"""
from __future__ import annotations

from typing import Any

from engine_core import ledger, write
from engine_core.context import TaskContext
from tests.engine.test_optimistic_window import _context, _person, _run, _snapshot, _stats, _write


def _checkpoints(ctx: TaskContext, monkeypatch) -> list[int]:
    """The offsets the task's committed-or-not windows checkpointed, in order."""
    seen: list[int] = []
    real = ctx.checkpoint

    def checkpoint(tx, offset):  # the real checkpoint, recorded
        seen.append(offset)
        return real(tx, offset)

    monkeypatch.setattr(ctx, "checkpoint", checkpoint)
    return seen


def _people(n: int, **changes: dict[str, Any]) -> list[dict[str, Any]]:
    rows = [{"id": i, "name": f"Person {i}"} for i in range(1, n + 1)]
    for i, change in changes.items():
        rows[int(i)].update(change)
    return rows


def test_a_page_of_plain_rows_commits_in_windows_of_set_window_rows(db, monkeypatch) -> None:
    run = _run(db, "big")
    ctx = _context(db, run, "persons")
    ctx.set_window = 100
    offsets = _checkpoints(ctx, monkeypatch)
    result = _write(ctx, _people(130), _person("big"), optimistic=True)
    assert offsets == [100, 130], "two set-based windows: 100 rows, then the page's last 30"
    assert result.outcomes == {"imported": 130} and ctx.offset == 130
    assert _stats(ctx) == {"seen": 130, "imported": 130}


def test_a_refused_big_window_goes_in_small_windows_and_the_bad_row_fails_alone(db, monkeypatch) -> None:
    run = _run(db, "refused")
    ctx = _context(db, run, "persons")
    ctx.set_window = 100
    offsets = _checkpoints(ctx, monkeypatch)
    rows = _people(100, **{"60": {"name": None}})  # only the database knows: crm.contacts.name is NOT NULL
    result = _write(ctx, rows, _person("refused"), optimistic=True)
    assert offsets == [25, 50, 75, 100], "the refused window rolled back (no checkpoint), then four of 25"
    assert result.outcomes == {"imported": 99, "failed": 1}
    names = {r["source_id"] for r in db.sql("SELECT source_id FROM crm.contacts WHERE tenant_id = 'refused'")}
    assert names == {str(i) for i in range(1, 101) if i != 61}
    entry = db.sql("SELECT action, reason FROM migration_records WHERE tenant_id = 'refused' AND source_id = '61'")[0]
    assert entry["action"] == "failed" and entry["reason"].startswith("NotNullViolation")
    assert _stats(ctx) == {"seen": 100, "imported": 99, "failed": 1}


def test_a_big_window_of_many_per_row_rows_goes_in_small_windows_and_writes_what_the_per_row_path_writes(db, monkeypatch) -> None:
    # 40 of 100 rows are malformed: they fail per row (a savepoint each) - more than `window` of
    # them in one transaction would overflow the subxid cache. (Placeholders, which this test used
    # before they were noted set-based, are the next test's.)
    orphans = {str(i): {"bad_mapping": True} for i in range(0, 100, 5)} | {str(i): {"bad_mapping": True} for i in range(1, 100, 5)}

    def scenario(tenant: str, optimistic: bool) -> tuple[Any, ...]:
        run = _run(db, tenant)
        ctx = _context(db, run, "persons")
        ctx.set_window = 100
        offsets = _checkpoints(ctx, monkeypatch)
        result = _write(ctx, _people(100, **orphans), _person(tenant), optimistic=optimistic)
        return offsets, result.outcomes, _stats(ctx), _snapshot(db, tenant)

    per_row = scenario("per-row", optimistic=False)
    claimed: list[int] = []
    real = write.ledger.claim_window

    def counting(tx, run, kind, claims, new_rows=None):  # the real claim, counted
        won = real(tx, run, kind, claims, new_rows)
        claimed.append(len(won))
        return won

    monkeypatch.setattr(write.ledger, "claim_window", counting)
    optimistic = scenario("optimistic", optimistic=True)
    assert optimistic[0] == [25, 50, 75, 100], "split into windows of 25"
    assert claimed == [60, 15, 15, 15, 15], "the big window's claim rolled back; each small window went set-based"
    assert per_row[1] == {"imported": 60, "failed": 40}
    assert optimistic[1:3] == per_row[1:3]
    for part, a, b in zip(("ledger", "contacts", "companies"), per_row[3], optimistic[3]):
        assert a == b, f"{part} differ"


def test_a_window_notes_its_placeholders_in_one_statement_and_writes_what_the_per_row_path_writes(db, monkeypatch) -> None:
    # 40 of 100 rows point at a parent that is not written (20 the ledger never heard of, 20 whose
    # parent is itself a placeholder): each is skipped, a placeholder. The set-based window notes
    # them in one statement, not a savepoint each, so the window is not split either.
    # 4 more were written before and come again, newer, pointing at a missing parent: per row
    # (`update_skipped`), as the per-row path has it.
    orphans = {str(i): {"org": 900 + i} for i in range(0, 100, 5)} | {str(i): {"org": 700 + i} for i in range(1, 100, 5)}
    again = {str(i): {"org": 500 + i, "v": "2"} for i in range(2, 100, 25)}

    def scenario(tenant: str, optimistic: bool) -> tuple[Any, ...]:
        run = _run(db, tenant)
        with db.transaction() as tx:
            for i in range(1, 100, 5):
                ledger.skip(tx, run, "organizations", str(700 + i), "not here either")
        first = _context(db, run, "persons", key="first")
        _write(first, [_people(100)[int(i)] for i in again], _person(tenant), optimistic=False)
        ctx = _context(db, run, "persons")
        ctx.set_window = 100
        offsets = _checkpoints(ctx, monkeypatch)
        result = _write(ctx, _people(100, **orphans, **again), _person(tenant), optimistic=optimistic)
        return offsets, result.outcomes, _stats(ctx), _snapshot(db, tenant)

    per_row = scenario("per-row", optimistic=False)
    noted: list[int] = []
    real = write.ledger.skip_window

    def counting(tx, run, kind, reasons, versions=None, parents=None):  # the real statement, counted
        out = real(tx, run, kind, reasons, versions, parents)
        noted.append(len(out))
        return out

    monkeypatch.setattr(write.ledger, "skip_window", counting)
    optimistic = scenario("optimistic", optimistic=True)
    assert optimistic[0] == [100], "one set-based window: its placeholders take no savepoints"
    assert noted == [40], "the window's placeholders in one statement; the rows seen again per row"
    assert per_row[1] == {"imported": 56, "skipped": 44}
    assert per_row[2].get("update_skipped") == 4
    assert optimistic[1:3] == per_row[1:3]
    for part, a, b in zip(("ledger", "contacts", "companies"), per_row[3], optimistic[3]):
        assert a == b, f"{part} differ"
