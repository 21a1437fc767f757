"""Pipedrive's custom fields: their definitions (`FieldDef`, `FieldBook`) and the values a row
keeps under them.

Pure functions: no I/O. A v2 row carries its custom values under `custom_fields`, a v1 row as
top-level 40-hex keys; either way each value is stored as what the record says (`custom_value`),
and a value that points at a record (a user, organization, person or deal field) is a link.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from engine_core.providers.pipedrive.mapping import MalformedRow, Ref, _describe, _no_nul, ref_to

_FIELD_KEY = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class FieldDef:
    """One field definition: `entity` (deal | person | ...), its 40-hex `key`, display `name`,
    `field_type` (Pipedrive's), `options` as (id, label) pairs, and whether it is custom."""
    entity: str
    key: str
    name: str
    field_type: str
    options: tuple[tuple[Any, str], ...] = ()
    is_custom: bool = True

    def label(self, option_id: Any) -> str | None:
        """The label of option `option_id` (compared as text), None when the field has no such option."""
        for oid, label in self.options:
            if str(oid) == str(option_id):
                return label
        return None


class FieldBook:
    """Field definitions by entity and key, read once per run."""

    def __init__(self, definitions: Iterable[Mapping[str, Any]] = ()) -> None:
        self._by: dict[str, dict[str, FieldDef]] = {}
        for d in definitions:
            options = tuple((o.get("id"), str(o.get("label"))) for o in (d.get("options") or []) if isinstance(o, Mapping))
            f = FieldDef(d["entity"], d["field_key"], d["name"], d["field_type"], options, bool(d.get("is_custom", True)))
            self._by.setdefault(f.entity, {})[f.key] = f
        # each entity's custom fields, once (built again for every row, it was 3-4% of the
        # entity path's mapping); a lead's are the deal's when the book has none of its own
        self._custom = {e: {k: f for k, f in defs.items() if f.is_custom} for e, defs in self._by.items()}
        if "lead" not in self._custom:
            self._custom["lead"] = self._custom.get("deal", {})

    def __len__(self) -> int:
        return sum(len(v) for v in self._by.values())

    def custom(self, entity: str) -> dict[str, FieldDef]:
        """The entity's custom fields by key (a lead's: the deal's when it has none); the book's own
        dict, not to be changed."""
        return self._custom.get(entity, {})

    def get(self, entity: str, key: str) -> FieldDef | None:
        """The definition of `key` on `entity`'s custom fields, None when the book has none."""
        return self.custom(entity).get(key)


REF_TYPES = {"user": "user", "org": "org", "people": "person", "deal": "deal"}


def custom_value(f: FieldDef, value: Any, currency: Any = None) -> dict[str, Any] | None:
    """One stored custom value: what the record says - the type it was read as, the value (an
    option's id, a set's ids, a linked record's source id), a monetary value's currency. No copy
    of the field's name or option labels: those change at the source without the record changing,
    so they are read through the definitions (the view crm.custom_field_values, migration 0015)."""
    if value is None or value == "":
        return None
    out: dict[str, Any] = {"type": f.field_type, "value": value}
    t = f.field_type
    if t == "enum":
        option = value.get("id") if isinstance(value, Mapping) else value
        out["value"] = option
    elif t == "set":
        if isinstance(value, str):  # v1: "163,165"
            items: list[Any] = [int(x) if x.strip().isdigit() else x.strip() for x in value.split(",") if x.strip()]
        elif isinstance(value, list):
            items = [v.get("id") if isinstance(v, Mapping) else v for v in value]
        else:
            raise MalformedRow(f"custom field {f.name!r} is not a set: {_describe(value)}")
        out["value"] = items
    elif t == "monetary":
        if isinstance(value, Mapping):  # v2: {"value", "currency"}
            out["value"] = value.get("value")
            out["currency"] = value.get("currency")
        else:  # v1: the amount, with the currency in <key>_currency
            out["currency"] = currency
    elif t in REF_TYPES:
        if isinstance(value, Mapping):
            value = value.get("value", value.get("id"))
        out["value"] = value
    # the keys are the literals above; texts and numbers are checked here, nested values walked
    # (walking the whole dict for every custom value was a third of a person's mapping)
    for v in out.values():
        t = type(v)
        if t is str:
            if "\x00" in v:
                raise MalformedRow(f"custom field {f.name!r} contains NUL bytes")
        elif not (t is int or t is float or t is bool or v is None):
            _no_nul(v, f"custom field {f.name!r}")
    return out


def custom_fields_v2(book: FieldBook, entity: str, row: Mapping[str, Any], links: list[Ref]) -> dict[str, Any]:
    """v2 rows carry custom values under `custom_fields`: {key: stored value} with each
    reference to a record added to `links`. Raises MalformedRow when it is not an object."""
    raw = row.get("custom_fields")
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise MalformedRow(f"custom_fields is not an object: {_describe(raw)}")
    defs = book.custom(entity)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        f = defs.get(key) or FieldDef(entity, key, key, "unknown")
        stored = custom_value(f, value)
        if stored is None:
            continue
        out[key] = stored
        _custom_link(f, stored, key, links)
    return out


def custom_fields_v1(book: FieldBook, entity: str, row: Mapping[str, Any], links: list[Ref]) -> dict[str, Any]:
    """v1 rows carry custom values as top-level keys (monetary currency in `<key>_currency`)."""
    out: dict[str, Any] = {}
    defs = book.custom(entity)
    for key, value in row.items():
        if not isinstance(key, str) or not _FIELD_KEY.match(key):
            continue
        f = defs.get(key) or FieldDef(entity, key, key, "unknown")
        stored = custom_value(f, value, row.get(f"{key}_currency"))
        if stored is None:
            continue
        out[key] = stored
        _custom_link(f, stored, key, links)
    return out


def _custom_link(f: FieldDef, stored: dict[str, Any], key: str, links: list[Ref]) -> None:
    ref = REF_TYPES.get(f.field_type)
    value = stored.get("value")
    if ref and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        links.append(ref_to(f"custom_fields.{key}", ref, str(value)))
