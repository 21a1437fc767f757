"""One source row's story from the ledger, for `migrate explain`: its entry (what happened to it,
which run, the product row it points at) or, for a row served without a readable id, the record
kept under its raw key (migration 0013)."""
from __future__ import annotations

from typing import Any

from engine_core import ledger_reads
from engine_core.db import Database


def explain(db: Database, tenant_id: str, kind: str, source_id: str, source: str | None = None) -> dict[str, Any] | None:
    """What happened to one source row, from the ledger: {tenant_id, source, kind, source_id,
    action, reason, record_type, record_id, run_id, run_status, at, source_version,
    deleted_at_source, unreadable}, or None when nothing is recorded. A row without a readable id
    is found by its raw key (`rows.unreadable_key`: whole, or the id as served alone), as failed,
    with `unreadable` true, `excerpt` (the row as served, cut) and `matches` (rows served with
    that id: the latest is told)."""
    row = ledger_reads.explain(db, tenant_id, kind, str(source_id), source)
    if row is None:
        return _explain_unreadable(db, tenant_id, kind, str(source_id), source)
    return {
        "tenant_id": row["tenant_id"],
        "source": row["source"],
        "kind": row["kind"],
        "source_id": row["source_id"],
        "action": row["action"],
        "reason": row["reason"],
        "record_type": row["record_type"],
        "record_id": row["record_id"],
        "run_id": row["migration_id"],
        "run_status": row["run_status"],
        "at": row["created_at"].isoformat(),
        # the source version written, and when the row was found gone from the source
        "source_version": row.get("source_version"),
        "deleted_at_source": row["deleted_at_source"].isoformat() if row.get("deleted_at_source") else None,
        "unreadable": False,
    }


def _explain_unreadable(db: Database, tenant_id: str, kind: str, raw_key: str, source: str | None) -> dict[str, Any] | None:
    rows = ledger_reads.explain_unreadable(db, tenant_id, kind, raw_key, source)
    if not rows:
        return None
    row = rows[0]
    also = f"; {len(rows) - 1} other row(s) were served with this id" if len(rows) > 1 else ""
    return {
        "tenant_id": row["tenant_id"],
        "source": row["source"],
        "kind": row["kind"],
        "source_id": row["raw_key"],
        "action": "failed",
        "reason": f"{row['reason']}; the row has no readable id: it is kept under its id as served and its digest, "
                  f"not in the ledger{also}",
        "record_type": None,
        "record_id": None,
        "run_id": row["migration_id"],
        "run_status": row["run_status"],
        "at": row["created_at"].isoformat(),
        "source_version": None,
        "deleted_at_source": None,
        "unreadable": True,
        "excerpt": row["excerpt"],
        "matches": len(rows),
    }


def unreadable_count(db: Database, tenant_id: str, kind: str, source: str | None = None) -> dict[str, Any] | None:
    """Rows of `kind` the tenant's runs met without a readable id (migration 0013): {"rows", "run_id"
    (the latest run that met one), "deals" (of them, under `emails`: deals served without a readable
    id whose mail no run can list)}, or None when there are none. `migrate explain` says so beside
    "not in the ledger": the row asked for may be one of them, served without its id."""
    rows = db.sql(
        "SELECT count(*) AS n, max(migration_id) AS run_id, count(*) FILTER (WHERE raw_key LIKE 'deal %%') AS deals"
        " FROM migration_unreadable"
        " WHERE tenant_id = %(t)s AND kind IN (%(k)s, %(k)s || '_archived') AND (%(s)s::text IS NULL OR source = %(s)s)",
        {"t": tenant_id, "k": kind, "s": source})
    if not rows or not rows[0]["n"]:
        return None
    return {"rows": int(rows[0]["n"]), "run_id": rows[0]["run_id"], "deals": int(rows[0]["deals"])}
