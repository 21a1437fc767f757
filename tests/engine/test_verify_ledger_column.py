"""verify's "ledger" figure is what the ledger accounts for: its live claims and the placeholders
it holds with a reason (skipped, failed, waiting - the rows `migrate rows` lists), so on a kind
with skipped rows it equals the source's figure, as the verdict's "every source row is accounted
for" says; a count of imported rows alone under that name read as rows the ledger had lost.
Pure rules (`compare`, the result's lines), then a real run with skipped rows against the
sandbox, its figures beside `ledger_reads.bad_row_counts` (what `migrate rows` counts)."""
from __future__ import annotations

from engine_core import ledger_reads
from engine_core.rows import WAITS_FOR_WALK
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import VerifyResult, compare, verify
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox


def _entry(action: str = "created", record_id: int = 1, reason: str | None = None, **more: object) -> dict:
    return {"action": action, "record_type": "crm.notes", "record_id": record_id, "version": "v1", "deleted": None,
            "reason": reason, **more}


def test_the_ledger_figure_counts_claims_and_placeholders_and_its_parts_say_which():
    at_source = {str(i): "v1" for i in range(1, 8)}
    ledger = {"1": _entry(record_id=11), "2": _entry(record_id=12), "3": _entry(record_id=13),
              "4": _entry("skipped", 0, "not linked to any record: deal 9 is not here"),
              "5": _entry("skipped", 0, f"not linked to any record: deal 8 is not here, {WAITS_FOR_WALK}"),
              "6": _entry("failed", 0, "a row without a readable id", not_an_id=True),
              "7": _entry("failed", 0, "HTTP 500"),
              "99": _entry("skipped", 0, "not linked to any record: deal 7 is not here")}  # no longer listed
    result = compare("notes", ["notes"], at_source, ledger, {"1": [True], "2": [True], "3": [True]},
                     {"crm.notes": {11, 12, 13}})
    assert (result.imported, result.skipped, result.failed, result.waiting) == (3, 1, 2, 1)
    assert result.unlisted_placeholders == 1
    assert result.ledger == 8 == result.imported + result.skipped + result.failed + result.waiting + 1
    line = VerifyResult("acme", "pipedrive", [result]).lines()[0]
    assert line.startswith("notes: source 7, ledger 8 (3 imported, 1 skipped, 2 failed, 1 waiting for the catch-up's "
                           "walk, 1 skipped/failed no longer listed by the source), product 3 "
                           "(reasons: `migrate rows acme --kind notes`)"), line
    doc = result.as_dict()
    assert (doc["ledger"], doc["imported"], doc["unlisted_placeholders"]) == (8, 3, 1)
    # only claims: the figure is said alone, as before
    clean = compare("notes", ["notes"], {"1": "v1"}, {"1": _entry(record_id=11)}, {"1": [True]}, {"crm.notes": {11}})
    assert VerifyResult("acme", "pipedrive", [clean]).lines()[0] == "notes: source 1, ledger 1, product 1: ok"


def test_a_run_with_skipped_rows_has_ledger_equal_to_source_and_to_migrate_rows(db):
    with sandbox() as sb:
        run = migrate(db, sb, kinds=["organizations", "persons", "deals", "leads", "activities", "notes"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        result = verify(db, PipedriveProvider(base_url=sb.base_url), "acme", FAST, kinds=["activities", "notes"])
    bad = ledger_reads.bad_row_counts(db, "acme")
    for k in result.kinds:
        rows = bad.get(k.kind, {"skipped": 0, "failed": 0, "waiting": 0})
        assert rows["skipped"] > 0, f"{k.kind}: the account must have rows skipped for an archived parent"
        assert k.ledger == k.imported + sum(rows.values()), (k.kind, k.as_dict(), rows)
        assert k.ledger == k.source and k.imported == k.product, k.as_dict()
    assert result.passed, result.lines()
