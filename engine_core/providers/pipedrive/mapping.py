"""Pipedrive rows -> the product's CRM columns: validation, field mapping and custom fields.

Pure functions: no I/O. A mapper checks its row and raises `MalformedRow` (with a reason that
names the field) when the row cannot be imported faithfully: no usable id, a name that is not text,
NUL bytes (Postgres text cannot hold them), a title longer than any real one, ids or times of the
wrong type. Hostile but valid text (markup, quotes, unusual unicode) is imported verbatim: values
travel as parameters, and escaping for display is the product's job.

A mapper returns a `Mapped`: the target table, the column values it knows, the parents the row
must be linked to (resolved through the ledger by the caller, one query per page) and the softer
references (owners, linked people, custom fields pointing at records) that are linked when found
and left empty when not. A deal's pipeline and stage are such soft links (the source's ids are
kept beside them); a stage's pipeline is a parent.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from engine_core import rows
from engine_core.ledger import content_version
from engine_core.target.crm import NOTE_CONTENT_MAX, fit_text, normal_domain, normal_email

SOURCE = "pipedrive"
TITLE_MAX = 2_000  # names, titles and subjects: longer is not a name, it is a defect
TEXT_MAX = 1_000_000  # mail bodies and snippets (a body is cut at crm.EMAIL_BODY_MAX before this check)
# activity notes and descriptions: kept whole up to what a note is (crm.NOTE_CONTENT_MAX)
LONG_TEXT_MAX = NOTE_CONTENT_MAX
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_FIELD_KEY = re.compile(r"^[0-9a-f]{40}$")

# Where a reference may be found in the ledger. A source record has one identity whichever list
# served it: the archived lists' tasks (`deals_archived`, `leads_archived`) write
# ledger kind `deals` / `leads`, and migration 0008 folded the entries older code kept apart. The
# old kinds are still read, after the new one, so that entries an older worker writes during a
# rolling upgrade (after the fold) still resolve; nothing new is written under them.
DEAL_KINDS = ("deals", "deals_archived")
LEAD_KINDS = ("leads", "leads_archived")
PERSON_KINDS = ("persons",)
ORG_KINDS = ("organizations",)
USER_KINDS = ("users",)
KINDS_OF_REF = {"deal": DEAL_KINDS, "lead": LEAD_KINDS, "person": PERSON_KINDS, "org": ORG_KINDS, "user": USER_KINDS,
                "pipeline": ("pipelines",), "stage": ("stages",)}
REF_WORD = {"deal": "deal", "lead": "lead", "person": "person", "org": "organization", "user": "user",
            "pipeline": "pipeline", "stage": "stage"}

# The engine's row shape (engine_core/rows.py); Pipedrive's references have words of their own.
MalformedRow = rows.MalformedRow
Mapped = rows.Mapped


Ref = rows.Ref


def ref_to(column: str, ref: str, source_id: str, source_field: str = "", *,
           path: tuple[str | int, ...] = (), into: str = "record_id") -> Ref:
    """A Pipedrive reference as plain data: `ref` is a word (deal | lead | person | org | user |
    pipeline | stage), looked up under the ledger kinds of `KINDS_OF_REF` (an archived list's
    old kind too) and named in a skip's reason by `REF_WORD`; `path`/`into`: where inside the
    row's JSON the local id goes (`rows.Ref`). Raises KeyError for another word."""
    return Ref(column, ref, source_id, source_field, lookup=KINDS_OF_REF[ref], noun=REF_WORD[ref],
               path=path, into=into)


def source_version(row: Mapping[str, Any], name: str = "update_time") -> str:
    """A row's source version as the ledger keeps it (migration 0010): its update time exactly as
    served (`update_time`; users: `modified`), or for a row without one "sha256:" + the hex digest
    of the row's canonical JSON (`ledger.content_version`)."""
    value = row.get(name)
    if isinstance(value, str) and value.strip():
        return value
    return content_version(row)


# --- field checks ----------------------------------------------------------------------------


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# What a Pipedrive row keeps however it is served and however it changes: its creation time and
# creator (a message: its Message-ID and time). The key of a row without a readable id is a digest
# of these (`unreadable_key`): the same deal listed with and without `email_messages_count` (the
# deals phase, the catch-up) is one row.
IDENTITY_FIELDS = ("add_time", "creator_user_id", "creator_id", "user_id", "mua_message_id", "message_time")


def unreadable_key(row: Any) -> str:
    """The key a row without a readable id is recorded under (`engine_core.rows.unreadable_key`
    over IDENTITY_FIELDS): `"abc sha256:<16 hex>"` for a row served with id "abc",
    `"sha256:<16 hex>"` for one served without an id."""
    return rows.unreadable_key(row, IDENTITY_FIELDS)


def sound_id(row: Any) -> str | None:
    """The row's id when it is one Pipedrive gives (a positive integer, a lead's uuid: lowercase),
    else None - whatever the row's kind. What a malformed row is kept in the ledger under
    (`writers`) and what a v1 walk lines its overlapping pages up by (`inventory.v1_step`): a row
    served with an id that is not one ("abc") may be served many times in one list."""
    value = row.get("id") if isinstance(row, Mapping) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and _UUID.match(value.strip()):
        return value.strip().lower()
    return None


def row_source_id(row: Any, kind: str) -> str:
    """The row's id as the ledger keys it; leads have uuids, everything else positive integers."""
    if not isinstance(row, Mapping):
        raise MalformedRow(f"{kind} row is not an object")
    if "id" not in row or row["id"] is None:
        raise MalformedRow("id is missing")
    value = row["id"]
    if kind in LEAD_KINDS:
        if isinstance(value, str) and _UUID.match(value):
            return value.lower()
        raise MalformedRow(f"id is not a lead uuid: {_describe(value)}")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    raise MalformedRow(f"id is not a positive integer: {_describe(value)}")


def text(row: Mapping[str, Any], name: str, *, required: bool = False, limit: int = TITLE_MAX) -> str | None:
    """The text field `name` (None when absent or, unless `required`, empty). Raises MalformedRow
    naming the field when it is missing but required, not text, holds NUL or is over `limit` characters."""
    value = row.get(name)
    if value is None or (not required and value == ""):
        if required:
            raise MalformedRow(f"{name} is missing")
        return None
    if not isinstance(value, str):
        raise MalformedRow(f"{name} is not text: {_describe(value)}")
    if "\x00" in value:
        raise MalformedRow(f"{name} contains NUL bytes")
    if len(value) > limit:
        raise MalformedRow(f"{name} is {len(value):,} characters long (at most {limit:,})")
    if required and not value.strip():
        raise MalformedRow(f"{name} is empty")
    return value


def ref_id(row: Mapping[str, Any], name: str, *, uuid: bool = False) -> str | None:
    """The id in field `name` as the ledger keys it (a v1 `{value: id}` object unwrapped; `uuid`: a
    lead's, lowercased), None when absent. Raises MalformedRow naming the field for anything else."""
    value = row.get(name)
    if value is None:
        return None
    if uuid:
        if isinstance(value, str) and _UUID.match(value):
            return value.lower()
        raise MalformedRow(f"{name} is not a uuid: {_describe(value)}")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, Mapping) and "value" in value:  # v1 sometimes nests {"value": id, "name": ...}
        return ref_id({name: value["value"]}, name)
    raise MalformedRow(f"{name} is not an id: {_describe(value)}")


def timestamp(row: Mapping[str, Any], name: str) -> datetime | None:
    """RFC 3339 (v2, `2026-01-01T10:00:00Z`, with or without milliseconds) or v1 (`2026-01-01 10:00:00`, UTC)."""
    value = row.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedRow(f"{name} is not a time: {_describe(value)}")
    raw = value.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(raw.replace(" ", "T", 1))
    except ValueError:
        raise MalformedRow(f"{name} is not a time: {_describe(value)}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def day(row: Mapping[str, Any], name: str) -> date | None:
    """The date in field `name` (ISO, time of day ignored), None when absent or empty. Raises
    MalformedRow naming the field when it is not a date."""
    value = row.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise MalformedRow(f"{name} is not a date: {_describe(value)}")
    try:
        return date.fromisoformat(value.strip()[:10])
    except ValueError:
        raise MalformedRow(f"{name} is not a date: {_describe(value)}") from None


def number(row: Mapping[str, Any], name: str) -> float | None:
    """The number in field `name` as a float (Pipedrive serves some as strings), None when absent
    or empty. Raises MalformedRow naming the field when it is not a number."""
    value = row.get(name)
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedRow(f"{name} is not a number: {_describe(value)}")
    # a float as it was read (the client's `NonFinite`, a NaN or an infinity, keeps its type: the
    # window's encoder then writes it as before, not as orjson's null)
    return value if isinstance(value, float) else float(value)


def flag(row: Mapping[str, Any], name: str) -> bool | None:
    """The boolean in field `name` (v1 serves 0/1 and "0"/"1"), None when absent. Raises
    MalformedRow naming the field for anything else."""
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if value in (0, 1, "0", "1"):
        return bool(int(value))
    raise MalformedRow(f"{name} is not a flag: {_describe(value)}")


def json_value(row: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """A nested object or list kept as jsonb; Postgres jsonb cannot hold NUL either."""
    value = row.get(name)
    if value is None:
        return None
    if not isinstance(value, kind):
        raise MalformedRow(f"{name} has the wrong shape: {_describe(value)}")
    _no_nul(value, name)
    return value


def _no_nul(value: Any, name: str) -> None:
    """Raise MalformedRow when a text anywhere in `value` (keys too) holds NUL. Walked without
    recursion, plain dicts, lists and texts by their exact type first (a row's custom fields call
    this for every value: the ABC checks were a third of the mapping's time, profiled)."""
    todo = [value]
    while todo:
        v = todo.pop()
        t = type(v)
        if t is str:
            if "\x00" in v:
                raise MalformedRow(f"{name} contains NUL bytes")
        elif t is dict:
            todo.extend(v)
            todo.extend(v.values())
        elif t is list or t is tuple:
            todo.extend(v)
        elif t is int or t is float or t is bool or v is None:
            continue
        elif isinstance(v, str):
            if "\x00" in v:
                raise MalformedRow(f"{name} contains NUL bytes")
        elif isinstance(v, Mapping):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)


def labels(row: Mapping[str, Any], name: str = "label_ids") -> list[Any]:
    """The list in field `name` (label ids), [] when absent. Raises MalformedRow when not a list."""
    value = json_value(row, name, list)
    return list(value or [])


def visible_to(row: Mapping[str, Any]) -> str | None:
    """The row's visibility group as text (`"3"`), None when absent. Raises MalformedRow naming
    the field when it is neither a number nor text."""
    value = row.get("visible_to")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise MalformedRow(f"visible_to has the wrong type: {_describe(value)}")
    return str(value)


def _common(row: Mapping[str, Any], sid: str, tenant_id: str, created: str = "add_time", updated: str = "update_time") -> dict[str, Any]:
    return {
        "tenant_id": tenant_id,
        "source": SOURCE,
        "source_id": sid,
        "source_created_at": timestamp(row, created),
        "source_updated_at": timestamp(row, updated),
    }


def _link(refs: list[Ref], column: str, ref: str, source_id: str | None, field: str = "") -> None:
    if source_id is not None:
        refs.append(ref_to(column, ref, source_id, field))


# --- custom fields ---------------------------------------------------------------------------


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


# --- the mappers -----------------------------------------------------------------------------


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


# --- mail ------------------------------------------------------------------------------------


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
