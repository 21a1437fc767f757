"""The engine's row shape: what a provider's mapper hands the write path (engine_core/write.py).

A provider fetches its source rows and maps each into a `Mapped`: the target table, the column
values it knows, the references to other source records by source id - parents (`Mapped.parents`:
every one must be written first, or the row is skipped as a placeholder a later write takes over)
and soft links (`Mapped.links`: filled when found, left empty when not) - the source version the
ledger records, and the match keys of tables whose rows may already be in the product
(`match_emails` for contacts; companies and users match on their own `name`/`domain`/`email`
values, `engine_core/target/crm.py`). The engine resolves the references through the ledger (one
query per page), claims, writes and checkpoints; the row flows one way.

A mapper that cannot map a row raises `MalformedRow` (or a subclass) with a reason naming the
field: the row then fails alone, with that reason, in its window.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_core.errors import EngineError


class MalformedRow(EngineError):
    """The source row is malformed."""


UNREADABLE_KEY_MAX = 64  # characters of a served id kept as the key (the ledger's source ids: 64)
EXCERPT_MAX = 300  # characters of a row's JSON kept with its record


def _canonical(row: Any) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)


def unreadable_key(row: Any, identity: Sequence[str] = ()) -> str:
    """The key a row without a readable id is recorded under (`migration_unreadable.raw_key`,
    migration 0013): `"sha256:"` and 16 hex digits, after the row's id as served and a space when
    it has one (`"abc sha256:1f0c..."`; the id as text, at most UNREADABLE_KEY_MAX characters:
    `"-3"`, `"1.5"`, `"true"`, `'""'` for an empty string). `migrate explain` finds the record by
    the whole key or by the id part alone.

    The digest is of the row's `identity` fields present in it - what a row keeps however it is
    served and however it changes (a provider's creation time and creator: the same deal listed
    with and without `email_messages_count` is one row); a `*_time` text counts by its digits
    alone, so "2020-03-17 18:16:04" and "2020-03-17T18:16:04Z" are one instant - else, when it has
    none of them, of the whole row's canonical JSON. It tells apart rows served with the same bad
    id, and the same row served again (a retry, another listing, a later run) gets the same key,
    so its record is refreshed, not added."""
    basis: Any = row
    if isinstance(row, Mapping) and identity:
        fields = {f: (re.sub(r"\D", "", row[f]) if f.endswith("_time") and isinstance(row[f], str) else row[f])
                  for f in identity if row.get(f) is not None}
        if fields:
            basis = fields
    digest = "sha256:" + hashlib.sha256(_canonical(basis).encode()).hexdigest()[:16]
    if isinstance(row, Mapping) and row.get("id") is not None:
        value = row["id"]
        text = value if isinstance(value, str) and value.strip() and " " not in value else _canonical(value)
        return f"{text[:UNREADABLE_KEY_MAX]} {digest}"
    return digest


def excerpt(row: Any) -> str:
    """The row as served for a person to recognise it: its canonical JSON, cut at EXCERPT_MAX
    characters ("..." at the end when cut)."""
    text = _canonical(row)
    return text if len(text) <= EXCERPT_MAX else text[:EXCERPT_MAX - 3] + "..."


@dataclass(frozen=True)
class Ref:
    """A reference to another source record: the column it fills and where the ledger keeps it.

    `ref` names the record's ledger kind (`"companies"`) or a provider's word for it (Pipedrive's
    `"org"`); `lookup`: the ledger kinds the record may be kept under, first the current one
    (empty: `ref` itself); `noun`: the record's name in a skip's reason (empty: `ref`). `column`
    is a column of the target table, or `<jsonb column>.<key>` for a reference inside a JSON
    object of the row (a custom field: its entry gets `record_id`). `path`, when given, says where
    instead: the object at values[path[0]][path[1]]... (an int indexes a list) gets the local id
    under `into` (a mail party: `("recipients", "to", 1)`, `into="contact_id"`). `source_field` is
    the source row's field holding the id (`org_id`). All plain data: the engine never calls back
    to resolve it."""

    column: str
    ref: str
    source_id: str
    source_field: str = field(default="", compare=False)
    lookup: tuple[str, ...] = field(default=(), compare=False)
    noun: str = field(default="", compare=False)
    path: tuple[str | int, ...] = field(default=(), compare=False)
    into: str = field(default="record_id", compare=False)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The ledger kinds the referenced record may be written under, first the current one."""
        return self.lookup or (self.ref,)

    @property
    def parent_kind(self) -> str:
        """The ledger kind of the record this points at (the first of `kinds`)."""
        return self.kinds[0]

    def describe(self) -> str:
        """Why a row is not linked, in words (`"companies 42 is not here"`); "" says nothing more
        than the skip's reason itself."""
        return f"{self.noun or self.ref} {self.source_id} is not here"

    def dangling(self) -> dict[str, str]:
        """What the product row and the ledger keep of a reference whose parent does not exist at
        the source: `{"field": "org_id", "parent_kind": "organizations", "parent_id": "42"}`."""
        return {"field": self.source_field or self.column, "parent_kind": self.parent_kind, "parent_id": self.source_id}


@dataclass
class Mapped:
    """One source row in the engine's shape (see the module's docstring)."""

    table: str
    source_id: str
    values: dict[str, Any]
    parents: list[Ref] = field(default_factory=list)  # all must resolve, or the row is skipped
    links: list[Ref] = field(default_factory=list)  # filled when found, empty when not
    match_emails: list[str] = field(default_factory=list)
    # the source version the ledger records, e.g. the row's update time as served
    version: str | None = None

    def refs(self) -> list[Ref]:
        """Every reference of the row: parents first, then soft links."""
        return self.parents + self.links


def apply_links(mapped: Mapped, found: Mapping[Ref, int | None]) -> dict[str, Any]:
    """The row's column values with resolved references filled in: a plain column gets the local
    record id (None when not found), `<column>.<key>` sets `record_id` on the key's entry of the
    JSON object in `<column>`, a reference with a `path` sets `into` on the object it leads to
    (an entry or index absent from the row is left absent). The row's own values are not changed:
    every container on the way is copied."""
    values = dict(mapped.values)
    for ref in mapped.refs():
        record_id = found.get(ref)
        if ref.path:
            _set_at(values, ref.path, ref.into, record_id)
        elif "." in ref.column:
            column, key = ref.column.split(".", 1)
            _set_at(values, (column, key), "record_id", record_id)
        else:
            values[ref.column] = record_id
    return values


def _set_at(values: dict[str, Any], path: tuple[str | int, ...], into: str, value: Any) -> None:
    """Set `into` on the object at `path` in `values`, copying each container on the way; nothing
    when a step is absent."""
    chain: list[Any] = [values]
    for step in path:
        here = chain[-1]
        if isinstance(here, dict) and step in here and here[step] is not None:
            chain.append(here[step])
        elif isinstance(here, list) and isinstance(step, int) and 0 <= step < len(here):
            chain.append(here[step])
        else:
            return
    if not isinstance(chain[-1], dict):
        return
    inner: Any = {**chain[-1], into: value}
    for parent, step in zip(reversed(chain[:-1]), reversed(path)):
        copy: Any = dict(parent) if isinstance(parent, dict) else list(parent)
        copy[step] = inner
        inner = copy
    values.update(inner)
