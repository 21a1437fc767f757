"""`migrate verify`'s verdict says what passed: PASSED proves every source row accounted for
(imported, or kept in the ledger with a reason), not that every row was imported. On a tenant
with skipped and failed rows (the sandbox's `badrow` fault) the verdict line carries how many rows
are in the product and how many are skipped and failed, with where their reasons are, and
`--json` carries the same counts (`accounted`); a tenant with none says every row is in the product."""
from __future__ import annotations

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import KindResult, VerifyResult, verify
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox


def test_passed_with_skipped_and_failed_rows_says_they_are_not_in_the_product(db) -> None:
    with sandbox(seed=2, faults="badrow:0.15") as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), "acme", FAST)
    assert proof.passed, "\n".join(proof.lines())
    checked = [k for k in proof.kinds if k.checked]
    skipped, failed = sum(k.skipped for k in checked), sum(k.failed for k in checked)
    in_product = sum(k.product for k in checked)
    assert skipped and failed, [k.as_dict() for k in checked]
    # each kind's rows add up: in the product, or skipped, failed or waiting with a reason
    for k in checked:
        assert k.product + k.skipped + k.failed + k.waiting == k.source, k.as_dict()
    last = proof.lines()[-1]
    assert last.startswith("verify acme (pipedrive): PASSED: every source row is accounted for - "), last
    assert f"{in_product:,} in the product, {skipped:,} skipped and {failed:,} failed are not" in last, last
    assert "`migrate rows acme`" in last, last
    doc = proof.as_dict()
    assert doc["passed"] and doc["verdict"] in last
    assert (doc["accounted"]["in_product"], doc["accounted"]["skipped"], doc["accounted"]["failed"]) == (
        in_product, skipped, failed)
    assert doc["accounted"]["source"] == sum(k.source for k in checked)


def test_passed_with_every_row_in_the_product_stays_short() -> None:
    clean = VerifyResult("acme", "pipedrive", [KindResult("notes", ("notes",), source=3, ledger=3, product=3)])
    assert clean.lines()[-1].startswith("verify acme (pipedrive): PASSED: every source row is in the product (3); cost")
    assert clean.as_dict()["accounted"] == {"source": 3, "in_product": 3, "skipped": 0, "failed": 0, "waiting": 0}
    one = VerifyResult("acme", "pipedrive", [KindResult("notes", ("notes",), source=3, ledger=2, product=2,
                                                        unwritten=1, failed=1)])
    assert "2 in the product, 1 failed is not (kept with their reasons: `migrate rows acme`)" in one.verdict()
