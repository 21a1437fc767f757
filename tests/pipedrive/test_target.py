"""The product's CRM tables and their writers against a real database: values only as parameters,
columns only from each table's list, "already here" only for rows the product had (same tenant,
not migrated from this source), and field definitions refreshed in place."""
from __future__ import annotations

import pytest

from engine_core.target import crm


def test_insert_takes_only_known_columns_and_needs_a_tenant(db) -> None:
    with db.transaction() as tx:
        with pytest.raises(KeyError, match="no column"):
            crm.insert(tx, "contacts", {"tenant_id": "t", "name": "x", "name); DROP TABLE crm.contacts; --": 1})
        with pytest.raises(KeyError, match="tenant_id"):
            crm.insert(tx, "contacts", {"name": "x"})
        written = crm.write(tx, "contacts", {"tenant_id": "t", "name": "Robert'); DROP TABLE crm.contacts;--",
                                             "emails": [{"value": "a@b.example"}], "custom_fields": {"k": {"name": "K", "value": 1}}})
    row = db.sql("SELECT * FROM crm.contacts WHERE id = %(i)s", {"i": written.record_id})[0]
    assert written.record_type == "crm.contacts" and not written.matched
    assert row["name"].startswith("Robert'); DROP") and row["emails"] == [{"value": "a@b.example"}]
    assert row["custom_fields"] == {"k": {"name": "K", "value": 1}}


def test_a_contact_is_matched_by_email_in_its_tenant_only(db) -> None:
    mine = db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES ('t', 'Ann', 'Ann@Example.com') RETURNING id")[0]["id"]
    db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES ('other', 'Ann', 'ann@example.com')")
    migrated = db.sql("INSERT INTO crm.contacts (tenant_id, name, email, source, source_id)"
                      " VALUES ('t', 'Bob', 'bob@example.com', 'pipedrive', '7') RETURNING id")[0]["id"]
    with db.transaction() as tx:
        ann = crm.write_contact(tx, {"tenant_id": "t", "name": "Ann B", "source": "pipedrive", "source_id": "1"},
                                ["nobody@example.com", " ANN@example.com "])
        bob = crm.write_contact(tx, {"tenant_id": "t", "name": "Bob", "source": "pipedrive", "source_id": "8"}, ["bob@example.com"])
        elsewhere = crm.write_contact(tx, {"tenant_id": "third", "name": "Ann", "source": "pipedrive", "source_id": "1"},
                                      ["ann@example.com"])
    assert ann.matched and ann.record_id == mine
    assert not bob.matched and bob.record_id != migrated, "a row this source created is the ledger's, not a match"
    assert not elsewhere.matched


def test_a_company_is_matched_by_name_or_domain(db) -> None:
    acme = db.sql("INSERT INTO crm.companies (tenant_id, name) VALUES ('t', 'Acme  Logistics GmbH') RETURNING id")[0]["id"]
    globex = db.sql("INSERT INTO crm.companies (tenant_id, name, domain) VALUES ('t', 'Globex', 'globex.example') RETURNING id")[0]["id"]
    with db.transaction() as tx:
        by_name = crm.write_company(tx, {"tenant_id": "t", "name": " acme logistics  gmbh", "source": "pipedrive", "source_id": "1"})
        by_domain = crm.write_company(tx, {"tenant_id": "t", "name": "Globex Corporation", "source": "pipedrive", "source_id": "2",
                                           "domain": crm.normal_domain("https://www.Globex.example/about")})
        new = crm.write_company(tx, {"tenant_id": "t", "name": "Initech", "source": "pipedrive", "source_id": "3"})
    assert (by_name.matched, by_name.record_id) == (True, acme)
    assert (by_domain.matched, by_domain.record_id) == (True, globex)
    assert not new.matched


def test_field_definitions_are_refreshed_in_place(db) -> None:
    values = {"tenant_id": "t", "source": "pipedrive", "entity": "deal", "field_key": "a" * 40, "name": "Priority",
              "field_type": "enum", "options": [{"id": 1, "label": "Low"}], "subfields": None, "is_custom": True, "position": 3}
    with db.transaction() as tx:
        first = crm.upsert_field_definition(tx, values)
        again = crm.upsert_field_definition(tx, {**values, "name": "Urgency", "options": [{"id": 1, "label": "Lowest"}]})
    assert first == again
    with db.connection() as conn:
        (d,) = crm.field_definitions(conn, "t", "pipedrive")
    assert d["name"] == "Urgency" and d["options"] == [{"id": 1, "label": "Lowest"}]


def test_an_update_in_place_sets_every_owned_column_even_to_null_and_returns_what_it_cleared(db) -> None:
    # a lead converted to a deal: the activity comes back with deal_id set and no lead_id
    lead = db.sql("INSERT INTO crm.leads (tenant_id, title) VALUES ('t', 'Lead') RETURNING id")[0]["id"]
    deal = db.sql("INSERT INTO crm.deals (tenant_id, title) VALUES ('t', 'Deal') RETURNING id")[0]["id"]
    with db.transaction() as tx:
        act = crm.insert(tx, "activities", {"tenant_id": "t", "source": "pipedrive", "source_id": "5", "subject": "Call",
                                            "lead_id": lead, "owner_id": None, "done": False, "participants": []})
        before = crm.update(tx, "activities", act, {"tenant_id": "t", "source": "pipedrive", "source_id": "5",
                                                    "subject": "Call", "deal_id": deal, "done": False, "participants": []})
    row = db.sql("SELECT * FROM crm.activities WHERE id = %(i)s", {"i": act})[0]
    assert (row["deal_id"], row["lead_id"]) == (deal, None), "a reference the source cleared is cleared"
    assert before == {"deal_id": None, "lead_id": lead}, "the history keeps what the update replaced"
    assert (row["source"], row["source_id"], row["done"]) == ("pipedrive", "5", False)
    # a column with a default returns to it (a mail body fetched after it was unavailable)
    with db.transaction() as tx:
        mail = crm.insert(tx, "emails", {"tenant_id": "t", "source_id": "9", "deal_id": deal, "subject": "s",
                                         "body_truncated": True, "body_original_length": 9, "body_unavailable": 403})
        crm.update(tx, "emails", mail, {"tenant_id": "t", "source_id": "9", "deal_id": deal, "subject": "s", "body": "b"})
    row = db.sql("SELECT * FROM crm.emails WHERE id = %(i)s", {"i": mail})[0]
    assert (row["body"], row["body_truncated"], row["body_original_length"], row["body_unavailable"]) == ("b", False, None, None)


def test_custom_values_read_through_the_definitions_show_current_names_and_flag_deleted_fields(db) -> None:
    key, gone = "a" * 40, "b" * 40
    definition = {"tenant_id": "t", "source": "pipedrive", "entity": "deal", "field_key": key, "name": "Priority",
                  "field_type": "enum", "options": [{"id": 1, "label": "Low"}, {"id": 2, "label": "Medium"}],
                  "subfields": None, "is_custom": True, "position": 1}
    with db.transaction() as tx:
        crm.upsert_field_definition(tx, definition)
        crm.upsert_field_definition(tx, {**definition, "field_key": gone, "name": "Region", "field_type": "set",
                                         "options": [{"id": 7, "label": "North"}, {"id": 8, "label": "South"}]})
        deal = crm.insert(tx, "deals", {"tenant_id": "t", "source": "pipedrive", "source_id": "3", "title": "D",
                                        "custom_fields": {key: {"type": "enum", "value": 2},
                                                          gone: {"type": "set", "value": [8, 7]}}})
        lead = crm.insert(tx, "leads", {"tenant_id": "t", "source": "pipedrive", "source_id": "l", "title": "L",
                                        "custom_fields": {key: {"type": "enum", "value": 1}}})

    def shown() -> dict[tuple[str, str], dict]:
        rows = db.sql("SELECT * FROM crm.custom_field_values WHERE tenant_id = 't' ORDER BY record_type, field_key")
        return {(r["record_type"], r["field_key"]): r for r in rows}

    now = shown()
    assert (now["crm.deals", key]["name"], now["crm.deals", key]["label"]) == ("Priority", "Medium")
    assert now["crm.deals", gone]["labels"] == ["South", "North"] and now["crm.deals", key]["record_id"] == deal
    assert now["crm.leads", key]["label"] == "Low", "a lead's fields are the deal's"
    with db.transaction() as tx:  # renamed and relabelled at the source; the other field deleted
        crm.upsert_field_definition(tx, {**definition, "name": "Deal priority",
                                         "options": [{"id": 1, "label": "Low"}, {"id": 2, "label": "Mid"}]})
        tx.sql("UPDATE crm.custom_field_definitions SET deleted_at_source = now() WHERE field_key = %(k)s", {"k": gone})
    now = shown()
    assert (now["crm.deals", key]["name"], now["crm.deals", key]["label"]) == ("Deal priority", "Mid")
    assert now["crm.deals", key]["field_deleted_at_source"] is None
    assert now["crm.deals", gone]["field_deleted_at_source"] is not None and now["crm.deals", gone]["value"] == [8, 7]
    assert db.sql("SELECT custom_fields FROM crm.deals WHERE id = %(i)s", {"i": deal})[0]["custom_fields"][key] == \
        {"type": "enum", "value": 2}, "the record keeps no copy of names or labels"
