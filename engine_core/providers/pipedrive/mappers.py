"""Pipedrive records -> the product's CRM rows: one mapper per record kind (users, pipelines,
stages, organizations, persons, deals, leads, activities, notes), named by `kinds.py`.

Pure functions: no I/O. A mapper checks its row (`mapping.py`; `MalformedRow` naming the field
when it cannot be imported faithfully) and returns a `Mapped`: the target table, the column values
it knows, the parents the row must be linked to (resolved through the ledger by the engine, one
query per page) and the softer references (owners, linked people, custom fields pointing at
records) that are linked when found and left empty when not. A deal's pipeline and stage are such
soft links (the source's ids are kept beside them); a stage's pipeline is a parent.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_core.providers.pipedrive.fields import FieldBook, custom_fields_v1, custom_fields_v2
from engine_core.providers.pipedrive.mapping import (LONG_TEXT_MAX, MalformedRow, Mapped, Ref, _common, _describe,
                                                     _link, day, flag, json_value, labels, number, ref_id,
                                                     row_source_id, source_version, text, timestamp, visible_to)
from engine_core.rows import NOTE_CONTENT_MAX, fit_text, normal_domain, normal_email


def map_user(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A `/v1/users` row -> a `users` row (version: `modified`, users have no update_time)."""
    sid = row_source_id(row, "users")
    access = row.get("access")
    admin = any(isinstance(a, Mapping) and a.get("admin") is True for a in access) if isinstance(access, list) else False
    values = {
        **_common(row, sid, tenant_id, "created", "modified"),
        "name": text(row, "name", required=True),
        "email": normal_email(text(row, "email")),
        "phone": text(row, "phone"),
        "active": flag(row, "active_flag") is not False,
        "is_admin": admin,
        "timezone": text(row, "timezone_name"),
        "locale": text(row, "locale"),
    }
    return Mapped("users", sid, values, version=source_version(row, "modified"))


def _position(row: Mapping[str, Any]) -> int | None:
    value = number(row, "order_nr")
    if value is not None and value != int(value):
        raise MalformedRow(f"order_nr is not a whole number: {_describe(row.get('order_nr'))}")
    return None if value is None else int(value)


def map_pipeline(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A pipeline -> a `pipelines` row."""
    sid = row_source_id(row, "pipelines")
    values = {
        **_common(row, sid, tenant_id),
        "name": text(row, "name", required=True),
        "position": _position(row),
        "active": flag(row, "is_deleted") is not True,
        "deal_probability_enabled": flag(row, "is_deal_probability_enabled"),
    }
    return Mapped("pipelines", sid, values, version=source_version(row))


def map_stage(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A stage belongs to its pipeline: a stage whose pipeline is not here is skipped."""
    sid = row_source_id(row, "stages")
    parents: list[Ref] = []
    pipeline = ref_id(row, "pipeline_id")
    if pipeline is None:
        raise MalformedRow("pipeline_id is missing")
    _link(parents, "pipeline_id", "pipeline", pipeline, "pipeline_id")
    rot_days = number(row, "days_to_rotten")
    values = {
        **_common(row, sid, tenant_id),
        "name": text(row, "name", required=True),
        "position": _position(row),
        "active": flag(row, "is_deleted") is not True,
        "deal_probability": number(row, "deal_probability"),
        "rotten_after_days": int(rot_days) if rot_days is not None and flag(row, "is_deal_rot_enabled") is not False else None,
    }
    return Mapped("stages", sid, values, parents=parents, version=source_version(row))


def map_organization(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """An organization -> a `companies` row; its owner and record-valued custom fields are links."""
    sid = row_source_id(row, "organizations")
    links: list[Ref] = []
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    name = text(row, "name", required=True)
    domain = normal_domain(text(row, "website") or text(row, "domain"))
    values = {
        **_common(row, sid, tenant_id),
        "name": name,
        "domain": domain,
        "address": json_value(row, "address", Mapping),
        "label_ids": labels(row),
        "visible_to": visible_to(row),
        "custom_fields": custom_fields_v2(book, "organization", row, links),
    }
    return Mapped("companies", sid, values, links=links, version=source_version(row))


def _emails(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = json_value(row, "emails", list) or []
    out = []
    for item in raw:
        if isinstance(item, Mapping):
            value = item.get("value")
            if value in (None, ""):
                continue
            if not isinstance(value, str):
                raise MalformedRow(f"emails has a non-text address: {_describe(value)}")
            out.append({"value": value, "label": item.get("label"), "primary": bool(item.get("primary"))})
        elif isinstance(item, str) and item:
            out.append({"value": item, "label": None, "primary": not out})
        else:
            raise MalformedRow(f"emails has the wrong shape: {_describe(item)}")
    return out


def map_person(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A person -> a `contacts` row: its organization a parent, its owner a link, its emails
    matched against contacts already in the product (`match_emails`)."""
    sid = row_source_id(row, "persons")
    parents: list[Ref] = []
    links: list[Ref] = []
    _link(parents, "company_id", "org", ref_id(row, "org_id"), "org_id")
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    emails = _emails(row)
    primary = next((e["value"] for e in emails if e["primary"]), emails[0]["value"] if emails else None)
    values = {
        **_common(row, sid, tenant_id),
        "name": text(row, "name", required=True),
        "first_name": text(row, "first_name"),
        "last_name": text(row, "last_name"),
        "email": normal_email(primary),
        "emails": emails,
        "phones": json_value(row, "phones", list) or [],
        "job_title": text(row, "job_title"),
        "postal_address": json_value(row, "postal_address", (Mapping, str)),
        "birthday": day(row, "birthday"),
        "label_ids": labels(row),
        "visible_to": visible_to(row),
        "custom_fields": custom_fields_v2(book, "person", row, links),
    }
    if isinstance(values["postal_address"], str):
        values["postal_address"] = {"value": values["postal_address"]}
    return Mapped("contacts", sid, values, parents=parents, links=links, match_emails=[e["value"] for e in emails],
                  version=source_version(row))


def map_deal(row: Mapping[str, Any], tenant_id: str, book: FieldBook, *, archived_kind: bool = False) -> Mapped:
    """A deal -> a `deals` row: person and organization parents, pipeline, stage and owner links
    (source ids kept beside them); `archived_kind`: served by the archived list."""
    sid = row_source_id(row, "deals")
    parents: list[Ref] = []
    links: list[Ref] = []
    _link(parents, "contact_id", "person", ref_id(row, "person_id"), "person_id")
    _link(parents, "company_id", "org", ref_id(row, "org_id"), "org_id")
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    _link(links, "pipeline_id", "pipeline", ref_id(row, "pipeline_id"))
    _link(links, "stage_id", "stage", ref_id(row, "stage_id"))
    archived = archived_kind or flag(row, "is_archived") is True
    status = text(row, "status")
    values = {
        **_common(row, sid, tenant_id),
        "title": text(row, "title", required=True),
        "value": number(row, "value"),
        "currency": text(row, "currency"),
        "status": status,
        "archived": archived,
        "archived_at": timestamp(row, "archive_time"),
        "pipeline_ref": ref_id(row, "pipeline_id"),
        "stage_ref": ref_id(row, "stage_id"),
        "probability": number(row, "probability"),
        "lost_reason": text(row, "lost_reason"),
        "expected_close_date": day(row, "expected_close_date"),
        "closed_at": timestamp(row, "close_time"),
        "won_at": timestamp(row, "won_time"),
        "lost_at": timestamp(row, "lost_time"),
        "stage_changed_at": timestamp(row, "stage_change_time"),
        "origin": text(row, "origin"),
        "label_ids": labels(row),
        "visible_to": visible_to(row),
        "custom_fields": custom_fields_v2(book, "deal", row, links),
    }
    return Mapped("deals", sid, values, parents=parents, links=links, version=source_version(row))


def map_lead(row: Mapping[str, Any], tenant_id: str, book: FieldBook, *, archived_kind: bool = False) -> Mapped:
    """A lead (uuid id) -> a `leads` row: person and organization parents, owner a link;
    `archived_kind`: served by the archived list."""
    sid = row_source_id(row, "leads")
    parents: list[Ref] = []
    links: list[Ref] = []
    _link(parents, "contact_id", "person", ref_id(row, "person_id"), "person_id")
    _link(parents, "company_id", "org", ref_id(row, "organization_id"), "organization_id")
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    value = json_value(row, "value", Mapping)
    amount = number(value, "amount") if value else None
    currency = text(value, "currency") if value else None
    values = {
        **_common(row, sid, tenant_id),
        "title": text(row, "title", required=True),
        "value": amount,
        "currency": currency,
        "archived": archived_kind or flag(row, "is_archived") is True,
        "source_name": text(row, "source_name"),
        "expected_close_date": day(row, "expected_close_date"),
        "was_seen": flag(row, "was_seen"),
        "label_ids": labels(row),
        "visible_to": visible_to(row),
        "custom_fields": custom_fields_v1(book, "lead", row, links),
    }
    return Mapped("leads", sid, values, parents=parents, links=links, version=source_version(row))


def _attachments(row: Mapping[str, Any], parents: list[Ref]) -> None:
    """What an activity or note is attached to: each is a parent that must be here."""
    _link(parents, "deal_id", "deal", ref_id(row, "deal_id"), "deal_id")
    _link(parents, "lead_id", "lead", ref_id(row, "lead_id", uuid=True), "lead_id")
    _link(parents, "contact_id", "person", ref_id(row, "person_id"), "person_id")
    _link(parents, "company_id", "org", ref_id(row, "org_id"), "org_id")


def map_activity(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """An activity -> an `activities` row: the records it is attached to (deal, lead, person,
    organization) its parents, its owner a link, participants kept as served."""
    sid = row_source_id(row, "activities")
    parents: list[Ref] = []
    links: list[Ref] = []
    _attachments(row, parents)
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    participants = json_value(row, "participants", list) or []
    values = {
        **_common(row, sid, tenant_id),
        "subject": text(row, "subject", required=True),
        "activity_type": text(row, "type"),
        "done": flag(row, "done") is True,
        "done_at": timestamp(row, "marked_as_done_time"),
        "due_date": day(row, "due_date"),
        "due_time": text(row, "due_time"),
        "duration": text(row, "duration"),
        "busy": flag(row, "busy"),
        "location": json_value(row, "location", (Mapping, str)),
        "note": text(row, "note", limit=LONG_TEXT_MAX),
        "public_description": text(row, "public_description", limit=LONG_TEXT_MAX),
        "participants": participants,
        "custom_fields": custom_fields_v2(book, "activity", row, links),
    }
    if isinstance(values["location"], str):
        values["location"] = {"value": values["location"]}
    return Mapped("activities", sid, values, parents=parents, links=links, version=source_version(row))


PIN_FLAGS = ("deal", "lead", "person", "organization", "project", "task")
_UNBOUNDED = 2**62  # a text checked for type and NUL only: its length is fitted afterwards


def map_note(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A note -> a `notes` row: deal, lead, person and organization parents; its content kept
    whole up to NOTE_CONTENT_MAX (`content_truncated` past it), pin flags as a list."""
    sid = row_source_id(row, "notes")
    parents: list[Ref] = []
    links: list[Ref] = []
    _attachments(row, parents)
    _link(links, "author_id", "user", ref_id(row, "user_id"))
    # kept whole up to crm.NOTE_CONTENT_MAX characters, cut there beyond it and flagged: never dropped
    fitted = fit_text(text(row, "content", required=True, limit=_UNBOUNDED), NOTE_CONTENT_MAX)
    values = {
        **_common(row, sid, tenant_id),
        "content": fitted.body,
        "content_truncated": fitted.truncated,
        "content_original_length": fitted.original_length,
        "pinned": [p for p in PIN_FLAGS if flag(row, f"pinned_to_{p}_flag")],
    }
    return Mapped("notes", sid, values, parents=parents, links=links, version=source_version(row))
