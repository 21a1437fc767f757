"""Products are a kind of the run: a whole tiny account's products reach crm.products through the
ledger (one entry per product, its version, its owner linked), with their custom fields read
through the product field definitions; a second run writes nothing again and `verify` proves them."""
from __future__ import annotations


from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify

from .support import FAST, failed_tasks, ledger, migrate, sandbox

TENANT = "acme"


def test_a_run_imports_every_product_row_by_row(db) -> None:
    with sandbox() as sb:
        served = sb.truth_rows("products")
        run = migrate(db, sb, TENANT)
        again = migrate(db, sb, TENANT)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["products"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert again.status == "succeeded", failed_tasks(db, again.id)
    [products] = proof.kinds
    assert proof.passed and products.kind == "products" and products.checked, proof.lines()
    entries = ledger(db, TENANT, "products")
    versions = {r["source_id"]: r["source_version"] for r in db.sql(
        "SELECT source_id, source_version FROM migration_records WHERE tenant_id = %(t)s AND kind = 'products'", {"t": TENANT})}
    assert set(entries) == set(served) != set()
    rows = {r["source_id"]: r for r in db.sql(
        "SELECT p.*, u.source_id AS owner_ref FROM crm.products p LEFT JOIN crm.users u ON u.id = p.owner_id"
        " WHERE p.tenant_id = %(t)s", {"t": TENANT})}
    assert len(rows) == len(served), "one product row per source product, a second run adds none"
    for sid, row in served.items():
        mine = rows[sid]
        assert entries[sid]["record_id"] == mine["id"] and versions[sid] == row["update_time"]
        assert (mine["name"], mine["code"], mine["unit"], mine["owner_ref"]) == (row["name"], row["code"], row["unit"] or None, str(row["owner_id"]))
        assert [(p["currency"], p["price"]) for p in mine["prices"]] == [(p["currency"], p["price"]) for p in row["prices"]]
        assert set(mine["custom_fields"]) == {k for k, v in (row.get("custom_fields") or {}).items() if v not in (None, "")}
    named = db.sql("SELECT count(*) AS n FROM crm.custom_field_definitions WHERE tenant_id = %(t)s AND entity = 'product'",
                   {"t": TENANT})[0]["n"]
    assert named > 0, "the product field definitions are read with the others"
