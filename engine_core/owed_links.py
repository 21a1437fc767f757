"""Soft links owed to a kind a run left out, filled from the ledger once a run writes that kind.

A run that does not take a kind (`migrate run --kinds -users`) imports the rows that link to it -
a contact's owner, a deal's pipeline - with the link empty, and records each such link as owed
(`rows.Ref.owed`) on the row's ledger entry (`dangling`, with a reason `migrate explain` shows) and
on its product row (`dangling_refs`, where the table has one). When a later run that takes the kind
ends (the barrier finalising it: a full run, a run of that kind alone, a sync), `fill` looks the
owed parents up in the ledger by their source ids and writes their local ids into the rows - no
request to the source - and takes the filled links off the entry and the row. A parent the
finished run did not write (deleted at the source since) leaves its link empty and no longer
owed, as a full run leaves a link to a record it did not find; a run that failed keeps those owed.
A matched row (the product's own contact) is not written, as a run does not write over it.
A run also owes itself the soft links to the kinds it takes whose rows it writes after the rows
naming them (`pending_links`: a later phase's or page's, one left to the catch-up's walk): its own
end fills them the same way, so a succeeded run leaves none owed.
Tenants that take every kind owe nothing: one indexed query per finished run (migrations 0020, 0021).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg.types.json import Jsonb

from engine_core import ledger
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.target.tables import TABLES
from engine_core.write import dangling_reason

_BY_RECORD_TYPE = {t.record_type: t for t in TABLES.values()}


BATCH = 5_000  # owed entries read, looked up and written per round of `fill`
Filled = dict[str, dict[str, int]]  # parent kind -> {the link's column ("owner_id", "custom_fields"): links filled}


def fill(tx: Conn, run: Run, *, settled: bool) -> Filled:
    """Fill the links the tenant's rows owe to `run`'s kinds from the ledger (module docstring);
    `settled`: the run succeeded, so an owed parent it did not write is no longer owed. Returns
    the links filled by parent kind and column ({"users": {"owner_id": 12}}; `filled_lines` says
    them); {} for a dry run or nothing owed."""
    filled: Filled = {}
    if run.dry_run:
        return filled
    after = 0
    while True:  # BATCH entries at a time, in id order: a tenant owing millions is not held in memory
        entries = tx.fetch_all("owed_links", {"tenant_id": run.tenant_id, "source": run.source, "after": after,
                                              "limit": BATCH, "kinds": ledger.array(sorted(set(run.kinds)))})
        if entries:
            _fill_batch(tx, run, entries, settled, filled)
        if len(entries) < BATCH:
            return filled
        after = entries[-1]["id"]


def _fill_batch(tx: Conn, run: Run, entries: list[dict[str, Any]], settled: bool, filled: Filled) -> None:
    """`fill` for one batch of owed entries; the links filled added to `filled`."""
    owed = [(e, r) for e in entries for r in e["dangling"] if r.get("owed") and r["parent_kind"] in run.kinds]
    found, _ = ledger.references(tx, run, [(r["parent_kind"], r["parent_id"]) for _, r in owed])
    columns: dict[tuple[str, tuple[Any, ...]], list[dict[str, int]]] = {}
    settled_refs: dict[int, list[dict[str, Any]]] = {}
    for e, r in owed:
        record_id = found.get((r["parent_kind"], r["parent_id"]))
        if record_id is not None and e["action"] == "created":  # a matched row is the product's own: not written
            columns.setdefault((e["record_type"], tuple(r["path"])), []).append({"id": e["record_id"], "pid": record_id})
            by_column = filled.setdefault(r["parent_kind"], {})
            by_column[str(r["path"][0])] = by_column.get(str(r["path"][0]), 0) + 1
        if record_id is not None or settled:
            settled_refs.setdefault(e["id"], []).append(r)
    for (record_type, path), rows in columns.items():
        _set_links(tx, record_type, path, rows)
    rest = []
    for e in entries:
        if e["id"] in settled_refs:
            left = [r for r in e["dangling"] if r not in settled_refs[e["id"]]]
            rest.append((e, left))
    _keep(tx, rest)


def filled_lines(filled: Filled) -> dict[str, tuple[int, str]]:
    """Per parent kind, (links filled, a line saying so): "12 owed links filled from the ledger
    (owner_id -> users: 10, custom_fields -> users: 2)", the run's note of what `fill` did."""
    out = {}
    for kind, by_column in sorted(filled.items()):
        n = sum(by_column.values())
        said = ", ".join(f"{column} -> {kind}: {k}" for column, k in sorted(by_column.items(), key=lambda c: -c[1]))
        out[kind] = (n, f"{n} owed link{'' if n == 1 else 's'} filled from the ledger ({said})")
    return out


def _set_links(tx: Conn, record_type: str, path: Sequence[Any], rows: list[dict[str, int]]) -> None:
    """Write the parents' local ids into the rows' link column (or the JSON key at `path`)."""
    table = _BY_RECORD_TYPE[record_type]
    column = sql.Identifier(str(path[0]))
    value = (sql.SQL("u.pid") if len(path) == 1
             else sql.SQL("jsonb_set({c}, {p}::text[], to_jsonb(u.pid))").format(c=column, p=sql.Literal([str(s) for s in path[1:]])))
    tx.sql(sql.SQL("UPDATE {t} SET {c} = {v} FROM jsonb_to_recordset(%(rows)s) AS u(id bigint, pid bigint)"
                   " WHERE {t}.id = u.id").format(t=table.identifier, c=column, v=value), {"rows": Jsonb(rows)})


def _keep(tx: Conn, rest: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
    """The entries' and product rows' references that are still dangling or owed after a fill."""
    if not rest:
        return
    rows = [{"id": e["id"], **({"dangling": left, "reason": dangling_reason(left)} if left else {})} for e, left in rest]
    tx.execute("keep_owed", {"rows": Jsonb(rows)})
    by_table: dict[str, list[dict[str, Any]]] = {}
    for e, left in rest:
        by_table.setdefault(e["record_type"], []).append({"id": e["record_id"], **({"refs": left} if left else {})})
    for record_type, product in by_table.items():
        table = _BY_RECORD_TYPE[record_type]
        if "dangling_refs" in table.columns:
            tx.sql(sql.SQL("UPDATE {t} SET dangling_refs = u.refs FROM jsonb_to_recordset(%(rows)s)"
                           " AS u(id bigint, refs jsonb) WHERE {t}.id = u.id").format(t=table.identifier),
                   {"rows": Jsonb(product)})
