"""The endpoints the sandbox serves, as data: API version, path, handler, latency class, paging style.

Routing, costs (costs.py), latency and stats all read this table; a new endpoint is an entry here
and a handler method on the version's class (v1.py or v2.py, or their mixins v1_crm.py, v2_crm.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .costs import API_PREFIX, TOKEN_COSTS


@dataclass(frozen=True)
class Endpoint:
    """One served operation: `api` (v1 | v2), `spec_path` as the spec writes it, the `handler`
    method name on that version's class, its `latency` class (list | single | body) and its `paging`
    style for a list (cursor: v2's `next_cursor`; offset: v1's `start`/`next_start`; None for a
    single object); `regex` matches a request path to it. The style is the spec's per operation,
    not per API version: v1's changelogs page by cursor."""

    api: str
    spec_path: str
    handler: str
    latency: str  # list | single | body
    paging: str | None  # cursor | offset | None
    regex: re.Pattern[str]

    @property
    def cost(self) -> int:
        """Its token cost, the spec's `x-token-cost` of the operation (costs.py)."""
        return TOKEN_COSTS[(self.api, self.spec_path)]

    @property
    def listing(self) -> bool:
        """Whether it serves a list (counted per query in stats)."""
        return self.paging is not None

    @property
    def template(self) -> str:
        """The full path template as requested, e.g. `/api/v2/persons/{id}` (the stats key)."""
        return API_PREFIX[self.api] + self.spec_path


def _ep(api: str, spec_path: str, handler: str, latency: str, paging: str | None) -> Endpoint:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", spec_path)
    return Endpoint(api, spec_path, handler, latency, paging, re.compile(f"^{pattern}$"))


ENDPOINTS: tuple[Endpoint, ...] = (
    _ep("v2", "/persons", "v2_list", "list", "cursor"),
    _ep("v2", "/persons/{id}", "v2_single", "single", None),
    _ep("v2", "/organizations", "v2_list", "list", "cursor"),
    _ep("v2", "/organizations/{id}", "v2_single", "single", None),
    _ep("v2", "/deals/archived", "v2_list", "list", "cursor"),
    _ep("v2", "/deals", "v2_list", "list", "cursor"),
    _ep("v2", "/deals/products", "v2_deals_products", "list", "cursor"),  # before /deals/{id}
    _ep("v2", "/deals/{id}", "v2_single", "single", None),
    _ep("v2", "/deals/{id}/products", "v2_deal_products", "list", "cursor"),
    _ep("v2", "/deals/{id}/followers", "v2_followers", "list", "cursor"),
    _ep("v2", "/persons/{id}/followers", "v2_followers", "list", "cursor"),
    _ep("v2", "/organizations/{id}/followers", "v2_followers", "list", "cursor"),
    _ep("v2", "/products", "v2_list", "list", "cursor"),
    _ep("v2", "/products/{id}", "v2_single", "single", None),
    _ep("v2", "/productFields", "v2_fields", "list", "cursor"),
    _ep("v2", "/productFields/{field_code}", "v2_field", "single", None),
    _ep("v2", "/activities", "v2_list", "list", "cursor"),
    _ep("v2", "/activities/{id}", "v2_single", "single", None),
    _ep("v2", "/pipelines", "v2_list", "list", "cursor"),
    _ep("v2", "/pipelines/{id}", "v2_single", "single", None),
    _ep("v2", "/stages", "v2_list", "list", "cursor"),
    _ep("v2", "/stages/{id}", "v2_single", "single", None),
    _ep("v2", "/personFields", "v2_fields", "list", "cursor"),
    _ep("v2", "/personFields/{field_code}", "v2_field", "single", None),
    _ep("v2", "/organizationFields", "v2_fields", "list", "cursor"),
    _ep("v2", "/organizationFields/{field_code}", "v2_field", "single", None),
    _ep("v2", "/dealFields", "v2_fields", "list", "cursor"),
    _ep("v2", "/dealFields/{field_code}", "v2_field", "single", None),
    _ep("v2", "/activityFields", "v2_fields", "list", "cursor"),
    _ep("v2", "/activityFields/{field_code}", "v2_field", "single", None),
    _ep("v1", "/leads/archived", "v1_leads", "list", "offset"),
    _ep("v1", "/leads", "v1_leads", "list", "offset"),
    _ep("v1", "/leads/{id}", "v1_single", "single", None),
    _ep("v1", "/notes", "v1_notes", "list", "offset"),
    _ep("v1", "/notes/{id}", "v1_single", "single", None),
    _ep("v1", "/users", "v1_users", "list", "offset"),
    _ep("v1", "/users/me", "v1_me", "single", None),  # before /users/{id}, which would take "me"
    _ep("v1", "/users/{id}", "v1_single", "single", None),
    _ep("v1", "/leadFields", "v1_fields", "list", "offset"),
    _ep("v1", "/noteFields", "v1_fields", "list", "offset"),
    _ep("v1", "/activityFields", "v1_fields", "list", "offset"),
    _ep("v1", "/dealFields", "v1_fields", "list", "offset"),
    _ep("v1", "/organizationFields", "v1_fields", "list", "offset"),
    _ep("v1", "/personFields", "v1_fields", "list", "offset"),
    _ep("v1", "/productFields", "v1_fields", "list", "offset"),
    _ep("v1", "/deals/summary", "v1_deals_summary", "single", None),
    _ep("v1", "/deals/summary/archived", "v1_deals_summary", "single", None),
    _ep("v1", "/deals/{id}/mailMessages", "v1_deal_mail", "list", "offset"),
    _ep("v1", "/mailbox/mailMessages/{id}", "v1_mail_message", "single", None),
    _ep("v1", "/files", "v1_files", "list", "offset"),
    _ep("v1", "/files/{id}", "v1_file", "single", None),
    _ep("v1", "/files/{id}/download", "v1_file_download", "body", None),
    _ep("v1", "/deals/{id}/participants", "v1_participants", "list", "offset"),
    _ep("v1", "/deals/{id}/flow", "v1_deal_flow", "list", "offset"),
    _ep("v1", "/deals/{id}/changelog", "v1_deal_changelog", "list", "cursor"),
)

V1_GONE = re.compile(r"^/(persons|organizations|deals|activities|pipelines|stages)(/archived|/\d+)?$")
V1_NOT_SERVED = re.compile(r"^/recents(/.*)?$")

KIND_OF_V2 = {
    "persons": "persons",
    "organizations": "organizations",
    "deals": "deals",
    "activities": "activities",
    "pipelines": "pipelines",
    "stages": "stages",
    "products": "products",
}
ENTITY_OF_KIND = {"persons": "person", "organizations": "organization", "deals": "deal", "products": "product"}
SINGULAR = {
    "persons": "Person",
    "organizations": "Organization",
    "deals": "Deal",
    "activities": "Activity",
    "pipelines": "Pipeline",
    "stages": "Stage",
    "leads": "Lead",
    "notes": "Note",
    "users": "User",
    "mail_messages": "Mail message",
    "products": "Product",
    "files": "File",
}


@dataclass(frozen=True)
class ListSpec:
    """How one v2 or v1 list endpoint lists its kind."""

    kind: str
    subset: str = "all"
    sorts: tuple[str, ...] = ("id", "update_time", "add_time")
    filters: tuple[tuple[str, str, str], ...] = ()  # (query param, record field, type)
    time_filters: bool = True


V2_LISTS: dict[str, ListSpec] = {
    "/persons": ListSpec("persons", filters=(("owner_id", "owner_id", "int"), ("org_id", "org_id", "int"), ("deal_id", "@deal_person", "int"))),
    "/organizations": ListSpec("organizations", filters=(("owner_id", "owner_id", "int"),)),
    "/deals": ListSpec(
        "deals",
        "active",
        filters=(
            ("owner_id", "owner_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("pipeline_id", "pipeline_id", "int"),
            ("stage_id", "stage_id", "int"),
            ("status", "status", "strset"),
        ),
    ),
    "/deals/archived": ListSpec(
        "deals",
        "archived",
        filters=(
            ("owner_id", "owner_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("pipeline_id", "pipeline_id", "int"),
            ("stage_id", "stage_id", "int"),
            ("status", "status", "strset"),
        ),
    ),
    "/activities": ListSpec(
        "activities",
        sorts=("id", "update_time", "add_time", "due_date"),
        filters=(
            ("owner_id", "owner_id", "int"),
            ("deal_id", "deal_id", "int"),
            ("lead_id", "lead_id", "str"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("done", "done", "bool"),
        ),
    ),
    "/pipelines": ListSpec("pipelines", time_filters=False),
    "/products": ListSpec("products", sorts=("id", "name", "add_time", "update_time"), filters=(("owner_id", "owner_id", "int"),), time_filters=False),
    "/stages": ListSpec("stages", sorts=("id", "update_time", "add_time", "order_nr"), filters=(("pipeline_id", "pipeline_id", "int"),), time_filters=False),
}
# Sort fields whose order equals index order (times grow with the index; due_date = add + 7 days).
MONOTONIC_SORTS = frozenset({"id", "add_time", "update_time", "due_date"})
