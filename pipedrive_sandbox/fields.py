"""Field definitions served by the field endpoints (v2 `/xxxFields`; v1 `/leadFields`, `/noteFields`,
`/activityFields`, `/dealFields`, `/organizationFields`, `/personFields`, `/productFields`).

Standard fields per entity plus the dataset's custom fields (deals, persons, organizations; leads
inherit the deal custom fields, as Pipedrive documents). v1 field types are limited to the types
the v1 spec's `field_type` allows for these endpoints.
"""
from __future__ import annotations

from typing import Any

from .clock import T0, rfc3339, v1_time
from .data import Dataset

# (field_code, field_name, field_type, description)
STANDARD_V2: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "deal": (
        ("id", "ID", "int", "The ID of the deal"),
        ("title", "Title", "varchar", "The title of the deal"),
        ("creator_user_id", "Creator", "user", "The user who created the deal"),
        ("owner_id", "Owner", "user", "The user who owns the deal"),
        ("value", "Value", "monetary", "The monetary value of the deal"),
        ("person_id", "Contact person", "people", "The person linked to the deal"),
        ("org_id", "Organization", "org", "The organization linked to the deal"),
        ("pipeline_id", "Pipeline", "int", "The pipeline of the deal"),
        ("stage_id", "Stage", "stage", "The stage of the deal"),
        ("status", "Status", "status", "open, won or lost"),
        ("add_time", "Deal created", "date", "When the deal was created"),
        ("update_time", "Update time", "date", "When the deal was last updated"),
        ("stage_change_time", "Last stage change", "date", "When the stage last changed"),
        ("close_time", "Deal closed on", "date", "When the deal was closed"),
        ("won_time", "Won time", "date", "When the deal was won"),
        ("lost_time", "Lost time", "date", "When the deal was lost"),
        ("lost_reason", "Lost reason", "varchar_options", "Why the deal was lost"),
        ("expected_close_date", "Expected close date", "date", "When the deal is expected to close"),
        ("probability", "Probability", "double", "Success probability"),
        ("visible_to", "Visible to", "visible_to", "Visibility of the deal"),
        ("label_ids", "Label", "set", "Labels of the deal"),
        ("origin", "Source origin", "varchar", "Where the deal came from"),
        ("is_archived", "Archive status", "boolean", "Whether the deal is archived"),
    ),
    "person": (
        ("id", "ID", "int", "The ID of the person"),
        ("name", "Name", "varchar", "The name of the person"),
        ("first_name", "First name", "varchar", "First name"),
        ("last_name", "Last name", "varchar", "Last name"),
        ("owner_id", "Owner", "user", "The user who owns the person"),
        ("org_id", "Organization", "org", "The organization of the person"),
        ("emails", "Email", "varchar", "Email addresses"),
        ("phones", "Phone", "phone", "Phone numbers"),
        ("label_ids", "Labels", "set", "Labels of the person"),
        ("visible_to", "Visible to", "visible_to", "Visibility of the person"),
        ("job_title", "Job title", "varchar", "Job title"),
        ("birthday", "Birthday", "date", "Birthday"),
        ("postal_address", "Postal address", "address", "Postal address"),
        ("notes", "Notes", "text", "Notes"),
        ("add_time", "Person created", "date", "When the person was created"),
        ("update_time", "Update time", "date", "When the person was last updated"),
    ),
    "organization": (
        ("id", "ID", "int", "The ID of the organization"),
        ("name", "Name", "varchar", "The name of the organization"),
        ("owner_id", "Owner", "user", "The user who owns the organization"),
        ("address", "Address", "address", "Address of the organization"),
        ("label_ids", "Labels", "set", "Labels of the organization"),
        ("visible_to", "Visible to", "visible_to", "Visibility of the organization"),
        ("add_time", "Organization created", "date", "When the organization was created"),
        ("update_time", "Update time", "date", "When the organization was last updated"),
    ),
    "activity": (
        ("id", "ID", "int", "The ID of the activity"),
        ("subject", "Subject", "varchar", "The subject of the activity"),
        ("type", "Type", "varchar_options", "The type of the activity"),
        ("owner_id", "Assigned to user", "user", "The user the activity is assigned to"),
        ("deal_id", "Deal", "deal", "The deal of the activity"),
        ("lead_id", "Lead", "lead", "The lead of the activity"),
        ("person_id", "Contact person", "people", "The person of the activity"),
        ("org_id", "Organization", "org", "The organization of the activity"),
        ("project_id", "Project", "project", "The project of the activity"),
        ("due_date", "Due date", "date", "Due date"),
        ("due_time", "Due time", "time", "Due time"),
        ("duration", "Duration", "time", "Duration"),
        ("busy", "Busy flag", "boolean", "Whether the time is marked busy"),
        ("done", "Done", "boolean", "Whether the activity is done"),
        ("location", "Location", "address", "Location"),
        ("note", "Note", "text", "Note"),
        ("public_description", "Public description", "text", "Public description"),
        ("add_time", "Add time", "date", "When the activity was created"),
        ("update_time", "Update time", "date", "When the activity was last updated"),
    ),
    "product": (
        ("id", "ID", "int", "The ID of the product"),
        ("name", "Name", "varchar", "The name of the product"),
        ("code", "Product code", "varchar", "The product code"),
        ("description", "Description", "text", "The description of the product"),
        ("unit", "Unit", "varchar", "The unit in which the product is sold"),
        ("tax", "Tax", "double", "The tax percentage"),
        ("category", "Category", "varchar_options", "The category of the product"),
        ("owner_id", "Owner", "user", "The user who owns the product"),
        ("is_linkable", "Linkable", "boolean", "Whether the product can be added to a deal"),
        ("visible_to", "Visible to", "visible_to", "Visibility of the product"),
        ("prices", "Unit prices", "price_list", "The prices of the product per currency"),
        ("billing_frequency", "Billing frequency", "billing_frequency", "How often a customer is billed"),
        ("add_time", "Add time", "date", "When the product was created"),
        ("update_time", "Update time", "date", "When the product was last updated"),
    ),
}

# v1 lead fields (standard part); custom fields come from the deal custom fields.
STANDARD_V1_LEAD: tuple[tuple[str, str, str], ...] = (
    ("title", "Title", "varchar"),
    ("owner_id", "Owner", "user"),
    ("person_id", "Person", "people"),
    ("organization_id", "Organization", "org"),
    ("value", "Value", "monetary"),
    ("expected_close_date", "Expected close date", "date"),
    ("label_ids", "Labels", "set"),
    ("source_name", "Source", "varchar"),
    ("visible_to", "Visible to", "visible_to"),
    ("add_time", "Lead created", "date"),
    ("update_time", "Update time", "date"),
)
STANDARD_V1_NOTE: tuple[tuple[str, str, str], ...] = (
    ("content", "Content", "text"),
    ("user_id", "User", "user"),
    ("person_id", "Person", "people"),
    ("org_id", "Organization", "org"),
    ("add_time", "Add time", "date"),
    ("update_time", "Update time", "date"),
    ("pinned_to_deal_flag", "Note is pinned to deal", "enum"),
    ("pinned_to_person_flag", "Note is pinned to person", "enum"),
    ("pinned_to_organization_flag", "Note is pinned to organization", "enum"),
    ("pinned_to_lead_flag", "Note is pinned to lead", "enum"),
)

ENTITY_OF_V2_FIELDS = {
    "dealFields": "deal",
    "personFields": "person",
    "organizationFields": "organization",
    "activityFields": "activity",
    "productFields": "product",
}


def _ui_visibility(entity: str) -> dict[str, Any]:
    vis: dict[str, Any] = {"add_visible_flag": True, "details_visible_flag": True}
    if entity == "deal":
        vis["projects_detail_visible_flag"] = False
        vis["show_in_pipelines"] = {"show_in_all": True, "pipeline_ids": []}
    return vis


def v2_fields(ds: Dataset, entity: str) -> list[dict[str, Any]]:
    """The v2 field definitions of `entity` (person | organization | deal | activity | product): the standard
    fields, then the entity's custom fields, in the v2 spec's field schema (`field_code`,
    `field_name`, `field_type`, `options`, ...)."""
    out: list[dict[str, Any]] = []
    for code, name, ftype, desc in STANDARD_V2[entity]:
        item: dict[str, Any] = {
            "field_name": name,
            "field_code": code,
            "description": desc,
            "field_type": ftype,
            "options": None,
            "subfields": None,
            "is_custom_field": False,
            "is_optional_response_field": False,
            "ui_visibility": _ui_visibility(entity),
        }
        if ftype == "monetary":
            item["subfields"] = [
                {"field_code": code, "field_name": f"Amount of {name}", "field_type": "double"},
                {"field_code": "currency", "field_name": f"Currency of {name}", "field_type": "varchar"},
            ]
        if code == "status":
            item["options"] = [{"id": n, "label": s, "color": None, "update_time": None, "add_time": None} for n, s in enumerate(("open", "won", "lost"), 1)]
        if entity != "deal":
            item.pop("description")
        out.append(item)
    for f in ds.custom_fields.get(entity, ()):
        item = {
            "field_name": f.name,
            "field_code": f.key,
            "description": f"Custom {f.field_type} field",
            "field_type": f.field_type,
            "options": [{"id": oid, "label": label, "color": None, "update_time": rfc3339(T0), "add_time": rfc3339(T0)} for oid, label in f.options] or None,
            "subfields": (
                [
                    {"field_code": f.key, "field_name": f"Amount of {f.name}", "field_type": "double"},
                    {"field_code": f"{f.key}_currency", "field_name": f"Currency of {f.name}", "field_type": "varchar"},
                ]
                if f.field_type == "monetary"
                else None
            ),
            "is_custom_field": True,
            "is_optional_response_field": False,
            "ui_visibility": _ui_visibility(entity),
        }
        if entity != "deal":
            item.pop("description")
        out.append(item)
    return out


def _v1_field(fid: int, key: str, name: str, ftype: str, order: int, options: list[dict[str, Any]] | None, custom: bool) -> dict[str, Any]:
    return {
        "id": fid,
        "key": key,
        "name": name,
        "order_nr": order,
        "field_type": ftype,
        "add_time": v1_time(T0),
        "update_time": v1_time(T0),
        "last_updated_by_user_id": 1 if custom else None,
        "created_by_user_id": 1 if custom else None,
        "active_flag": True,
        "edit_flag": custom,
        "index_visible_flag": True,
        "details_visible_flag": True,
        "add_visible_flag": True,
        "important_flag": False,
        "bulk_edit_allowed": True,
        "searchable_flag": ftype in ("varchar", "text"),
        "filtering_allowed": True,
        "sortable_flag": True,
        "mandatory_flag": key == "title",
        "options": options,
    }


def v1_lead_fields(ds: Dataset) -> list[dict[str, Any]]:
    """The `/v1/leadFields` list: the standard lead fields, then the deal custom fields leads inherit."""
    out = [_v1_field(n + 1, key, name, ftype, n, None, False) for n, (key, name, ftype) in enumerate(STANDARD_V1_LEAD)]
    base = len(out)
    for n, f in enumerate(ds.custom_fields["deal"]):
        options = [{"id": oid, "label": label} for oid, label in f.options] or None
        out.append(_v1_field(1000 + n, f.key, f.name, f.field_type, base + n, options, True))
    return out


def v1_note_fields(ds: Dataset) -> list[dict[str, Any]]:
    """The `/v1/noteFields` list: the standard note fields (notes have no custom fields)."""
    out = []
    for n, (key, name, ftype) in enumerate(STANDARD_V1_NOTE):
        item: dict[str, Any] = {
            "id": n + 1,
            "key": key,
            "name": name,
            "field_type": ftype,
            "active_flag": True,
            "edit_flag": False,
            "bulk_edit_allowed": True,
            "mandatory_flag": key == "content",
        }
        if ftype == "enum":
            item["options"] = [{"id": 1, "label": "Yes"}, {"id": 0, "label": "No"}]
        out.append(item)
    return out


ENTITY_OF_V1_FIELDS = {
    "activityFields": "activity",
    "dealFields": "deal",
    "organizationFields": "organization",
    "personFields": "person",
    "productFields": "product",
}
# The v1 `Field` schema allows fewer field types than v2 uses: each v2-only type is served as the
# nearest one the v1 schema allows (ids as double, flags and statuses as enum, a deal as double).
V1_TYPE_OF_V2 = {
    "int": "double",
    "varchar_options": "enum",
    "stage": "enum",
    "status": "enum",
    "boolean": "enum",
    "deal": "double",
    "lead": "varchar",
    "project": "double",
}
V1_ENUM_OPTIONS = {
    "status": [{"id": 1, "label": "open"}, {"id": 2, "label": "won"}, {"id": 3, "label": "lost"}],
    "boolean": [{"id": 1, "label": "Yes"}, {"id": 0, "label": "No"}],
}
STANDARD_V1_PRODUCT: tuple[tuple[str, str, str], ...] = (
    ("name", "Name", "varchar"),
    ("code", "Product code", "varchar"),
    ("description", "Description", "text"),
    ("unit", "Unit", "varchar"),
    ("tax", "Tax", "double"),
    ("category", "Category", "enum"),
    ("owner_id", "Owner", "user"),
    ("active_flag", "Active", "enum"),
    ("selectable", "Selectable", "enum"),
    ("visible_to", "Visible to", "enum"),
    ("prices", "Unit prices", "monetary"),
    ("add_time", "Add time", "date"),
    ("update_time", "Update time", "date"),
)


def v1_entity_fields(ds: Dataset, entity: str) -> list[dict[str, Any]]:
    """`/v1/{entity}Fields`: the entity's standard fields (as the v2 list names them, typed within
    the v1 schema) and its custom fields. Products: their v1 standard fields, then the same custom
    fields `/api/v2/productFields` lists."""
    out: list[dict[str, Any]] = _v1_product_fields() if entity == "product" else []
    if entity == "product":
        base = len(out)
        for n, f in enumerate(ds.custom_fields.get(entity, ())):
            options = [{"id": oid, "label": label} for oid, label in f.options] or None
            item = _v1_field(5000 + n, f.key, f.name, f.field_type, base + n, options, True)
            if options is None:
                item.pop("options")  # as the standard product fields: the product field schema has no null options
            out.append(item)
        return out
    for n, (code, name, ftype, _desc) in enumerate(STANDARD_V2[entity]):
        options = V1_ENUM_OPTIONS.get(ftype) or (V1_ENUM_OPTIONS["boolean"] if V1_TYPE_OF_V2.get(ftype) == "enum" else None)
        out.append(_v1_field(n + 1, code, name, V1_TYPE_OF_V2.get(ftype, ftype), n, options, False))
    base = len(out)
    for n, f in enumerate(ds.custom_fields.get(entity, ())):
        options = [{"id": oid, "label": label} for oid, label in f.options] or None
        out.append(_v1_field(5000 + n, f.key, f.name, f.field_type, base + n, options, True))
    return out


def _v1_product_fields() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n, (key, name, ftype) in enumerate(STANDARD_V1_PRODUCT):
        item: dict[str, Any] = {
            "id": n + 1,
            "key": key,
            "name": name,
            "order_nr": n,
            "field_type": ftype,
            "add_time": v1_time(T0),
            "update_time": v1_time(T0),
            "last_updated_by_user_id": 1,
            "created_by_user_id": 1,
            "active_flag": True,
            "edit_flag": False,
            "add_visible_flag": True,
            "important_flag": False,
            "bulk_edit_allowed": True,
            "searchable_flag": ftype in ("varchar", "text"),
            "filtering_allowed": True,
            "sortable_flag": True,
            "mandatory_flag": key == "name",
        }
        if ftype == "enum":
            item["options"] = [{"id": 1, "label": "Yes"}, {"id": 0, "label": "No"}]
        out.append(item)
    return out
