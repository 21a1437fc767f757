"""Field mapping without I/O: a row that cannot be imported faithfully raises MalformedRow naming
its field; hostile but valid text passes verbatim; custom fields are stored as the record says
them - type, value (option ids), currency - with no copy of names or option labels, which change
at the source without the record (v2 objects and v1 top-level keys alike); references become
parents that must be here or links that are filled when found."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.mail import map_email, with_body
from engine_core.providers.pipedrive.mappers import (map_activity, map_deal, map_lead, map_note, map_person, map_pipeline,
                                                     map_stage)
from engine_core.providers.pipedrive.mapping import MalformedRow, Ref, ref_to, timestamp
from engine_core.providers.pipedrive.kinds import ledger_kind
from engine_core.rows import apply_links
from engine_core.target import crm
from pipedrive_sandbox.data import HOSTILE_UNICODE, HTML_INJECTION, SQL_INJECTION, Dataset

DS = Dataset("tiny", 1)
ENUM, SET, MONEY, USER = (next(f for f in DS.custom_fields["deal"] if f.field_type == t) for t in ("enum", "set", "monetary", "user"))


def book() -> FieldBook:
    defs = []
    for entity in ("deal", "person", "organization"):
        for f in DS.custom_fields[entity]:
            defs.append({"entity": entity, "field_key": f.key, "name": f.name, "field_type": f.field_type,
                         "options": [{"id": i, "label": label} for i, label in f.options], "is_custom": True})
    return FieldBook(defs)


def deal(**changes):
    row = dict(DS.record("deals", 3))
    row.update(changes)
    return row


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"id": None}, "id is missing"),
        ({"id": "abc"}, "id is not a positive integer"),
        ({"id": True}, "id is not a positive integer"),
        ({"title": {"value": "x"}}, "title is not text"),
        ({"title": "Deal\x00\x00tail"}, "title contains NUL bytes"),
        ({"title": "x" * 100_001}, "title is 100,001 characters long"),
        ({"title": "   "}, "title is empty"),
        ({"owner_id": "seven"}, "owner_id is not an id"),
        ({"add_time": 1234567890}, "add_time is not a time"),
        ({"update_time": True}, "update_time is not a time"),
        ({"custom_fields": ["not", "an", "object"]}, "custom_fields is not an object"),
        ({"value": "a lot"}, "value is not a number"),
    ],
)
def test_a_row_that_cannot_be_imported_faithfully_names_its_field(changes, reason) -> None:
    with pytest.raises(MalformedRow) as e:
        map_deal(deal(**changes), "t", book())
    assert str(e.value).startswith(reason)


@pytest.mark.parametrize("title", [SQL_INJECTION, HTML_INJECTION, f"Deal {HOSTILE_UNICODE}"])
def test_hostile_but_valid_text_is_imported_verbatim(title) -> None:
    assert map_deal(deal(title=title), "t", book()).values["title"] == title


def test_deal_parents_links_and_custom_fields() -> None:
    row = deal(person_id=61, org_id=9, owner_id=2, custom_fields={
        ENUM.key: ENUM.options[1][0], SET.key: [ENUM.options[0][0]] if False else [SET.options[0][0], SET.options[2][0]],
        MONEY.key: {"value": 1200.5, "currency": "EUR"}, USER.key: 3, "f" * 40: "unknown field",
    })
    m = map_deal(row, "t", book(), archived_kind=True)
    assert m.table == "deals" and m.source_id == str(row["id"]) and m.values["archived"] is True
    assert m.parents == [Ref("contact_id", "person", "61"), Ref("company_id", "org", "9")]
    assert Ref("owner_id", "user", "2") in m.links and Ref(f"custom_fields.{USER.key}", "user", "3") in m.links
    cf = m.values["custom_fields"]
    assert cf[ENUM.key] == {"type": "enum", "value": ENUM.options[1][0]}
    assert cf[SET.key] == {"type": "set", "value": [SET.options[0][0], SET.options[2][0]]}
    assert (cf[MONEY.key]["value"], cf[MONEY.key]["currency"]) == (1200.5, "EUR")
    assert cf["f" * 40]["type"] == "unknown" and cf["f" * 40]["value"] == "unknown field"
    # one ledger identity whichever list served a deal or lead (issue 8, item 6); the old archived
    # kinds are read after it (entries an older worker wrote), never written
    assert ref_to("deal_id", "deal", "5").kinds[0] == "deals" and ref_to("lead_id", "lead", "x").parent_kind == "leads"
    assert (ledger_kind("deals_archived"), ledger_kind("leads_archived"), ledger_kind("deals")) == ("deals", "leads", "deals")
    # the source field a parent came from is kept for words (a dangling reference names it)
    assert [r.dangling() for r in m.parents] == [
        {"field": "person_id", "parent_kind": "persons", "parent_id": "61"},
        {"field": "org_id", "parent_kind": "organizations", "parent_id": "9"},
    ]
    values = apply_links(m, {Ref("contact_id", "person", "61"): 7, Ref("company_id", "org", "9"): 8,
                             Ref("owner_id", "user", "2"): None, Ref(f"custom_fields.{USER.key}", "user", "3"): 11})
    assert (values["contact_id"], values["company_id"], values["owner_id"]) == (7, 8, None)
    assert values["custom_fields"][USER.key]["record_id"] == 11


def test_links_fill_a_copy_of_the_row_as_one_reference_at_a_time_would() -> None:
    # `link_values` copies a JSON column once per row for all its `<column>.<key>` links; the
    # answer is the one `_set_at`, reference by reference, gives, and the row's own values stay
    import copy

    from engine_core.rows import Mapped, _set_at, link_values

    values = {"source_id": "1", "org_id": None, "custom_fields": {"a": {"value": 3}, "b": {"value": 4}, "c": None, "d": 5},
              "recipients": {"to": [{"email": "x"}, {"email": "y"}]}, "notes": [1]}
    refs = [Ref("org_id", "org", "9"), Ref("custom_fields.a", "user", "3"), Ref("custom_fields.b", "user", "4"),
            Ref("custom_fields.a", "person", "3"), Ref("custom_fields.c", "user", "5"), Ref("custom_fields.d", "user", "5"),
            Ref("custom_fields.e", "user", "6"), Ref("recipients", "person", "7", path=("recipients", "to", 1), into="contact_id"),
            Ref("custom_fields.b", "org", "8", path=("custom_fields", "b"), into="org"), Ref("custom_fields.b", "deal", "2"),
            Ref("nothing", "deal", "1", path=("missing", 0))]
    m = Mapped("deals", "1", values, parents=refs[:2], links=refs[2:])
    before = copy.deepcopy(values)
    ids = list(range(10, 10 + len(refs)))
    want = dict(values)
    for ref, record_id in zip(m.refs(), ids):  # one reference at a time, every container copied
        if ref.path:
            _set_at(want, ref.path, ref.into, record_id)
        elif "." in ref.column:
            _set_at(want, tuple(ref.column.split(".", 1)), "record_id", record_id)
        else:
            want[ref.column] = record_id
    got = link_values(m, ids)
    assert got == want and list(got) == list(want) and list(got["custom_fields"]) == list(want["custom_fields"])
    assert got["custom_fields"]["a"]["record_id"] == 13 and got["custom_fields"]["b"] == {"value": 4, "record_id": 19, "org": 18}
    assert values == before  # the row's own values, every level, unchanged


def test_pipelines_and_stages_and_a_deals_place_in_them() -> None:
    pipeline = map_pipeline(DS.record("pipelines", 0), "t", book())
    assert pipeline.table == "pipelines" and pipeline.values["name"] == "Sales" and pipeline.values["active"] is True
    assert pipeline.values["position"] == 1 and pipeline.parents == []
    first = map_stage(DS.record("stages", 0), "t", book())
    assert first.table == "stages" and first.parents == [Ref("pipeline_id", "pipeline", "1")]
    assert first.values["rotten_after_days"] == 30 and first.values["deal_probability"] == 20
    assert map_stage(DS.record("stages", 1), "t", book()).values["rotten_after_days"] is None
    # a deal links softly to both (it is imported when they are not here) and keeps the source's ids
    m = map_deal(deal(pipeline_id=2, stage_id=7), "t", book())
    assert Ref("pipeline_id", "pipeline", "2") in m.links and Ref("stage_id", "stage", "7") in m.links
    assert not any(r.ref in ("pipeline", "stage") for r in m.parents)
    assert (m.values["pipeline_ref"], m.values["stage_ref"]) == ("2", "7")
    # malformed: each names its field
    stage = dict(DS.record("stages", 0))
    for changes, reason in (({"pipeline_id": None}, "pipeline_id is missing"), ({"pipeline_id": "x"}, "pipeline_id is not an id"),
                            ({"name": ""}, "name is"), ({"order_nr": 1.5}, "order_nr is not a whole number")):
        with pytest.raises(MalformedRow, match=reason):
            map_stage({**stage, **changes}, "t", book())
    with pytest.raises(MalformedRow, match="name is missing"):
        map_pipeline({**DS.record("pipelines", 0), "name": None}, "t", book())


def test_leads_carry_v1_custom_values_at_the_top_level() -> None:
    lead = dict(DS.record("leads", 3))
    lead[SET.key] = f"{SET.options[0][0]},{SET.options[1][0]}"
    lead[MONEY.key], lead[f"{MONEY.key}_currency"] = 99.0, "SEK"
    m = map_lead(lead, "t", book(), archived_kind=False)
    assert m.source_id == lead["id"] and m.values["value"] == lead["value"]["amount"]
    cf = m.values["custom_fields"]
    assert cf[SET.key]["value"] == [SET.options[0][0], SET.options[1][0]]
    assert "labels" not in cf[SET.key] and "name" not in cf[SET.key]
    assert (cf[MONEY.key]["value"], cf[MONEY.key]["currency"]) == (99.0, "SEK")
    with pytest.raises(MalformedRow, match="not a lead uuid"):
        map_lead({**lead, "id": "abc"}, "t", book())


def test_notes_and_activities_are_attached_to_everything_they_name() -> None:
    note = map_note(DS.record("notes", 3), "t", FieldBook())
    assert {r.ref for r in note.parents} == {"deal", "person", "org"}
    assert Ref("author_id", "user", "4") in note.links
    assert timestamp(DS.record("notes", 3), "add_time") == datetime(2019, 7, 26, 3, 57, 7, tzinfo=timezone.utc)
    lead_activity = map_activity({**DS.record("activities", 1), "deal_id": None, "person_id": None, "org_id": None,
                                  "lead_id": DS.lead_uuid(2)}, "t", FieldBook())
    assert lead_activity.parents == [Ref("lead_id", "lead", DS.lead_uuid(2))]
    with pytest.raises(MalformedRow, match="user_id is not an id"):
        map_note({**DS.record("notes", 3), "user_id": [1, 2]}, "t", FieldBook())


def test_a_person_is_matched_by_any_of_its_addresses() -> None:
    p = map_person({**DS.record("persons", 3), "emails": [{"value": "A@X.example", "primary": False},
                                                          {"value": "b@x.example", "primary": True}]}, "t", book())
    assert p.values["email"] == "b@x.example" and p.match_emails == ["A@X.example", "b@x.example"]


def test_a_mail_message_and_its_body() -> None:
    item = DS.mail_list_item(1)
    m = map_email(item, "t", "1")
    assert m.parents == [Ref("deal_id", "deal", "1")] and m.values["body"] is None
    assert Ref("to.0", "person", "61") in m.links
    full = with_body(m, {"body": "<p>Hello</p>"})
    assert full.values["body"] == "<p>Hello</p>" and full.values["subject"] == item["data"]["subject"]
    with pytest.raises(MalformedRow, match="body contains NUL bytes"):
        with_body(m, {"body": "a\x00b"})
    with pytest.raises(MalformedRow, match="subject is not text"):
        map_email({**item, "data": {**item["data"], "subject": {"oops": True}}}, "t", "1")
    values = apply_links(m, {Ref("to.0", "person", "61"): 42})
    assert values["recipients"]["to"][0]["contact_id"] == 42


def test_a_long_note_is_kept_whole_and_one_beyond_the_cap_is_cut_and_flagged() -> None:
    image = "iVBORw0KGgo" * 137_000
    content = f'<p>Chart</p><img src="data:image/png;base64,{image}"/><p>end</p>'
    assert len(content) > 1_500_000
    note = map_note({**DS.record("notes", 3), "content": content}, "t", FieldBook())
    assert note.values["content"] == content
    assert (note.values["content_truncated"], note.values["content_original_length"]) == (False, None)
    assert crm.NOTE_CONTENT_MAX >= 30 * 3_000_000, "far above the ~3,000,000 characters Pipedrive allowed"
    fitted = crm.fit_text(content, 100)
    assert fitted.truncated and fitted.original_length == len(content) and fitted.body == "<p>Chart</p>"
