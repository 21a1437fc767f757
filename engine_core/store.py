"""The file store port: what the engine and a provider know of where file contents go.

A provider downloads a file's bytes; the engine keeps them through a `FileStore` (the stores
themselves, Postgres and a directory, are the product's: `engine_core/target/files.py`). Content
is addressed by sha256 and streamed in chunks of at most `CHUNK_BYTES`, so no worker holds a whole
file; a store refuses a file past its `max_bytes` (`TooLarge`). Pure: no I/O here.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from engine_core.db import Conn
from engine_core.errors import EngineError

# Bytes per stored chunk row and per read: 1 MiB keeps a row well under Postgres's 1 GB field
# limit and TOAST's sweet spot, and bounds what a worker holds per file.
CHUNK_BYTES = 1 << 20
# The default size limit (MIGRATE_FILE_MAX_BYTES): 100 MiB, far above the largest file the seeded
# accounts hold (3 MiB) - a bigger one is recorded `too_large` with its metadata, not stored.
FILE_MAX_BYTES = 100 << 20


class TooLarge(EngineError):
    """A file's bytes passed the store's size limit."""


class ContentMismatch(EngineError):
    """A stream's length differs from the size its source announced."""


@dataclass(frozen=True)
class Stored:
    """One stored content: its sha256 (64 lowercase hex), size in bytes, and whether this put
    added it (False: the tenant already had these bytes)."""

    sha256: str
    size: int
    added: bool


class FileStore(Protocol):
    """Where file contents go (module docstring). `put` raises TooLarge past `max_bytes` and
    ContentMismatch when `expected_size` is given and the stream's length differs from it."""

    max_bytes: int

    def put(self, tx: Conn, tenant_id: str, chunks: Iterable[bytes], *, expected_size: int | None = None) -> Stored:
        """Store a stream's bytes for `tenant_id`; returns what was stored."""
        ...

    def read(self, tx: Conn, tenant_id: str, sha256: str) -> Iterator[bytes]:
        """The stored bytes of `sha256`, chunk by chunk; KeyError when the tenant has none."""
        ...
