"""Set-based windows of 500 rows (`window.SET_WINDOW`): a big window that would leave
more than `window` rows per row - rows the page found written before, which the batch's `leaves`
counts before any statement - or that the database refuses, goes again in windows of
`window.SET_WINDOW_FALLBACK` (100) rows, and only those refused in turn in windows of `window`
(25): a page a tenth of which was written before is written as it was with windows of 100, not in
twenty windows of 25 after a 500-row statement rolled back. The per-row path is the oracle.
"""
from __future__ import annotations

from typing import Any

from engine_core import write
from tests.engine.test_entity_windows import _checkpoints, _people
from tests.engine.test_optimistic_window import _context, _person, _run, _snapshot, _stats, _write


def _claims(monkeypatch) -> list[int]:
    claimed: list[int] = []
    real = write.ledger.claim_window

    def counting(tx, run, kind, claims, new_rows=None):  # the real claim, its rows counted
        won = real(tx, run, kind, claims, new_rows)
        claimed.append(len(claims))
        return won

    monkeypatch.setattr(write.ledger, "claim_window", counting)
    return claimed


def test_a_page_a_tenth_written_before_goes_in_windows_of_100_without_a_refused_statement(db, monkeypatch) -> None:
    before = [str(i) for i in range(0, 500, 10)]  # 50 rows, 10 in each window of 100

    def scenario(tenant: str, optimistic: bool) -> tuple[Any, ...]:
        run = _run(db, tenant)
        first = _context(db, run, "persons", key="first")
        _write(first, [_people(500)[int(i)] for i in before], _person(tenant), optimistic=False)
        ctx = _context(db, run, "persons")
        ctx.set_window = 500
        offsets = _checkpoints(ctx, monkeypatch)
        result = _write(ctx, _people(500), _person(tenant), optimistic=optimistic)
        return offsets, result.outcomes, _stats(ctx), _snapshot(db, tenant)

    per_row = scenario("per-row", optimistic=False)
    claimed = _claims(monkeypatch)
    optimistic = scenario("optimistic", optimistic=True)
    assert optimistic[0] == [100, 200, 300, 400, 500], "five windows of 100"
    assert claimed == [90] * 5, "no 500-row statement ran: `leaves` split the window first"
    assert optimistic[1] == per_row[1] == {"imported": 450, "already_here": 50}
    assert optimistic[2] == per_row[2]
    for part, a, b in zip(("ledger", "contacts", "companies"), per_row[3], optimistic[3]):
        assert a == b, f"{part} differ"


def test_a_big_window_the_database_refuses_goes_in_windows_of_100_then_25(db, monkeypatch) -> None:
    run = _run(db, "refused")
    ctx = _context(db, run, "persons")
    ctx.set_window = 500
    offsets = _checkpoints(ctx, monkeypatch)
    claimed = _claims(monkeypatch)
    rows = _people(300, **{"160": {"name": None}})  # only the database knows: crm.contacts.name is NOT NULL
    result = _write(ctx, rows, _person("refused"), optimistic=True)
    assert offsets == [100, 125, 150, 175, 200, 300], "refused 300 -> 100s; the refused 100 -> 25s"
    assert claimed == [100, 25, 25, 25, 100], "the refused statements (300, 100, the 25 with row 161) are not counted"
    assert result.outcomes == {"imported": 299, "failed": 1}
    assert _stats(ctx) == {"seen": 300, "imported": 299, "failed": 1}
    entry = db.sql("SELECT action, reason FROM migration_records WHERE tenant_id = 'refused' AND source_id = '161'")[0]
    assert entry["action"] == "failed" and entry["reason"].startswith("NotNullViolation")
