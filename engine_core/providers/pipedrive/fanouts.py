"""A record's per-row lists -> rows: a deal's participants (`/v1/deals/{id}/participants`), the
followers of a deal, person or organization (`/api/v2/{kind}/{id}/followers`) and a deal's
history (`/v1/deals/{id}/changelog`).

Pure functions, as in `mapping`. Each row's record (the deal, person or organization whose list
served it) is its parent. Followers and changelog entries have no id of their own at the source:
a follower is keyed by its record and user (one user follows a record once), a change by its deal
and a digest of what it says (field, values, time, actor) - the same entry served again is the
same row.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from engine_core.providers.pipedrive.mapping import (
    Mapped,
    MalformedRow,
    Ref,
    ref_to,
    _link,
    flag,
    ref_id,
    row_source_id,
    source_version,
    text,
    timestamp,
)
from engine_core.providers.pipedrive.mapping import SOURCE

# The record kinds whose followers are read, and how a follower row names its record.
FOLLOWED = {"deals": ("deal_id", "deal"), "persons": ("contact_id", "person"), "organizations": ("company_id", "org")}


def _base(sid: str, tenant_id: str, created: Any = None, updated: Any = None) -> dict[str, Any]:
    return {"tenant_id": tenant_id, "source": SOURCE, "source_id": sid, "source_created_at": created,
            "source_updated_at": updated}


def map_participant(row: Mapping[str, Any], tenant_id: str, deal_source_id: str) -> Mapped:
    """One entry of a deal's participants as a crm.deal_participants row: the deal and the person
    are parents (a participant whose person is gone is not written). Its version is its update
    time, or a digest of its own fields (id, person, active flag, times, who added it) - not of the
    person and deal the source embeds. Raises MalformedRow naming the field."""
    sid = row_source_id(row, "deal_participants")
    person = ref_id(row, "person_id") or ref_id(row.get("person") or {}, "id")
    if person is None:
        raise MalformedRow("person_id is missing")
    links: list[Ref] = []
    _link(links, "added_by_id", "user", ref_id(row, "added_by_user_id"))
    values = {
        **_base(sid, tenant_id, timestamp(row, "add_time"), timestamp(row, "update_time")),
        "contact_ref": person,
        "active": flag(row, "active_flag") is not False,
    }
    parents = [ref_to("deal_id", "deal", deal_source_id, "deal_id"), ref_to("contact_id", "person", person, "person_id")]
    # the version of what the row says, not of the person, deal and user it embeds (a person renamed
    # is not a participant changed)
    own = {"id": sid, "person_id": person, "active_flag": row.get("active_flag"), "add_time": row.get("add_time"),
           "update_time": row.get("update_time"), "added_by_user_id": ref_id(row, "added_by_user_id")}
    return Mapped("deal_participants", sid, values, parents=parents, links=links, version=source_version(own))


def map_follower(row: Mapping[str, Any], tenant_id: str, kind: str, record_source_id: str) -> Mapped:
    """One follower (`{user_id, add_time}`) of the `kind` record `record_source_id` (kind: deals,
    persons or organizations) as a crm.followers row keyed `<kind>:<record>:<user>`; the user is a
    soft link (`user_ref` keeps the source's id). Raises MalformedRow naming the field."""
    if not isinstance(row, Mapping):
        raise MalformedRow("follower row is not an object")
    user = ref_id(row, "user_id")
    if user is None:
        raise MalformedRow("user_id is missing")
    column, word = FOLLOWED[kind]
    sid = f"{kind}:{record_source_id}:{user}"
    links: list[Ref] = []
    _link(links, "user_id", "user", user)
    added = timestamp(row, "add_time")
    values = {**_base(sid, tenant_id, added, added), "user_ref": user}
    parents = [ref_to(column, word, record_source_id, "id")]
    return Mapped("followers", sid, values, parents=parents, links=links, version=source_version(row))


def change_key(deal_source_id: str, row: Mapping[str, Any]) -> str:
    """The source id of a changelog entry: `<deal>:<16 hex>`, a digest of its field, old and new
    values, time and actor - what the entry says, the same however often it is served."""
    said = {k: row.get(k) for k in ("field_key", "old_value", "new_value", "time", "actor_user_id")}
    digest = hashlib.sha256(json.dumps(said, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return f"{deal_source_id}:{digest}"


def _value_text(row: Mapping[str, Any], name: str) -> str | None:
    value = row.get(name)
    if value is None or isinstance(value, str):
        return text(row, name, limit=100_000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, sort_keys=True, default=str)


def map_deal_change(row: Mapping[str, Any], tenant_id: str, deal_source_id: str) -> Mapped:
    """One changelog entry of a deal as a crm.deal_history row (values as text, as the source
    serves them). Raises MalformedRow naming the field: no field key, no time."""
    if not isinstance(row, Mapping):
        raise MalformedRow("changelog row is not an object")
    field = text(row, "field_key", required=True)
    changed = timestamp(row, "time") or timestamp(row, "log_time")
    if changed is None:
        raise MalformedRow("time is missing")
    sid = change_key(deal_source_id, row)
    links: list[Ref] = []
    _link(links, "actor_id", "user", ref_id(row, "actor_user_id") or ref_id(row, "user_id"))
    values = {
        **_base(sid, tenant_id, changed, changed),
        "field_key": field,
        "old_value": _value_text(row, "old_value"),
        "new_value": _value_text(row, "new_value"),
        "changed_at": changed,
        "change_source": text(row, "change_source"),
    }
    return Mapped("deal_history", sid, values, parents=[ref_to("deal_id", "deal", deal_source_id, "deal_id")],
                  links=links, version=source_version(row, "time"))
