"""Writing a page of source rows: map every row, resolve the page's references in one ledger
query, then hand the rows to the engine's windows (25 rows a transaction, a savepoint a row).

A row whose parents are not all in the ledger is skipped as "not linked to any record": a
placeholder that a later run importing the parent takes over. Owners, the people on a mail,
custom fields that point at records and a deal's pipeline and stage are softer references: linked
when found, empty when not.

In a dry run nothing is written (the engine rolls each row's savepoint back), so a parent that
this same run would have created earlier is not in the ledger; the engine remembers the dry run's
would-be writes (`ledger.dry_written`), and a parent found there counts as linked.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine_core import ledger
from engine_core.context import PageResult, TaskContext
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.providers.pipedrive.mapping import FieldBook, MalformedRow, Mapped, Ref, apply_links
from engine_core.target import crm

NOT_LINKED = "not linked to any record"

Mapper = Callable[[Any], Mapped]


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


def write_mapped(
    tx: Conn, run: Run, kind: str, mapped: Mapped, found: dict[tuple[str, str], int],
    dry: set[tuple[str, str]] | None = None,
) -> str:
    """Link, then write once through the ledger: imported, matched, already_here or skipped."""
    resolved: dict[Ref, int | None] = {}
    missing: list[Ref] = []
    for ref in mapped.parents:
        resolved[ref] = lookup(found, ref)
        if resolved[ref] is None:
            missing.append(ref)
    pending = False
    if missing:
        # a dry run: a parent this run would itself have written counts as linked
        would_exist = dry is not None and all(any((k, ref.source_id) in dry for k in ref.kinds) for ref in missing)
        if run.dry_run and would_exist:
            pending = True  # a dry run: this run would have created the parent first
        else:
            reason = f"{NOT_LINKED}: " + "; ".join(ref.describe() for ref in missing)
            return ledger.skip(tx, run, kind, mapped.source_id, reason)
    for ref in mapped.links:
        resolved[ref] = lookup(found, ref)
    record_type = crm.TABLES[mapped.table].record_type
    if pending:
        return ledger.write_once(tx, run, kind, mapped.source_id, lambda: ledger.Written(record_type, None))
    values = apply_links(mapped, resolved)
    if mapped.table == "contacts":
        write = lambda: crm.write_contact(tx, values, mapped.match_emails)  # noqa: E731
    elif mapped.table == "companies":
        write = lambda: crm.write_company(tx, values)  # noqa: E731
    elif mapped.table == "users":
        write = lambda: crm.write_user(tx, values)  # noqa: E731
    else:
        write = lambda: crm.write(tx, mapped.table, values)  # noqa: E731
    return ledger.write_once(tx, run, kind, mapped.source_id, write)


def write_page(ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, *, kind: str | None = None) -> PageResult:
    """Map a page, resolve its references in one query, write it in the engine's windows."""
    kind = kind or ctx.task.kind
    prepared = [Prepared.of(row, mapper) for row in rows]
    refs = ledger_refs(p["mapped"] for p in prepared)
    with ctx.db.connection() as conn:
        found = ledger.resolve(conn, ctx.run, refs)
        dry = ledger.dry_written(conn, ctx.run, refs) if ctx.run.dry_run else None

    def writer(tx: Conn, row: Prepared) -> str:
        if row["error"] is not None:
            raise row["error"]
        return write_mapped(tx, ctx.run, kind, row["mapped"], found, dry)

    return ctx.write_rows(prepared, writer, kind=kind)


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


def write_definitions(ctx: TaskContext, definitions: Sequence[dict[str, Any]]) -> PageResult:
    """Store the run's field definitions: refreshed in place every run, claimed once in the ledger."""

    def writer(tx: Conn, d: dict[str, Any]) -> str:
        values = {k: d[k] for k in ("entity", "field_key", "name", "field_type", "options", "subfields", "is_custom", "position")}
        # The refresh happens outside the claim's savepoint: a field already here still gets
        # its current name and option labels.
        def_id = crm.upsert_field_definition(tx, {"tenant_id": ctx.run.tenant_id, "source": ctx.run.source, **values})
        return ledger.write_once(tx, ctx.run, "fields", d["id"], lambda: ledger.Written("crm.custom_field_definitions", def_id))

    return ctx.write_rows(list(definitions), writer, kind="fields")


def book_from_db(conn: Conn, run: Run) -> FieldBook:
    return FieldBook(crm.field_definitions(conn, run.tenant_id, run.source))
