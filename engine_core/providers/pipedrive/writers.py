"""Writing a page of source rows: map every row, resolve the page's references in one ledger
query, then hand the rows to the engine's windows (25 rows a transaction, a savepoint a row).

A row whose parents are not all in the ledger is skipped as "not linked to any record": a
placeholder that a later run importing the parent takes over. Owners, the people on a mail,
custom fields that point at records and a deal's pipeline and stage are softer references: linked
when found, empty when not.

Parents deleted at the source (issue 8, item 5). Pipedrive keeps a child's `org_id` after the
organization was permanently deleted, and such a parent is never listed. The proof that a parent
does not exist is the source itself: for each missing parent the ledger knows nothing about
(no created, matched, skipped or failed entry) of a kind this run imports, the page asks the
source once - `GET /api/v2/organizations/{id}` and the like, through the provider's budgeted
client, before the page's windows open and holding no database connection - and remembers the
answer for the run (`SourceAnswers`). 404: the row is imported with that link empty, and the
dangling reference is kept on the product row (`dangling_refs`) and on its ledger entry
(`dangling`, counted per kind by `ledger.dangling_counts`), with a reason `migrate explain` shows
("imported; org_id 42 does not exist at the source (404)"). 200: the parent exists but is not
written (it failed, or its listing missed it), so the row stays a placeholder, saying so. A parent
that failed or was skipped, and a parent of a kind the run does not import, stay placeholders
without a request. Owners stay soft references.

One identity per source record (issue 8, item 6): the archived lists' tasks write ledger kind
`deals` / `leads` (`mapping.ledger_kind`), so a deal listed by `/api/v2/deals` and again, archived
since, by `/api/v2/deals/archived` is one ledger entry and one product row. Archiving moves a
record's update time, so its second sighting is a newer version: `updated` in place (below), with
`archived_updated` in the task's stats; a sighting whose version cannot be ordered against the
written one (equal times) is `already_here` and only brings the archived flag up
(`crm.refresh_archived`).

Changes (issue 9). Every row carries its source version (`Mapped.version`: `update_time` as
served, or a content hash); a written row seen again with a newer version is written over its
product row in place (`crm.update`, same record id, never a second row), outcome `updated`, the
previous values in the ledger's history (`ledger.write_once`). A matched row (the product's own
contact, company or user) is not overwritten unless the run option `overwrite_matched` is true.

In a dry run nothing is written (the engine rolls each row's savepoint back), so a parent that
this same run would have created earlier is not in the ledger; the engine remembers the dry run's
would-be writes (`ledger.dry_written`), and a parent found there counts as linked.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Protocol

from engine_core import ledger
from engine_core.context import PageResult, TaskContext
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.mapping import FieldBook, MalformedRow, Mapped, Ref, apply_links, ledger_kind
from engine_core.target import crm

NOT_LINKED = "not linked to any record"
DANGLING = "does not exist at the source (404)"
NOT_WRITTEN = "exists at the source but is not written"

Mapper = Callable[[Any], Mapped]
Event = Callable[[str], None]
Pair = tuple[str, str]  # (ledger kind, source id)

# How to ask the source whether a parent exists: one record by id, per parent ledger kind.
# Users (owners) are soft references and never asked about.
PARENT_PATHS: dict[str, str] = {
    "organizations": "/api/v2/organizations/{}",
    "persons": "/api/v2/persons/{}",
    "deals": "/api/v2/deals/{}",
    "leads": "/v1/leads/{}",
    "pipelines": "/api/v2/pipelines/{}",
    "stages": "/api/v2/stages/{}",
}


class Getter(Protocol):
    """What the parent probe needs of the provider's client (`PipedriveClient.get`)."""

    def get(self, path: str, params: Mapping[str, Any] | None = None, *, cancel: Any = None) -> dict[str, Any]: ...


class Prepared(dict):
    """A row ready for its window: a dict (the engine reads its `id`) carrying the mapping or the
    reason it cannot be mapped."""

    @classmethod
    def of(cls, row: Any, mapper: Mapper) -> Prepared:
        try:
            mapped = mapper(row)
        except MalformedRow as e:
            return cls(id=_raw_id(row), mapped=None, error=e)
        return cls(id=mapped.source_id, mapped=mapped, error=None)


def _raw_id(row: Any) -> str | None:
    # A malformed row is recorded under its id only when the id itself is sound.
    value = row.get("id") if isinstance(row, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
        return value.lower()
    return None


def ledger_refs(mapped: Iterable[Mapped | None]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for m in mapped:
        if m is None:
            continue
        for ref in m.refs():
            pairs.extend((kind, ref.source_id) for kind in ref.kinds)
    return pairs


def lookup(found: dict[tuple[str, str], int], ref: Ref) -> int | None:
    for kind in ref.kinds:
        record_id = found.get((kind, ref.source_id))
        if record_id is not None:
            return record_id
    return None


# --- parents deleted at the source -------------------------------------------------------------


class SourceAnswers:
    """What the source answered about parents, per run and in memory: `True` exists (200), `False`
    does not exist (404). Shared by the lane threads of a process; a few runs are kept."""

    RUNS_KEPT = 32

    def __init__(self) -> None:
        self._by_run: OrderedDict[tuple[str, int], dict[Pair, bool]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int], pairs: Iterable[Pair]) -> dict[Pair, bool]:
        with self._lock:
            known = self._by_run.get(key, {})
            return {p: known[p] for p in pairs if p in known}

    def put(self, key: tuple[str, int], pair: Pair, exists: bool) -> None:
        with self._lock:
            self._by_run.setdefault(key, {})[pair] = exists
            self._by_run.move_to_end(key)
            while len(self._by_run) > self.RUNS_KEPT:
                self._by_run.popitem(last=False)


ANSWERS = SourceAnswers()


def missing_parents(mapped: Iterable[Mapped | None], found: dict[Pair, int], dry: Collection[Pair] | None) -> set[Pair]:
    """Parents of these rows that are not written (nor, in a dry run, would-be written)."""
    out: set[Pair] = set()
    for m in mapped:
        if m is None:
            continue
        for ref in m.parents:
            if lookup(found, ref) is None and not (dry and any((k, ref.source_id) in dry for k in ref.kinds)):
                out.add((ref.parent_kind, ref.source_id))
    return out


def askable(run: Run, pairs: Iterable[Pair], known: Mapping[Pair, str]) -> list[Pair]:
    """Missing parents worth a request: unknown to the ledger, of a kind the run imports, and of a
    kind the source can be asked about by id."""
    imported = {ledger_kind(k) for k in run.kinds}
    return sorted(p for p in pairs if p not in known and p[0] in imported and p[0] in PARENT_PATHS)


def ask_source(client: Getter, pairs: Iterable[Pair], key: tuple[str, int], cancel: Any = None,
               answers: SourceAnswers = ANSWERS) -> dict[Pair, bool]:
    """Whether each parent exists at the source: one GET per pair not answered before in this run.
    404 -> False, a record -> True; any other failure (rate limit, server error after the client's
    retries) propagates and the page is retried like any failed fetch. Never call this holding a
    database connection or transaction."""
    pairs = list(pairs)
    out = answers.get(key, pairs)
    for pair in pairs:
        if pair in out:
            continue
        kind, sid = pair
        try:
            client.get(PARENT_PATHS[kind].format(sid), cancel=cancel)
        except NotFound:
            exists = False
        else:
            exists = True
        answers.put(key, pair, exists)
        out[pair] = exists
    return out


def _describe_missing(ref: Ref, exists: Mapping[Pair, bool]) -> str:
    if exists.get((ref.parent_kind, ref.source_id)) is True:
        return ref.describe().replace("is not here", NOT_WRITTEN)
    return ref.describe()


def write_mapped(
    tx: Conn, run: Run, kind: str, mapped: Mapped, found: dict[tuple[str, str], int],
    dry: set[tuple[str, str]] | None = None, *, exists: Mapping[Pair, bool] | None = None,
    on_event: Event | None = None, held: ledger.Held | None = None,
) -> str:
    """Link, then write once through the ledger: imported, matched, already_here or skipped.

    `exists`: what the source answered about missing parents (`ask_source`); a parent it answered
    404 for is dangling - the row is imported with that link empty and the reference recorded.
    `on_event` hears `dangling`, `archived_updated` and `update_skipped` (a written row's newer version
    whose parents are not here: outcome skipped, the product row keeps its version; a retry's revisit
    of the task tries it again) (stats of the task). `held`: the row's ledger
    entry as its page read it (`ledger.held`), so a row already here at this version costs no write.
    """
    exists = exists or {}
    resolved: dict[Ref, int | None] = {}
    missing: list[Ref] = []
    dangling: list[Ref] = []
    for ref in mapped.parents:
        resolved[ref] = lookup(found, ref)
        if resolved[ref] is None:
            if exists.get((ref.parent_kind, ref.source_id)) is False:
                dangling.append(ref)
            else:
                missing.append(ref)
    pending = False
    if missing:
        # a dry run: a parent this run would itself have written counts as linked
        would_exist = dry is not None and all(any((k, ref.source_id) in dry for k in ref.kinds) for ref in missing)
        if run.dry_run and would_exist:
            pending = True  # a dry run: this run would have created the parent first
        else:
            reason = f"{NOT_LINKED}: " + "; ".join(_describe_missing(ref, exists) for ref in missing)
            outcome = ledger.skip(tx, run, kind, mapped.source_id, reason)
            if outcome == ledger.ALREADY_HERE and held is not None and ledger.newer(mapped.version, held.version):
                # a newer version the product cannot take yet (its parent is not here): the row keeps
                # the version it has, and the sighting says skipped, not already here
                if on_event:
                    on_event("update_skipped")
                return ledger.SKIPPED
            return outcome
    for ref in mapped.links:
        resolved[ref] = lookup(found, ref)
    record_type = crm.TABLES[mapped.table].record_type
    if pending:
        return ledger.write_once(tx, run, kind, mapped.source_id, lambda: ledger.Written(record_type, None))
    values = apply_links(mapped, resolved)
    refs = [ref.dangling() for ref in dangling]
    reason = None
    if refs:
        values["dangling_refs"] = refs
        reason = "imported; " + "; ".join(f"{r['field']} {r['parent_id']} {DANGLING}" for r in refs)
    if mapped.table == "contacts":
        write = lambda: crm.write_contact(tx, values, mapped.match_emails)  # noqa: E731
    elif mapped.table == "companies":
        write = lambda: crm.write_company(tx, values)  # noqa: E731
    elif mapped.table == "users":
        write = lambda: crm.write_user(tx, values)  # noqa: E731
    else:
        write = lambda: crm.write(tx, mapped.table, values)  # noqa: E731
    archived_before: list[bool] = []

    def update(record_id: int) -> dict[str, Any] | None:
        # a newer version at the source: the same product row, every mapped column brought up to it
        # (its dangling references too: a parent the new version points at may exist now)
        changed = {**values, "dangling_refs": refs or None} if "dangling_refs" in crm.TABLES[mapped.table].columns else values
        before = crm.update(tx, mapped.table, record_id, changed)
        if before and "archived" in before:
            archived_before.append(True)
        return before

    outcome = ledger.write_once(tx, run, kind, mapped.source_id, write, dangling=refs, reason=reason,
                                version=mapped.version, update=update, on_event=on_event, held=held)
    if outcome == ledger.ALREADY_HERE:
        if mapped.table in crm.ARCHIVE_COLUMNS and not run.dry_run:
            # another list wrote this record at a version that cannot be ordered against this one:
            # its archived flag may have moved since
            record_id = ledger.record_of(tx, run, kind, mapped.source_id)
            if record_id is not None and crm.refresh_archived(tx, mapped.table, record_id, mapped.values):
                if on_event:
                    on_event("archived_updated")
    elif outcome == ledger.UPDATED:
        if archived_before and on_event:
            on_event("archived_updated")  # the update moved the archived flag (archived or restored)
    elif refs and on_event:
        on_event("dangling")
    return outcome


def write_page(
    ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, *, kind: str | None = None, client: Getter | None = None,
) -> PageResult:
    """Map a page, resolve its references in one query, write it in the engine's windows.

    `kind`: the ledger kind (default: the task kind's, `mapping.ledger_kind`). With a `client`, the
    page's parents that the ledger does not know are asked of the source first (`ask_source`)."""
    kind = kind or ledger_kind(ctx.task.kind)
    prepared = [Prepared.of(row, mapper) for row in rows]
    refs = ledger_refs(p["mapped"] for p in prepared)
    ask: list[Pair] = []
    with ctx.db.connection() as conn:
        found = ledger.resolve(conn, ctx.run, refs)
        dry = ledger.dry_written(conn, ctx.run, refs) if ctx.run.dry_run else None
        held = ledger.held(conn, ctx.run, kind, [p["id"] for p in prepared if p["mapped"] is not None])
        missing = missing_parents((p["mapped"] for p in prepared), found, dry)
        if missing and client is not None:
            ask = askable(ctx.run, missing, ledger.known(conn, ctx.run, missing))
    # the connection is back in the pool: the source is asked holding nothing of the database
    exists = ask_source(client, ask, (ctx.db.url, ctx.run.id), ctx.cancel) if ask and client is not None else {}

    def writer(tx: Conn, row: Prepared) -> str:
        if row["error"] is not None:
            raise row["error"]
        return write_mapped(tx, ctx.run, kind, row["mapped"], found, dry, exists=exists, on_event=ctx.stats.bump,
                            held=held.get(row["id"]))

    return ctx.write_rows(prepared, writer, kind=kind)


def write_listed_page(ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, client: Getter) -> PageResult:
    """A listing's page (`write_page`) whose missing parents are checked at the source through the
    provider's budgeted `client`: parents deleted there leave their rows imported, links empty."""
    return write_page(ctx, rows, mapper, client=client)


# --- field definitions -----------------------------------------------------------------------


def normal_definition(entity: str, item: dict[str, Any], position: int) -> dict[str, Any]:
    """A v2 (`field_code`, `field_name`) or v1 (`key`, `name`) field definition, normalised."""
    key = item.get("field_code") or item.get("key")
    name = item.get("field_name") or item.get("name")
    ftype = item.get("field_type")
    if not isinstance(key, str) or not key or not isinstance(name, str) or not isinstance(ftype, str):
        raise MalformedRow(f"{entity} field definition without key, name or type: {str(item)[:80]}")
    options = item.get("options")
    if options is not None and not isinstance(options, list):
        raise MalformedRow(f"{entity} field {key} has options that are not a list")
    is_custom = item.get("is_custom_field")
    if is_custom is None:  # v1: custom fields are the editable ones with a 40-hex key
        is_custom = bool(item.get("edit_flag")) and len(key) == 40
    return {
        "id": f"{entity}:{key}",
        "entity": entity,
        "field_key": key,
        "name": name,
        "field_type": ftype,
        "options": [{"id": o.get("id"), "label": o.get("label")} for o in options or [] if isinstance(o, dict)] or None,
        "subfields": item.get("subfields"),
        "is_custom": bool(is_custom),
        "position": int(item.get("order_nr", position)) if isinstance(item.get("order_nr", position), int) else position,
    }


DEFINITION_COLUMNS = ("entity", "field_key", "name", "field_type", "options", "subfields", "is_custom", "position")


def write_definitions(ctx: TaskContext, definitions: Sequence[dict[str, Any]]) -> PageResult:
    """Store the run's field definitions: refreshed in place every run, claimed once in the ledger.

    A definition's version is its content's hash (`ledger.content_version` of the normalised
    definition: definitions have no update time); a changed one counts `updated`, with the
    previous values in the ledger's history."""

    def writer(tx: Conn, d: dict[str, Any]) -> str:
        values = {k: d[k] for k in DEFINITION_COLUMNS}
        # The refresh happens outside the claim's savepoint: a field already here still gets
        # its current name and option labels. What it replaced is kept for the history.
        old = crm.field_definition(tx, ctx.run.tenant_id, ctx.run.source, d["entity"], d["field_key"])
        def_id = crm.upsert_field_definition(tx, {"tenant_id": ctx.run.tenant_id, "source": ctx.run.source, **values})
        before = {k: old[k] for k in DEFINITION_COLUMNS if old is not None and old[k] != values[k]}
        return ledger.write_once(tx, ctx.run, "fields", d["id"], lambda: ledger.Written("crm.custom_field_definitions", def_id),
                                 version=ledger.content_version(values), update=lambda _record_id: before,
                                 on_event=ctx.stats.bump)

    return ctx.write_rows(list(definitions), writer, kind="fields")


def book_from_db(conn: Conn, run: Run) -> FieldBook:
    return FieldBook(crm.field_definitions(conn, run.tenant_id, run.source))
