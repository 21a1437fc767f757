"""One source row's story from the ledger, for `migrate explain`: its entry (what happened to it,
which run, the product row it points at) and what later runs did to that row since (migration
0010's history: a sync that updated it in place, found it deleted at the source, or saw it again),
or, for a row served without a readable id, the record kept under its raw key (migration 0013).

The entry's own `migration_id` stays the run that claimed the row, so the claim is told first and
the history after it: the history rows name the run of each change, so no column of the entry need
record the last writer."""
from __future__ import annotations

from typing import Any

from engine_core import ledger_reads
from engine_core.db import Database


def explain(db: Database, tenant_id: str, kind: str, source_id: str, source: str | None = None) -> dict[str, Any] | None:
    """What happened to one source row, from the ledger: {tenant_id, source, kind, source_id,
    action, reason, record_type, record_id, run_id, run_mode, run_status, at, source_version,
    deleted_at_source, unreadable, history, last_run_id, deleted_by_run}, or None when nothing is
    recorded. `run_id` is the run that claimed (or last tried) the row; `history` what later runs did
    to it, oldest first ({run_id, run_mode, action: "updated" | "deleted" | "restored", at,
    version_before, version_after, changed: the product columns an update changed}); `last_run_id`
    the run of the latest of them all; `deleted_by_run` the run that found the row gone from the
    source, while it is (None otherwise). A row without a readable id
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
        "run_mode": row.get("run_mode"),
        "run_status": row["run_status"],
        "at": row["created_at"].isoformat(),
        # the source version written, and when the row was found gone from the source
        "source_version": row.get("source_version"),
        "deleted_at_source": row["deleted_at_source"].isoformat() if row.get("deleted_at_source") else None,
        "unreadable": False,
        **since_claimed(db, row),
    }


def since_claimed(db: Database, entry: dict[str, Any]) -> dict[str, Any]:
    """What later runs did to a ledger entry's row (`explain`'s `history`, `last_run_id`,
    `deleted_by_run`), from its history rows."""
    history = [{"run_id": h["run_id"], "run_mode": h["run_mode"], "action": h["action"], "at": h["at"].isoformat(),
                "version_before": h["version_before"], "version_after": h["version_after"],
                "changed": sorted(k for k in (h["before"] or {}) if k != "source_updated_at")}
               for h in ledger_reads.row_history(db, int(entry["id"]))]
    deleted = [h for h in history if h["action"] == "deleted"]
    return {"history": history,
            "last_run_id": history[-1]["run_id"] if history else entry["migration_id"],
            "deleted_by_run": deleted[-1]["run_id"] if deleted and entry.get("deleted_at_source") else None}


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
        "run_mode": None,
        "run_status": row["run_status"],
        "at": row["created_at"].isoformat(),
        "source_version": None,
        "deleted_at_source": None,
        "unreadable": True,
        "history": [],
        "last_run_id": row["migration_id"],
        "deleted_by_run": None,
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
