"""An update in place sets every column the mapping owns, to null too: a reference the source
cleared is cleared, and the ledger's history keeps the previous value. One test per shape, each
a run, a live change at the sandbox, a sync, and the product reconciled with the source's rows:
a lead converted to a deal (its activities and its notes move to the deal, `lead_id` cleared) and
a deal whose person was removed."""
from __future__ import annotations

from tests.pipedrive.support import failed_tasks, history, live_op, migrate, product_row, sandbox, sync

TENANT = "acme"


def test_a_lead_converted_mid_run_moves_its_activities_to_the_deal_and_clears_the_lead(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        change = live_op(sb, "convert")
        synced = sync(db, sb)
        rows = sb.truth_rows("activities")
    moved = [str(a) for a in change["moved"].get("activities", [])]
    assert moved, change
    deal = product_row(db, "deals", change["deal_id"])
    lead = product_row(db, "leads", change["id"])
    assert lead["deleted_at_source"] is not None, "the converted lead is marked deleted at the source"
    for sid in moved:
        assert rows[sid]["deal_id"] == change["deal_id"] and rows[sid]["lead_id"] is None
        activity = product_row(db, "activities", sid)
        assert (activity["deal_id"], activity["lead_id"]) == (deal["id"], None), activity
        (change_row,) = [h for h in history(db, synced.id, "activities", sid) if h["action"] == "updated"]
        assert change_row["before"]["lead_id"] == lead["id"], change_row


def test_a_note_moved_from_a_converted_lead_to_its_deal_leaves_the_lead(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        change = live_op(sb, "convert")
        synced = sync(db, sb)
        rows = sb.truth_rows("notes")
    moved = [str(n) for n in change["moved"].get("notes", [])]
    assert moved, change
    deal, lead = product_row(db, "deals", change["deal_id"]), product_row(db, "leads", change["id"])
    for sid in moved:
        assert rows[sid]["deal_id"] == change["deal_id"] and rows[sid]["lead_id"] is None
        note = product_row(db, "notes", sid)
        assert (note["deal_id"], note["lead_id"]) == (deal["id"], None), note
        (change_row,) = [h for h in history(db, synced.id, "notes", sid) if h["action"] == "updated"]
        assert change_row["before"]["lead_id"] == lead["id"], change_row


def test_a_deal_whose_person_was_removed_no_longer_points_at_the_person(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        person = None
        for _ in range(10):  # a deal whose person the product holds (not a purged one)
            change = live_op(sb, "unlink")
            rows = db.sql("SELECT id FROM crm.contacts WHERE tenant_id = %(t)s AND source_id = %(s)s",
                          {"t": TENANT, "s": str(change["person_id"])})
            if rows and product_row(db, "deals", change["id"])["contact_id"] == rows[0]["id"]:
                person = rows[0]["id"]
                break
        assert person is not None
        synced = sync(db, sb)
        served = sb.truth_rows("deals").get(str(change["id"])) or sb.truth_rows("deals_archived")[str(change["id"])]
    assert served["person_id"] is None
    deal = product_row(db, "deals", change["id"])
    assert deal["contact_id"] is None, deal
    (change_row,) = [h for h in history(db, synced.id, "deals", change["id"]) if h["action"] == "updated"]
    assert change_row["before"]["contact_id"] == person, change_row
