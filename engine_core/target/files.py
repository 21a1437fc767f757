"""The file stores behind the port (`engine_core.store`): where a migrated file's bytes go,
content-addressed by sha256.

A provider streams a file's bytes (an iterable of chunks, as a download yields them) into a
`FileStore`; the store hashes them as they pass, keeps each tenant's content once (two files with
the same bytes, or a file read again unchanged, share one blob) and never holds a whole file in
memory: a chunk of at most `CHUNK_BYTES` at a time. A file past the store's size limit is refused
(`TooLarge`) as soon as its bytes pass the limit, and nothing of it is kept.

Two stores: `PostgresFileStore` (the default: crm.file_blobs + crm.file_blob_chunks, migration
0016, written in the caller's transaction so a blob exists only with what refers to it) and
`DirectoryFileStore` (a directory tree `<root>/<tenant>/<ab>/<sha256>`, for accounts whose
files would swell the database; crm.file_blobs still lists each blob). `store_from_env` picks one.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from engine_core.db import Conn
from engine_core.errors import ConfigError
from engine_core.store import (  # noqa: F401 - the port's names, where the stores have always offered them
    CHUNK_BYTES,
    FILE_MAX_BYTES,
    ContentMismatch,
    FileStore,
    Stored,
    TooLarge,
)

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")

def _rechunk(chunks: Iterable[bytes], max_bytes: int) -> Iterator[bytes]:
    """`chunks` as pieces of exactly CHUNK_BYTES (the last shorter); raises TooLarge as soon as
    the total passes `max_bytes`."""
    buffer = bytearray()
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise TooLarge(f"the file is larger than the store's limit of {max_bytes:,} bytes")
        buffer += chunk
        while len(buffer) >= CHUNK_BYTES:
            yield bytes(buffer[:CHUNK_BYTES])
            del buffer[:CHUNK_BYTES]
    if buffer or total == 0:
        yield bytes(buffer)


def _check_size(size: int, expected: int | None) -> None:
    if expected is not None and size != expected:
        raise ContentMismatch(f"the download has {size:,} bytes, its file says {expected:,}")


def _tenant(tenant_id: str) -> str:
    if not _TENANT.match(tenant_id):
        raise ValueError(f"tenant id {tenant_id!r} cannot name a file store folder")
    return tenant_id


class PostgresFileStore:
    """File contents in Postgres (crm.file_blobs + crm.file_blob_chunks), in the caller's
    transaction. Two writers of the same new content serialize on an advisory lock of the
    tenant and digest: one adds it, the other finds it."""

    def __init__(self, max_bytes: int = FILE_MAX_BYTES) -> None:
        self.max_bytes = max_bytes

    def put(self, tx: Conn, tenant_id: str, chunks: Iterable[bytes], *, expected_size: int | None = None) -> Stored:
        """Store the stream (class docstring); see FileStore.put."""
        digest = hashlib.sha256()
        size = 0
        blob = int(tx.sql("INSERT INTO crm.file_blobs (tenant_id) VALUES (%(t)s) RETURNING id", {"t": tenant_id})[0]["id"])
        try:
            for n, piece in enumerate(_rechunk(chunks, self.max_bytes)):
                digest.update(piece)
                size += len(piece)
                tx.sql("INSERT INTO crm.file_blob_chunks (blob_id, n, data) VALUES (%(b)s, %(n)s, %(d)s)",
                       {"b": blob, "n": n, "d": piece})
            _check_size(size, expected_size)
        except (TooLarge, ContentMismatch):
            tx.sql("DELETE FROM crm.file_blobs WHERE id = %(b)s", {"b": blob})
            raise
        sha = digest.hexdigest()
        tx.sql("SELECT pg_advisory_xact_lock(hashtextextended(%(k)s, 0))", {"k": f"file_blob:{tenant_id}:{sha}"})
        if tx.sql("SELECT 1 FROM crm.file_blobs WHERE tenant_id = %(t)s AND sha256 = %(s)s", {"t": tenant_id, "s": sha}):
            tx.sql("DELETE FROM crm.file_blobs WHERE id = %(b)s", {"b": blob})
            return Stored(sha, size, added=False)
        tx.sql("UPDATE crm.file_blobs SET sha256 = %(s)s, size = %(z)s WHERE id = %(b)s", {"s": sha, "z": size, "b": blob})
        return Stored(sha, size, added=True)

    def read(self, tx: Conn, tenant_id: str, sha256: str) -> Iterator[bytes]:
        """The chunks of a stored content, one row at a time; KeyError when the tenant has none."""
        found = tx.sql("SELECT id FROM crm.file_blobs WHERE tenant_id = %(t)s AND sha256 = %(s)s", {"t": tenant_id, "s": sha256})
        if not found:
            raise KeyError(f"no stored content {sha256} for tenant {tenant_id}")
        blob = found[0]["id"]
        n = 0
        while True:
            rows = tx.sql("SELECT data FROM crm.file_blob_chunks WHERE blob_id = %(b)s AND n = %(n)s", {"b": blob, "n": n})
            if not rows:
                return
            yield bytes(rows[0]["data"])
            n += 1


class DirectoryFileStore:
    """File contents as files under `root` (`<root>/<tenant>/<first two hex>/<sha256>`), each
    written to a temporary file, fsynced and renamed into place, so a crash never leaves a
    partial content under its digest. crm.file_blobs lists each content (size, no chunks)."""

    def __init__(self, root: Path, max_bytes: int = FILE_MAX_BYTES) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes

    def path(self, tenant_id: str, sha256: str) -> Path:
        """Where the content `sha256` of `tenant_id` lives."""
        if not _SHA256.match(sha256):
            raise ValueError(f"{sha256!r} is not a sha256 digest")
        return self.root / _tenant(tenant_id) / sha256[:2] / sha256

    def put(self, tx: Conn, tenant_id: str, chunks: Iterable[bytes], *, expected_size: int | None = None) -> Stored:
        """Store the stream (class docstring); see FileStore.put."""
        folder = self.root / _tenant(tenant_id)
        folder.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        size = 0
        handle, temp = tempfile.mkstemp(dir=folder, prefix=".part-")
        try:
            with os.fdopen(handle, "wb") as out:
                for piece in _rechunk(chunks, self.max_bytes):
                    digest.update(piece)
                    size += len(piece)
                    out.write(piece)
                out.flush()
                os.fsync(out.fileno())
            _check_size(size, expected_size)
            sha = digest.hexdigest()
            final = self.path(tenant_id, sha)
            final.parent.mkdir(exist_ok=True)
            os.replace(temp, final)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        added = bool(tx.sql(
            "INSERT INTO crm.file_blobs (tenant_id, sha256, size) VALUES (%(t)s, %(s)s, %(z)s)"
            " ON CONFLICT (tenant_id, sha256) DO NOTHING RETURNING id", {"t": tenant_id, "s": sha, "z": size}))
        return Stored(sha, size, added=added)

    def read(self, tx: Conn, tenant_id: str, sha256: str) -> Iterator[bytes]:
        """The file's bytes, CHUNK_BYTES at a time; KeyError when the tenant has no such content."""
        path = self.path(tenant_id, sha256)
        if not path.exists():
            raise KeyError(f"no stored content {sha256} for tenant {tenant_id}")
        with path.open("rb") as f:
            while piece := f.read(CHUNK_BYTES):
                yield piece


def store_from_env(env: dict[str, str] | None = None) -> FileStore:
    """The store the environment asks for: MIGRATE_FILE_STORE unset or `postgres` (the default),
    or a directory path; MIGRATE_FILE_MAX_BYTES the size limit (default FILE_MAX_BYTES, at least
    1). Raises ConfigError naming the variable for a bad value."""
    env = dict(os.environ if env is None else env)
    raw = env.get("MIGRATE_FILE_MAX_BYTES") or ""
    limit = FILE_MAX_BYTES
    if raw:
        try:
            limit = int(raw)
        except ValueError:
            raise ConfigError(f"MIGRATE_FILE_MAX_BYTES must be an integer, got {raw!r}") from None
        if limit < 1:
            raise ConfigError(f"MIGRATE_FILE_MAX_BYTES must be at least 1, got {limit}")
    where = (env.get("MIGRATE_FILE_STORE") or "postgres").strip()
    if where == "postgres":
        return PostgresFileStore(limit)
    if not os.path.isabs(where):
        raise ConfigError(f"MIGRATE_FILE_STORE must be `postgres` or an absolute directory path, got {where!r}")
    return DirectoryFileStore(Path(where), limit)
