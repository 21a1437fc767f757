"""A deal's mail message -> an `emails` row: the listing's message mapped (`map_email`), its
body added once fetched (`with_body`).

Pure functions: no I/O. The deal whose listing served the message is its parent; the people a
sender or recipient address is linked to are soft links into the row's JSON.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_core.providers.pipedrive.mapping import (TEXT_MAX, MalformedRow, Mapped, Ref, _common, _describe, flag,
                                                     json_value, ref_id, ref_to, row_source_id, source_version, text,
                                                     timestamp)


def message_of(item: Any) -> Mapping[str, Any]:
    """A deal's mail listing wraps each message as `{object, timestamp, data}`."""
    if isinstance(item, Mapping) and isinstance(item.get("data"), Mapping):
        return item["data"]
    if isinstance(item, Mapping) and "subject" in item:
        return item
    raise MalformedRow("the mail listing item has no message")


def _parties(message: Mapping[str, Any], name: str, links: list[Ref], role: str) -> list[dict[str, Any]]:
    raw = json_value(message, name, list) or []
    out = []
    for n, party in enumerate(raw):
        if not isinstance(party, Mapping):
            raise MalformedRow(f"{name} has the wrong shape: {_describe(party)}")
        email = party.get("email_address")
        if email is not None and not isinstance(email, str):
            raise MalformedRow(f"{name} has a non-text address: {_describe(email)}")
        person = ref_id(party, "linked_person_id")
        out.append({"email": email, "name": party.get("name") or None, "contact_id": None})
        if person is not None:
            where = ("sender", n) if role == "sender" else ("recipients", role, n)
            links.append(ref_to(f"{role}.{n}", "person", person, path=where, into="contact_id"))
    return out


def map_email(item: Any, tenant_id: str, deal_source_id: str) -> Mapped:
    """A mail message from a deal's listing (its body comes later: `with_body`); its parent is
    the deal whose listing it came from."""
    message = message_of(item)
    sid = row_source_id(message, "emails")
    parents: list[Ref] = [ref_to("deal_id", "deal", deal_source_id, "deal_id")]
    links: list[Ref] = []
    sender = _parties(message, "from", links, "sender")
    recipients = {k: _parties(message, k, links, k) for k in ("to", "cc", "bcc")}
    values = {
        **_common(message, sid, tenant_id),
        "subject": text(message, "subject") or "",
        "snippet": text(message, "snippet", limit=TEXT_MAX),
        "body": None,
        "sender": sender,
        "recipients": recipients,
        "sent_at": timestamp(message, "message_time"),
        "outbound": flag(message, "sent_flag"),
        "thread_ref": str(message["mail_thread_id"]) if isinstance(message.get("mail_thread_id"), (int, str)) else None,
        "has_attachments": bool(flag(message, "has_attachments_flag")),
    }
    return Mapped("emails", sid, values, parents=parents, links=links, version=source_version(message))


def with_body(mapped: Mapped, message: Any) -> Mapped:
    """The message as fetched with `include_body=1`: its `body` checked and added."""
    body = message.get("body") if isinstance(message, Mapping) else None
    if body is not None:
        if not isinstance(body, str):
            raise MalformedRow(f"body is not text: {_describe(body)}")
        if "\x00" in body:
            raise MalformedRow("body contains NUL bytes")
        if len(body) > TEXT_MAX:
            raise MalformedRow(f"body is {len(body):,} characters long (at most {TEXT_MAX:,})")
    return Mapped(mapped.table, mapped.source_id, {**mapped.values, "body": body}, mapped.parents, mapped.links,
                  version=mapped.version)
