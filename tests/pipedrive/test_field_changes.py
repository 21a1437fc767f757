"""Custom fields stay true at the source's current names: after a run, a deal field renamed, an
option relabelled and another field deleted at the sandbox, then a sync - every custom value of
every deal and lead reads (crm.custom_field_values) with the name and labels the source serves
now, no record was rewritten for it, no record carries a copy of a name or label, and the deleted
field's definition is marked deleted at the source with its values kept, flagged."""
from __future__ import annotations

from typing import Any

import httpx

from tests.pipedrive.support import TOKEN, failed_tasks, live_op, migrate, sandbox, sync

TENANT = "acme"


def test_a_field_renamed_relabelled_and_deleted_at_the_source_is_shown_as_it_is_now(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        renamed = live_op(sb, "rename_field")
        relabelled = live_op(sb, "relabel_option")
        deleted = live_op(sb, "delete_field")
        synced = sync(db, sb)
        h = {"x-api-token": TOKEN}
        served = {f["field_code"]: f for f in httpx.get(f"{sb.base_url}/api/v2/dealFields?limit=500", headers=h).json()["data"]}
        changes = sb.truth(kind="field_changes")["field_changes"]
    assert changes["deleted"] == [deleted["id"]] and deleted["id"] not in served
    # the sync changed no deal: field changes move no record's update_time
    touched = db.sql("SELECT r.kind, count(*) AS n FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                     " WHERE h.migration_id = %(r)s GROUP BY r.kind", {"r": synced.id})
    assert {t["kind"] for t in touched} == {"fields"}, touched
    # every custom value of every deal and lead is shown with the source's current name and labels
    shown = db.sql("SELECT * FROM crm.custom_field_values WHERE tenant_id = %(t)s AND record_type IN ('crm.deals', 'crm.leads')",
                   {"t": TENANT})
    by_key: dict[str, list[dict[str, Any]]] = {}
    for r in shown:
        by_key.setdefault(r["field_key"], []).append(r)
    assert by_key.get(renamed["id"]) and by_key.get(relabelled["id"]) and by_key.get(deleted["id"])
    for key, rows in by_key.items():
        if key == deleted["id"]:
            assert all(r["field_deleted_at_source"] is not None for r in rows), "values kept, flagged"
            continue
        f = served[key]
        labels = {o["id"]: o["label"] for o in f.get("options") or []}
        for r in rows:
            assert r["name"] == f["field_name"] and r["field_deleted_at_source"] is None, (r, f)
            if r["field_type"] == "enum":
                assert r["label"] == labels[r["value"]], (r, f)
            if r["field_type"] == "set":
                assert r["labels"] == [labels[v] for v in r["value"]], (r, f)
    assert {r["name"] for r in by_key[renamed["id"]]} == {renamed["name"]}
    assert any(r["label"] == relabelled["label"] or relabelled["label"] in (r["labels"] or [])
               for r in by_key[relabelled["id"]]), "some deal shows the relabelled option"
    # the definitions: renamed in place, the deleted one marked and still there
    defs = {d["field_key"]: d for d in db.sql("SELECT * FROM crm.custom_field_definitions WHERE tenant_id = %(t)s"
                                              " AND entity = 'deal'", {"t": TENANT})}
    assert defs[renamed["id"]]["name"] == renamed["name"] and defs[renamed["id"]]["deleted_at_source"] is None
    assert defs[deleted["id"]]["deleted_at_source"] is not None
    # no record carries a copy of a name or a label
    copies = db.sql("SELECT count(*) AS n FROM crm.deals, jsonb_each(custom_fields) AS f(k, v)"
                    " WHERE tenant_id = %(t)s AND (v ? 'name' OR v ? 'label' OR v ? 'labels')", {"t": TENANT})
    assert copies[0]["n"] == 0
