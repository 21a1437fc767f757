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

The rules on values that both a provider's mappers and the engine's writers follow live here too,
pure (no I/O), so that neither side imports the other's tables: source versions (`content_version`,
`newer`, `same_version`), long text cut for the product (`fit_text`, `fit_email_body` and their
limits) and the keys the product matches rows by (`normal_email`, `normal_domain`).
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from engine_core.errors import EngineError


# A row's outcome, as a write reports it and the task's stats count it.
IMPORTED = "imported"
MATCHED = "matched"
ALREADY_HERE = "already_here"
UPDATED = "updated"
SKIPPED = "skipped"
FAILED = "failed"
# A row a walk before the catch-up left as a placeholder for the catch-up's walk to settle (a
# parent not known yet, not asked of the source): neither skipped nor written yet; the catch-up's
# own outcome for the row (its "<counter>@<kind>" stats) says what became of it.
WAITING = "waiting"

# The reason of such a placeholder (with the missing parent), and the one it gets when its own row
# is deleted at the source before the catch-up's walk took it over (`ledger.mark_deleted`).
WAITS_FOR_WALK = "waits for the catch-up's walk"
# A task stat "left_to_catchup:<parent kind>": records of the parent kind (waiting for the catch-up's
# walk) whose rows of the task's kind the task did not list, because the catch-up lists them once it
# has written the record. Those rows were never seen: no outcome, no ledger row (`rollup.KindRollup.left`).
LEFT_TO_CATCHUP = "left_to_catchup"
GONE_BEFORE_WALK = "deleted at the source before the catch-up's walk took it over"
# A catch-up's per-kind counts of the rows it wrote that the run held as placeholders before
# ("<counter>@<kind>" task stats, `models.Stats.heard`): by what they were held as ("again_waiting":
# a row a walk left waiting, "again_skipped", "again_failed"), and of the waiting ones, those it
# skipped (`SKIPPED_WAITING`). The rollup takes them off to count each row once.
AGAIN = {WAITING: "again_waiting", "skipped": "again_skipped", "failed": "again_failed"}
SKIPPED_WAITING = "skipped_waiting"


def left_to_catchup(parent: str) -> str:
    """The task stat counting the records of kind `parent` whose child rows were left to the
    catch-up (`LEFT_TO_CATCHUP`): "left_to_catchup:deals"."""
    return f"{LEFT_TO_CATCHUP}:{parent}"


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

    def __init__(self, column: str, ref: str, source_id: str, source_field: str = "", lookup: tuple[str, ...] = (),
                 noun: str = "", path: tuple[str | int, ...] = (), into: str = "record_id") -> None:
        # the dataclass's own __init__ for a frozen class sets each field through
        # object.__setattr__: a row's references were a tenth of its mapping (py-spy, entity path)
        self.__dict__.update(column=column, ref=ref, source_id=source_id, source_field=source_field, lookup=lookup,
                             noun=noun, path=path, into=into)

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

    def owed(self) -> dict[str, Any]:
        """What the product row and the ledger keep of a soft link whose parent's kind the run does
        not take (`owed_links`): `dangling()` with `"owed": true` and `"path"`, where the local id
        goes once that kind is written - `["owner_id"]` for a column, `["custom_fields", "k",
        "record_id"]` inside a JSON column - so a later run fills it from the ledger alone."""
        if self.path:
            where: list[str | int] = [*self.path, self.into]
        else:
            where = [*self.column.split(".", 1), "record_id"] if "." in self.column else [self.column]
        # `dangling()`'s keys, in its order, built in one dict (a run not taking users owes a few a row)
        return {"field": self.source_field or self.column, "parent_kind": (self.lookup or (self.ref,))[0],
                "parent_id": self.source_id, "owed": True, "path": where}


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


def owed_links(mapped: Mapped, record_ids: Sequence[int | None], taken: Collection[str]) -> list[dict[str, Any]]:
    """The row's soft links left empty because their parent's kind is one the run does not take
    (none of the ledger kinds it may be written under is in `taken`: the run's kinds), as
    `Ref.owed` keeps them; `record_ids`: the local ids of `mapped.refs()` in order (None: not
    found). A link the run could have filled and did not find stays empty and unrecorded."""
    kinds = taken if isinstance(taken, (set, frozenset)) else frozenset(taken)
    return [ref.owed() for ref, record_id in zip(mapped.links, record_ids[len(mapped.parents):])
            if record_id is None and kinds.isdisjoint(ref.kinds)]


def apply_links(mapped: Mapped, found: Mapping[Ref, int | None]) -> dict[str, Any]:
    """The row's column values with resolved references filled in: a plain column gets the local
    record id (None when not found), `<column>.<key>` sets `record_id` on the key's entry of the
    JSON object in `<column>`, a reference with a `path` sets `into` on the object it leads to
    (an entry or index absent from the row is left absent). The row's own values are not changed:
    every container on the way is copied."""
    return link_values(mapped, [found.get(ref) for ref in mapped.refs()])


def link_values(mapped: Mapped, record_ids: Sequence[int | None]) -> dict[str, Any]:
    """`apply_links` given the local record ids of `mapped.refs()` in their order (None: not
    found). A `<column>.<key>` reference copies its column's object once per row, not the row
    once per reference (a row's custom links made a tenth of a window's Python time)."""
    values = dict(mapped.values)
    copied: set[str] = set()
    for ref, record_id in zip(mapped.refs(), record_ids):
        if ref.path:
            _set_at(values, ref.path, ref.into, record_id)  # (a container it changes is a fresh copy)
        elif "." in ref.column:
            column, key = ref.column.split(".", 1)
            here = values.get(column)
            if isinstance(here, dict) and isinstance(here.get(key), dict):
                if column not in copied:
                    here = values[column] = dict(here)
                    copied.add(column)
                here[key] = {**here[key], "record_id": record_id}
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


# --- versions --------------------------------------------------------------------------------


def content_version(row: Any) -> str:
    """The version of a row without an update time: "sha256:" + the hex digest of its canonical
    JSON (sorted keys, no spaces; values JSON cannot hold are written with `str`)."""
    text = json.dumps(row, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _moment(version: str) -> datetime | None:
    """A version that is a time (RFC 3339 with or without milliseconds, or `YYYY-MM-DD HH:MM:SS`,
    UTC when it carries no offset), else None."""
    if not version or version.startswith("sha256:"):
        return None
    raw = version.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(raw.replace(" ", "T", 1))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def newer(version: str | None, written: str | None) -> bool:
    """Whether a sighting's `version` supersedes the `written` one. None (the writer knows no
    version) never does; a written None (an entry from before versions) always is superseded; two
    times compare as times (the same instant in v1 and v2 formats is one version; an older one is
    a stale sighting); anything else (content hashes) supersedes when it differs."""
    if version is None:
        return False
    if written is None:
        return True
    a, b = _moment(version), _moment(written)
    if a is not None and b is not None:
        return a > b
    return version != written


def same_version(a: str | None, b: str | None) -> bool:
    """Whether two versions are the same: equal texts, or two times of the same instant (a v1
    `YYYY-MM-DD HH:MM:SS` and a v2 RFC 3339 text, with or without milliseconds). None is only
    the same as None. For comparing the ledger with a listing's versions (verify, catch-up)."""
    if a is None or b is None:
        return a is b
    if a == b:
        return True
    x, y = _moment(a), _moment(b)
    return x is not None and x == y


# --- mail bodies -----------------------------------------------------------------------------

# The longest mail body stored, in characters. Postgres holds a text value up to 1 GB, so the cap
# is the product's, not the database's: the product shows a body in one view, and a body past a
# million characters is an inline base64 image or an attachment pasted as text (a 1,200,000-
# character HTML body with an inline image is the real case), not anything a reader scrolls.
# One million characters is at most ~4 MB of UTF-8 (TOAST-compressed on disk), and it equals the
# mapping's `TEXT_MAX`, which must stay at least this (with_body rejects longer bodies).
# A longer body is cut here, never dropped: the row says `body_truncated` and keeps the
# source's length in `body_original_length`.
EMAIL_BODY_MAX = 1_000_000


@dataclass(frozen=True)
class FittedBody:
    """A mail body as stored: the text, whether it was cut, and the source's length if it was."""

    body: str | None
    truncated: bool = False
    original_length: int | None = None  # characters, only when truncated

    def columns(self) -> dict[str, Any]:
        """The body's columns of crm.emails: body, body_truncated, body_original_length."""
        return {"body": self.body, "body_truncated": self.truncated, "body_original_length": self.original_length}


def fit_email_body(body: str | None, limit: int = EMAIL_BODY_MAX) -> FittedBody:
    """A (sanitised) mail body cut to `limit` characters (`EMAIL_BODY_MAX`) when it is longer.

    The cut never ends inside an HTML tag (it backs up to the tag's `<` when the last tag opened
    in the kept text has no `>` after it; a bare "a < b" is text, not a tag), so the stored prefix
    still renders - a body made huge by an inline base64 image keeps the text before the image; `original_length` keeps the
    source's length in characters. Raises ValueError for a limit below 1.
    """
    return fit_text(body, limit)


# The longest note content stored, in characters. Pipedrive allowed notes of about 3,000,000
# characters for years (today's spec says 100,000), HTML with inline base64 images among them, so
# a note is kept whole far beyond that; the cap is what Postgres always holds: a text value takes
# up to 1 GB, and 100,000,000 characters are at most 400 MB of UTF-8. A longer note is cut here,
# never dropped: the row says `content_truncated` with the source's `content_original_length`.
NOTE_CONTENT_MAX = 100_000_000


def fit_text(text: str | None, limit: int) -> FittedBody:
    """A long HTML or plain text cut to `limit` characters when it is longer, never inside a tag
    (the rule of `fit_email_body`, which is this for mail bodies). Raises ValueError for a limit
    below 1."""
    body = text
    if limit < 1:
        raise ValueError(f"the body limit must be at least 1 character, got {limit}")
    if body is None or len(body) <= limit:
        return FittedBody(body)
    kept = body[:limit]
    open_tag = kept.rfind("<")
    tag_start = kept[open_tag + 1 : open_tag + 2]
    if open_tag > 0 and (tag_start.isalpha() or tag_start in ("/", "!")) and kept.find(">", open_tag) < 0:
        kept = kept[:open_tag]  # a tag cut open (often the inline image itself) cannot render
    return FittedBody(kept, truncated=True, original_length=len(body))


# --- already here ----------------------------------------------------------------------------


def normal_email(value: object) -> str | None:
    """An email address as the product matches it: trimmed and lower-cased; None for a value that
    is not text or not an address (no @, or a space in it)."""
    if not isinstance(value, str):
        return None
    text = value.strip().lower()
    return text if "@" in text and " " not in text else None


def normal_domain(value: object) -> str | None:
    """`https://www.Acme.example/about` -> `acme.example`."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip().lower()
    if "@" in text:
        text = text.rsplit("@", 1)[1]
    for prefix in ("https://", "http://"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    text = text.split("/", 1)[0].split(":", 1)[0]
    if text.startswith("www."):
        text = text[4:]
    return text if "." in text and " " not in text else None
