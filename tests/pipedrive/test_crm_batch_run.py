"""Deal products are a kind of the run: a whole tiny account's deal lines reach crm.deal_products
through the ledger (their deal and product linked through it), row by row against the sandbox's
truth; a product removed from a deal at the source is marked deleted at the source by the next
sync, and `verify` proves the kind before and after."""
from __future__ import annotations

from typing import Any

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify

from .support import FAST, failed_tasks, ledger, live_op, migrate, sandbox, sync

TENANT = "acme"


def lines_held(db) -> dict[str, dict[str, Any]]:
    """The product's live lines: source id -> line with its deal's and product's source ids."""
    rows = db.sql(
        "SELECT l.*, d.source_id AS deal_ref, p.source_id AS product_link FROM crm.deal_products l"
        " JOIN crm.deals d ON d.id = l.deal_id LEFT JOIN crm.products p ON p.id = l.product_id"
        " WHERE l.tenant_id = %(t)s AND l.deleted_at_source IS NULL", {"t": TENANT})
    return {r["source_id"]: r for r in rows}


def reconcile_lines(db, truth: dict[str, list[dict[str, Any]]]) -> None:
    """Every line the source serves now is one live product row with its values, deal and product,
    and the product holds no other live line."""
    want = {str(line["id"]): (deal, line) for deal, served in truth.items() for line in served}
    held = lines_held(db)
    assert set(held) == set(want) != set()
    products = {r["source_id"] for r in db.sql("SELECT source_id FROM crm.products WHERE tenant_id = %(t)s", {"t": TENANT})}
    for sid, (deal, line) in want.items():
        mine = held[sid]
        assert mine["deal_ref"] == deal
        assert (float(mine["quantity"]), float(mine["item_price"]), float(mine["sum"]), mine["order_nr"], mine["currency"]) == (
            line["quantity"], line["item_price"], line["sum"], line["order_nr"], line["currency"]), sid
        assert mine["product_ref"] == str(line["product_id"])
        # the product through the ledger where the source has it; a purged product's line keeps its id
        assert mine["product_link"] == (str(line["product_id"]) if str(line["product_id"]) in products else None), sid


def test_a_run_imports_every_deal_line_and_a_sync_marks_a_removed_one(db) -> None:
    with sandbox() as sb:
        truth = sb.truth("deal_products")["deal_products"]
        sb.reset_stats()
        run = migrate(db, sb, TENANT)
        calls = sb.stats()["requests"].get("/api/v2/deals/products", 0)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["deal_products"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert proof.passed and proof.kinds[0].checked, proof.lines()
        reconcile_lines(db, truth)
        deals = len(db.sql("SELECT 1 FROM crm.deals WHERE tenant_id = %(t)s", {"t": TENANT}))
        assert calls == -(-deals // 100), ("one call per 100 deals the ledger holds", calls, deals)

        change = live_op(sb, "product_remove")
        synced = sync(db, sb)
        after = sb.truth("deal_products")["deal_products"]
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["deal_products"])
    assert proof.passed, proof.lines()
    reconcile_lines(db, after)
    entry = ledger(db, TENANT, "deal_products")[str(change["id"])]
    gone = db.sql("SELECT deleted_at_source FROM crm.deal_products WHERE tenant_id = %(t)s AND source_id = %(s)s",
                  {"t": TENANT, "s": str(change["id"])})
    assert entry["action"] == "created" and gone and gone[0]["deleted_at_source"] is not None, (change, gone)
    marked = db.sql("SELECT count(*) AS n FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                    " WHERE h.migration_id = %(r)s AND r.kind = 'deal_products' AND h.action = 'deleted'", {"r": synced.id})
    assert marked[0]["n"] == 1, "exactly the removed line is marked, by the sync"
