"""A deal's mail message -> an `emails` row: the listing's message mapped (`map_email`), its
body added once fetched (`with_body`), its text made what Postgres can hold (`clean_strings`).

Pure functions: no I/O. The deal whose listing served the message is its parent; the people a
sender or recipient address is linked to are soft links into the row's JSON.
"""
from __future__ import annotations

import re
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


def with_values(mapped: Mapped, values: dict[str, Any]) -> Mapped:
    """A copy of the row with `values` set over its own (references and version kept)."""
    return Mapped(mapped.table, mapped.source_id, {**mapped.values, **values}, mapped.parents, mapped.links,
                  version=mapped.version)


def message_or_item(item: Any) -> Any:
    """The message a listing item wraps (`message_of`), or the item itself when it wraps none."""
    try:
        return message_of(item)
    except MalformedRow:
        return item


def sound_message_id(item: Any) -> str | None:
    """The id of the message a listing item wraps, as the ledger keys it, or None when it has no
    readable one (the row is then kept under its raw key)."""
    try:
        return row_source_id(message_of(item), "emails")
    except MalformedRow:
        return None


# --- text Postgres can hold --------------------------------------------------------------------

# Postgres text and jsonb cannot hold NUL, and a lone UTF-16 surrogate (a JSON `\ud800` escape
# without its pair; json.loads joins real pairs into one character) cannot be encoded as UTF-8.
_UNHOLDABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(value: str) -> tuple[str, int]:
    """`value` with NUL characters removed and lone surrogates replaced by U+FFFD; returns the
    text and how many characters were repaired (0: the same string, untouched)."""
    if _UNHOLDABLE.search(value) is None:
        return value, 0
    nul = value.count("\x00")
    text, surrogates = _SURROGATE.subn("\ufffd", value.replace("\x00", ""))
    return text, nul + surrogates


def clean_strings(value: Any) -> tuple[Any, int]:
    """Every string in a JSON value (dict keys too) through `clean_text`; returns the repaired
    value (the same object when nothing needed repair) and the number of characters repaired."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        fixed = 0
        out: dict[Any, Any] = {}
        for k, v in value.items():
            k2, n1 = clean_strings(k)
            v2, n2 = clean_strings(v)
            out[k2] = v2
            fixed += n1 + n2
        return (out if fixed else value), fixed
    if isinstance(value, list):
        pairs = [clean_strings(v) for v in value]
        fixed = sum(n for _, n in pairs)
        return ([v for v, _ in pairs] if fixed else value), fixed
    return value, 0
