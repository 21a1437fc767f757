"""A downloaded file's content, written by the engine: the store, the product's file row, the ledger.

A source downloads a file's bytes into a spooled temporary file, hashed as they pass, holding no
database connection; then hands the outcome over as plain data (`settle`): the bytes with their
sha256 and size, or the file's status and why there are none. The engine keeps the bytes in the
file store (`engine_core.store`: content-addressed, one copy per distinct content a tenant has),
sets the product's crm.files `content_status` and `content_sha256`, and claims the file in the
ledger (version "sha256:<hex>": a later content is an update in place) or records it skipped with
the reason - in the caller's transaction, with the checkpoint. The store is the engine's choice
(`file_store`: MIGRATE_FILE_STORE), handed to the source only for its size limit.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

from engine_core import ledger
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.store import CHUNK_BYTES, FileStore
from engine_core.target.files import store_from_env


def file_store(env: Mapping[str, str] | None = None) -> FileStore:
    """The file store the environment asks for (`target.files.store_from_env`: MIGRATE_FILE_STORE,
    MIGRATE_FILE_MAX_BYTES; default the process's environment). Raises ConfigError naming the
    variable for a bad value."""
    return store_from_env(dict(env) if env is not None else None)


def pending_files(conn: Any, run: Run) -> list[int]:
    """The source ids (integers, ascending) of the tenant's files whose content is still to fetch:
    crm.files rows with `content_status` 'pending', not deleted at the source."""
    rows = conn.sql("SELECT source_id FROM crm.files WHERE tenant_id = %(t)s AND source = %(s)s"
                    " AND content_status = 'pending' AND deleted_at_source IS NULL AND source_id ~ '^[0-9]{1,18}$'",
                    {"t": run.tenant_id, "s": run.source})
    return sorted(int(r["source_id"]) for r in rows)


def file_sizes(conn: Any, run: Run, files: Sequence[int]) -> dict[int, int]:
    """The `file_size` crm.files holds for these files (source ids): what a whole download has."""
    rows = conn.sql("SELECT source_id, file_size FROM crm.files WHERE tenant_id = %(t)s AND source = %(s)s"
                    " AND source_id = ANY(%(f)s::text[]) AND file_size IS NOT NULL",
                    {"t": run.tenant_id, "s": run.source, "f": [str(f) for f in files]})
    return {int(r["source_id"]): int(r["file_size"]) for r in rows}


def _chunks(spool: IO[bytes]) -> Iterator[bytes]:
    while piece := spool.read(CHUNK_BYTES):
        yield piece


def settle(tx: Conn, run: Run, store: FileStore, kind: str, file_id: int, *, spool: IO[bytes] | None,
           sha256: str | None, size: int, status: str, reason: str | None) -> str:
    """Record one download of ledger `kind` in the caller's transaction (module docstring): with a
    `spool` (its bytes, `sha256` hex, `size`) the content stored unless the tenant has it, crm.files
    'stored' with the checksum and the ledger's claim; without, crm.files' `status` and the ledger's
    skip with `reason` (or the status). Returns the ledger outcome; raises KeyError when the
    product holds no metadata row for the file."""
    sid = str(file_id)
    rows = tx.sql("SELECT id, content_sha256 FROM crm.files WHERE tenant_id = %(t)s AND source = %(s)s"
                  " AND source_id = %(f)s", {"t": run.tenant_id, "s": run.source, "f": sid})
    if not rows:
        raise KeyError(f"no crm.files row for file {sid}")
    record, before = int(rows[0]["id"]), rows[0]["content_sha256"]
    if spool is None:
        tx.sql("UPDATE crm.files SET content_status = %(c)s WHERE id = %(i)s", {"c": status, "i": record})
        return ledger.skip(tx, run, kind, sid, reason or status)
    assert sha256 is not None
    have = tx.sql("SELECT 1 FROM crm.file_blobs WHERE tenant_id = %(t)s AND sha256 = %(s)s",
                  {"t": run.tenant_id, "s": sha256})
    if not have:
        stored = store.put(tx, run.tenant_id, _chunks(spool), expected_size=size)
        assert stored.sha256 == sha256, "the store hashed other bytes than the download"
    tx.sql("UPDATE crm.files SET content_status = 'stored', content_sha256 = %(h)s WHERE id = %(i)s",
           {"h": sha256, "i": record})
    return ledger.write_once(tx, run, kind, sid, lambda: ledger.Written("crm.files", record),
                             version=f"sha256:{sha256}", update=lambda _: {"content_sha256": before})
