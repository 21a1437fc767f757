"""The ledger: every source row once per tenant, claimed in the same transaction as its write.

`write_once` runs the write first and the claim last, inside one savepoint: a write that raises
leaves no claim behind, and a claim that loses (the row is already here) rolls the write back.
Created and matched rows are exclusive; skipped and failed rows are placeholders that the next
successful write takes over.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from engine_core.db import Conn, Database
from engine_core.models import Run

IMPORTED = "imported"
MATCHED = "matched"
ALREADY_HERE = "already_here"
SKIPPED = "skipped"
FAILED = "failed"


@dataclass(frozen=True)
class Written:
    """What a writer made: the local record's type and id; `matched` when it linked an existing one."""

    record_type: str
    record_id: int | None
    matched: bool = False


def write_once(
    tx: Conn, run: Run, kind: str, source_id: object, write: Callable[[], Written],
    *, dangling: Sequence[Mapping[str, Any]] | None = None, reason: str | None = None,
) -> str:
    """Write a source row and claim it; returns imported, matched or already_here.

    `dangling`: the row's references to parents that do not exist at the source (issue 8, item 5),
    kept on the claim as a jsonb list; `reason` says so in words for `migrate explain`.
    """
    sid = str(source_id)
    with tx.raw.transaction() as sp:
        written = write()
        claimed = tx.fetch_one(
            "claim_record",
            {
                "run_id": run.id,
                "tenant_id": run.tenant_id,
                "source": run.source,
                "kind": kind,
                "source_id": sid,
                "record_type": written.record_type,
                "record_id": written.record_id,
                "action": "matched" if written.matched else "created",
                "reason": reason[:500] if reason else None,
                "dangling": Jsonb(list(dangling)) if dangling else None,
            },
        )
        if claimed is None:
            # someone else holds this row: undo our write, report it as already here
            raise psycopg.Rollback(sp)
        return MATCHED if written.matched else IMPORTED
    return ALREADY_HERE


def note_placeholder(tx: Conn, run: Run, kind: str, source_id: object, reason: str, action: str = "skipped") -> str:
    """Record a skipped (or failed) row without claiming it; a created row keeps its claim."""
    row = tx.fetch_one(
        "note_placeholder",
        {
            "run_id": run.id,
            "tenant_id": run.tenant_id,
            "source": run.source,
            "kind": kind,
            "source_id": str(source_id),
            "action": action,
            "reason": reason[:500],
        },
    )
    if row is None:
        return ALREADY_HERE
    return SKIPPED if action == "skipped" else FAILED


def skip(tx: Conn, run: Run, kind: str, source_id: object, reason: str) -> str:
    return note_placeholder(tx, run, kind, source_id, reason, action="skipped")


def resolve(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> dict[tuple[str, str], int]:
    """Source (kind, id) pairs -> local record ids, in one query for a whole page."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs:
        return {}
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all(
        "resolve_references",
        {"tenant_id": run.tenant_id, "source": run.source, "kinds": list(kinds), "source_ids": list(ids)},
    )
    return {(r["kind"], r["source_id"]): r["record_id"] for r in rows}


def claimed(conn: Conn, run: Run, kind: str, source_ids: Iterable[object]) -> set[str]:
    """Which of these source ids are already written (created or matched) for the tenant."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return set()
    rows = conn.fetch_all(
        "claimed_source_ids", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind, "source_ids": ids}
    )
    return {r["source_id"] for r in rows}


def claimed_by(conn: Conn, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, int]:
    """Which of these source ids are written, and by which run (this run's or an earlier one)."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all(
        "claimed_by_run", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind, "source_ids": ids}
    )
    return {r["source_id"]: r["migration_id"] for r in rows}


def dry_written(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> set[tuple[str, str]]:
    """In a dry run: which of these (kind, source id) pairs this run would have written already."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs or not run.dry_run:
        return set()
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all("dry_written", {"run_id": run.id, "kinds": list(kinds), "source_ids": list(ids)})
    return {(r["kind"], r["source_id"]) for r in rows}


def written_by_run(conn: Conn, run: Run, kind: str, source_ids: Iterable[object]) -> dict[str, str]:
    """Which of these source ids this very run has written already, and how (created or matched)."""
    ids = [str(s) for s in source_ids if s is not None]
    if not ids:
        return {}
    rows = conn.fetch_all("written_by_run", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                             "run_id": run.id, "source_ids": ids})
    return {r["source_id"]: r["action"] for r in rows}


def known(conn: Conn, run: Run, refs: Iterable[tuple[str, object]]) -> dict[tuple[str, str], str]:
    """Source (kind, id) pairs -> their ledger action (created, matched, skipped or failed), in one
    query: a pair missing from the answer is one the ledger knows nothing about."""
    pairs = {(k, str(s)) for k, s in refs if s is not None and s != ""}
    if not pairs:
        return {}
    kinds, ids = zip(*sorted(pairs))
    rows = conn.fetch_all(
        "known_references",
        {"tenant_id": run.tenant_id, "source": run.source, "kinds": list(kinds), "source_ids": list(ids)},
    )
    return {(r["kind"], r["source_id"]): r["action"] for r in rows}


def record_of(tx: Conn, run: Run, kind: str, source_id: object) -> int | None:
    """The local record a written (created or matched) source row points at, else None."""
    row = tx.fetch_one("written_record", {"tenant_id": run.tenant_id, "source": run.source, "kind": kind,
                                          "source_id": str(source_id)})
    return None if row is None else row["record_id"]


def dangling_counts(db: Database | Conn, run_id: int) -> dict[str, int]:
    """Per ledger kind: rows this run imported with at least one reference to a parent that does
    not exist at the source (issue 8, item 5) - `{"deals": 4, "persons": 6}`; kinds without any
    are absent. Reads the claims the run holds (a row another run wrote is that run's count)."""
    return {r["kind"]: int(r["n"]) for r in db.fetch_all("dangling_counts", {"run_id": run_id})}
