"""A tenant's rows not imported now, of some kinds: what `migrate rows T --kind K` lists, whichever run
left them so.

A phase's materialisation is built from the engine run that closed it, and a sync's run holds only
the rows the sync touched; the rows an earlier run skipped or failed (and no later run settled) are
the tenant's still. These reads give a phase's figures and rows as the ledger holds them now, for
the kinds of that phase, from the same queries `migrate rows` uses (`ledger_reads.tenant_rows`,
`ledger_reads.bad_row_counts`), so the two always agree.
"""
from __future__ import annotations

from typing import Any, Sequence

from engine_core.db import Database
from engine_core.ledger_reads import bad_row_counts, tenant_rows

# failed first (rows no later run brings by itself), then as `migrate rows` sorts a kind's actions
ORDER = {"failed": 0, "skipped": 1, "waiting": 2}


def counts_now(db: Database, tenant: str, kinds: Sequence[str]) -> dict[str, dict[str, int]]:
    """The tenant's skipped, waiting and failed rows of `kinds` now, per kind ({kind: {"skipped",
    "waiting", "failed"}}, failed counting the rows without a readable id; kinds with none left out)
    and in total under "" ({"": {...}} always present)."""
    per_kind = bad_row_counts(db, tenant, list(kinds))
    total = {name: sum(v[name] for v in per_kind.values()) for name in ("skipped", "waiting", "failed")}
    return {"": total, **per_kind}


def rows_now(db: Database, tenant: str, kinds: Sequence[str], limit: int) -> list[dict[str, Any]]:
    """Up to `limit` of the tenant's skipped, waiting and failed rows of `kinds` now: failed first,
    then skipped, then waiting, each by kind and id as `migrate rows` sorts them (one query a kind:
    its first `limit` in that order hold every row of it the whole first `limit` can hold). Each row as
    `ledger_reads.tenant_rows` yields it ({"kind", "source", "id", "action", "run_id" (the run that
    last wrote it), "reason", "deleted_at_source", "unreadable", "dry_run"}). A row kept without a
    readable id under an archived kind is listed once, though both its kind and the archived one
    are asked for."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for kind in kinds:
        listed = tenant_rows(db, tenant, kind, tuple(ORDER), None, limit)
        try:
            for row in listed:
                found.setdefault((row["kind"], row["source"], row["id"], row["unreadable"]), row)
        finally:
            listed.close()
    return sorted(found.values(), key=lambda r: (ORDER.get(r["action"], 3), r["kind"], len(str(r["id"])),
                                                 str(r["id"])))[:limit]
