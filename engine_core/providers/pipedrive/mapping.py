"""Pipedrive rows -> the engine's row shape: the checks every mapper makes of a row's values.

Pure functions: no I/O. A check reads one field and raises `MalformedRow` (with a reason that
names the field) when the row cannot be imported faithfully: no usable id, a name that is not text,
NUL bytes (Postgres text cannot hold them), a title longer than any real one, ids or times of the
wrong type. Hostile but valid text (markup, quotes, unusual unicode) is imported verbatim: values
travel as parameters, and escaping for display is the product's job.

References are plain data (`ref_to`): the ledger kinds a reference is looked up under and the word
a skip's reason names it by. The mappers built from these checks are in `mappers.py` (one per
record kind), `mail.py` (a deal's mail) and the fan-out kinds' modules; custom fields in
`fields.py`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date, datetime, timezone
from typing import Any

from engine_core import rows
from engine_core.rows import NOTE_CONTENT_MAX, content_version

SOURCE = "pipedrive"
TITLE_MAX = 2_000  # names, titles and subjects: longer is not a name, it is a defect
TEXT_MAX = 1_000_000  # mail bodies and snippets (a body is cut at rows.EMAIL_BODY_MAX before this check)
# activity notes and descriptions: kept whole up to what a note is (crm.NOTE_CONTENT_MAX)
LONG_TEXT_MAX = NOTE_CONTENT_MAX
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")

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
    of the row's canonical JSON (`rows.content_version`)."""
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
