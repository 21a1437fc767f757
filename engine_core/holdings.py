"""What the engine holds, as a source may read it: which of its records are written, which product
rows hang under them.

A provider plans its work from these (a fan-out lists the records the run wrote; a recheck marks
the rows a record's list no longer serves) and never reads the ledger's or the product's tables
itself. Reads only, each one query or a few, in the caller's connection or transaction.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from psycopg import sql

from engine_core import ledger
from engine_core.db import Conn, Database
from engine_core.models import Run
from engine_core.target import crm

Pair = tuple[str, str]  # (ledger kind, source id)


def resolve(conn: Conn | Database, run: Run, refs: Iterable[tuple[str, object]]) -> dict[Pair, int]:
    """(ledger kind, source id) pairs -> the local record ids written for them (`ledger.resolve`),
    one query."""
    return ledger.resolve(conn, run, refs)  # type: ignore[arg-type]


def written_ids(conn: Conn | Database, run: Run, kind: str) -> list[int]:
    """The integer source ids of ledger `kind` the tenant holds written and not deleted at the
    source (a dry run: the ones this run would have written), ascending."""
    if run.dry_run:
        rows = conn.sql("SELECT DISTINCT source_id FROM migration_dry_records WHERE migration_id = %(r)s"
                        " AND kind = %(k)s AND source_id ~ '^[0-9]{1,18}$'", {"r": run.id, "k": kind})
    else:
        rows = conn.sql("SELECT source_id FROM migration_records WHERE tenant_id = %(t)s AND source = %(s)s"
                        " AND kind = %(k)s AND action IN ('created', 'matched') AND deleted_at_source IS NULL"
                        " AND source_id ~ '^[0-9]{1,18}$'", {"t": run.tenant_id, "s": run.source, "k": kind})
    return sorted(int(r["source_id"]) for r in rows)


_WRITTEN_AFTER = """
SELECT source_id::bigint AS id FROM (
    SELECT source_id FROM migration_records
     WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND action IN ('created', 'matched')
       AND deleted_at_source IS NULL
    UNION
    SELECT source_id FROM migration_dry_records WHERE migration_id = %(r)s AND kind = %(k)s
) x
 WHERE source_id ~ '^[1-9][0-9]{0,17}$' AND source_id::bigint > %(after)s
 ORDER BY 1 LIMIT %(n)s
"""


def written_after(conn: Conn | Database, run: Run, kind: str, after: int, n: int) -> list[int]:
    """Up to `n` integer source ids of ledger `kind` above `after`, ascending: written and live
    for the tenant, or this run's would-be writes (a dry run's records)."""
    rows = conn.sql(_WRITTEN_AFTER, {"t": run.tenant_id, "s": run.source, "k": kind, "r": run.id, "after": after, "n": n})
    return [int(r["id"]) for r in rows]


def rows_under(conn: Conn | Database, run: Run, table: str, column: str, kinds: Sequence[str],
               records: Sequence[object]) -> dict[str, list[str]]:
    """Record source id -> the source ids of the live rows (not marked deleted at the source) of the
    product's `crm.<table>` whose `column` points at that record; a record is looked up in the
    ledger under any of `kinds` (its current kind first). Records not written are absent."""
    ids = [str(r) for r in records]
    found = ledger.resolve(conn, run, [(k, sid) for sid in ids for k in kinds])  # type: ignore[arg-type]
    local = {found[(k, sid)]: sid for sid in ids for k in kinds if (k, sid) in found}
    if not local:
        return {}
    q = sql.SQL("SELECT {c} AS record, source_id FROM {t} WHERE tenant_id = %(t)s AND source = %(s)s"
                " AND {c} = ANY(%(ids)s) AND deleted_at_source IS NULL").format(
        c=sql.Identifier(column), t=sql.Identifier("crm", table))
    out: dict[str, list[str]] = {}
    for r in conn.sql(q, {"t": run.tenant_id, "s": run.source, "ids": sorted(local)}):
        out.setdefault(local[r["record"]], []).append(r["source_id"])
    return out


def held_under(conn: Conn | Database, run: Run, kind: str, table: str, column: str, parent_table: str,
               parents: Sequence[object]) -> dict[str, str]:
    """The live rows of ledger `kind` (written, not deleted at the source) whose product row in
    `crm.<table>` points through `column` at a row of `crm.<parent_table>` with one of these
    source ids: row source id -> its parent's source id."""
    q = sql.SQL(
        "SELECT r.source_id, d.source_id AS parent FROM migration_records r"
        " JOIN {t} l ON l.id = r.record_id JOIN {p} d ON d.id = l.{c}"
        " WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = %(k)s AND r.record_type = %(rt)s"
        " AND r.action IN ('created', 'matched') AND r.deleted_at_source IS NULL AND d.source_id = ANY(%(d)s::text[])"
    ).format(t=sql.Identifier("crm", table), p=sql.Identifier("crm", parent_table), c=sql.Identifier(column))
    rows = conn.sql(q, {"t": run.tenant_id, "s": run.source, "k": kind, "rt": f"crm.{table}",
                        "d": [str(d) for d in parents]})
    return {r["source_id"]: r["parent"] for r in rows}


def mail_on_deal(conn: Conn | Database, tenant_id: str, source: str, deal_source_id: str) -> list[str]:
    """The source ids of the mail the product holds on one deal (`crm.mail_on_deal`): what verify
    calls unreachable rather than missing when the source refuses that deal's mail."""
    return crm.mail_on_deal(conn, tenant_id, source, deal_source_id)  # type: ignore[arg-type]


def parents_of_rows_under(conn: Conn | Database, run: Run, table: str, column: str, kinds: Sequence[str],
                          records: Sequence[object], parent_column: str, parent_table: str) -> list[str]:
    """The source ids (ascending, distinct) of the `crm.<parent_table>` rows that the live rows of
    `crm.<table>` (not marked deleted at the source) point at through `parent_column`, for those of
    them whose `column` points at one of `records` (looked up under `kinds`, as `rows_under`): e.g.
    the deals whose participants name these persons."""
    ids = [str(r) for r in records]
    found = ledger.resolve(conn, run, [(k, sid) for sid in ids for k in kinds])  # type: ignore[arg-type]
    if not found:
        return []
    q = sql.SQL("SELECT DISTINCT p.source_id FROM {t} r JOIN {pt} p ON p.id = r.{pc}"
                " WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.{c} = ANY(%(ids)s)"
                " AND r.deleted_at_source IS NULL").format(
        t=sql.Identifier("crm", table), pt=sql.Identifier("crm", parent_table), pc=sql.Identifier(parent_column),
        c=sql.Identifier(column))
    rows = conn.sql(q, {"t": run.tenant_id, "s": run.source, "ids": sorted(set(found.values()))})
    return sorted({str(r["source_id"]) for r in rows}, key=lambda s: (len(s), s))
