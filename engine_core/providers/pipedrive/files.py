"""Pipedrive files (`/v1/files`) -> crm.files, and a download's answer -> the file's content status.

Pure functions, as in `mapping`. A file's deal, lead, person, organization, activity and product
are soft links: a file stays listed after its parent is deleted, and its metadata is imported
all the same (the v1 file object names no note). The bytes are fetched afterwards, through the
file store port (`engine_core.target.files`); until then a file is `pending`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_core import rows
from engine_core.providers.pipedrive.mapping import (
    Mapped,
    MalformedRow,
    _common,
    _link,
    ref_id,
    row_source_id,
    source_version,
    text,
)

# What a download's HTTP status says about the file's bytes (crm.files.content_status): 403 the
# file is private to another user, 404 it was purged from the source's storage while still listed.
DOWNLOAD_STATUS = {403: "forbidden", 404: "missing"}


def content_status(status: int) -> str:
    """crm.files.content_status for a download that answered `status` (not 200): `forbidden` for
    403, `missing` for 404. Raises ValueError for any other status (a transient one is retried
    by the client, never recorded)."""
    try:
        return DOWNLOAD_STATUS[status]
    except KeyError:
        raise ValueError(f"a download answering {status} says nothing about the file") from None


def map_file(row: Mapping[str, Any], tenant_id: str, book: Any = None) -> Mapped:
    """A v1 file as a crm.files row (`content_status` pending). Raises MalformedRow naming the
    field: no file name, a size that is not a count of bytes."""
    sid = row_source_id(row, "files")
    links: list[rows.Ref] = []
    _link(links, "deal_id", "deal", ref_id(row, "deal_id"), "deal_id")
    _link(links, "lead_id", "lead", ref_id(row, "lead_id", uuid=True), "lead_id")
    _link(links, "contact_id", "person", ref_id(row, "person_id"), "person_id")
    _link(links, "company_id", "org", ref_id(row, "org_id"), "org_id")
    _link(links, "owner_id", "user", ref_id(row, "user_id"))
    for column, kind, field in (("activity_id", "activities", "activity_id"), ("product_id", "products", "product_id")):
        if (ident := ref_id(row, field)) is not None:
            links.append(rows.Ref(column, kind, ident, field))
    size = row.get("file_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise MalformedRow(f"file_size is not a count of bytes: {size!r}"[:80])
    values = {
        **_common(row, sid, tenant_id),
        "name": text(row, "name"),
        "file_name": text(row, "file_name", required=True),
        "file_type": text(row, "file_type"),
        "file_size": size,
        "description": text(row, "description", limit=100_000),
        "remote_location": text(row, "remote_location"),
        "content_status": "pending",
    }
    return Mapped("files", sid, values, links=links, version=source_version(row))
