"""The file store port against a real database and a real directory: contents kept once per tenant
and sha256, streamed chunk by chunk, refused past the size limit with nothing left behind."""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest

from engine_core.errors import ConfigError
from engine_core.target import files
from engine_core.target.files import CHUNK_BYTES, ContentMismatch, DirectoryFileStore, PostgresFileStore, TooLarge


class Source:
    """A download's bytes, 64 KiB at a time, counting what the store pulled."""

    def __init__(self, size: int, seed: int = 1) -> None:
        self.size, self.seed, self.pulled = size, seed, 0

    def __iter__(self) -> Iterator[bytes]:
        step = 64 << 10
        for start in range(0, self.size, step):
            piece = hashlib.sha256(f"{self.seed}:{start}".encode()).digest() * (step // 32)
            piece = piece[: min(step, self.size - start)]
            self.pulled += len(piece)
            yield piece

    def sha256(self) -> str:
        return hashlib.sha256(b"".join(Source(self.size, self.seed))).hexdigest()


def stores(tmp_path) -> list[files.FileStore]:
    return [PostgresFileStore(), DirectoryFileStore(tmp_path / "blobs")]


@pytest.mark.parametrize("which", ["postgres", "directory"])
def test_contents_are_kept_once_per_tenant_and_read_back_whole(db, tmp_path, which) -> None:
    store = stores(tmp_path)[0 if which == "postgres" else 1]
    src = Source(3 * CHUNK_BYTES + 12345)
    with db.transaction() as tx:
        first = store.put(tx, "acme", src, expected_size=src.size)
        again = store.put(tx, "acme", Source(src.size))
        other = store.put(tx, "other", Source(src.size))
        back = list(store.read(tx, "acme", first.sha256))
    assert (first.sha256, first.size, first.added) == (src.sha256(), src.size, True)
    assert (again.sha256, again.added) == (first.sha256, False)
    assert other.added, "each tenant keeps its own contents"
    assert max(len(p) for p in back) <= CHUNK_BYTES and hashlib.sha256(b"".join(back)).hexdigest() == first.sha256
    blobs = db.sql("SELECT tenant_id, sha256, size FROM crm.file_blobs ORDER BY tenant_id")
    assert blobs == [{"tenant_id": "acme", "sha256": first.sha256, "size": src.size},
                     {"tenant_id": "other", "sha256": first.sha256, "size": src.size}]
    chunks = db.sql("SELECT count(*) AS n FROM crm.file_blob_chunks")[0]["n"]
    assert chunks == (8 if which == "postgres" else 0)
    with db.transaction() as tx, pytest.raises(KeyError):
        list(store.read(tx, "acme", "0" * 64))


@pytest.mark.parametrize("which", ["postgres", "directory"])
def test_a_file_past_the_limit_is_refused_early_and_leaves_nothing(db, tmp_path, which) -> None:
    store = stores(tmp_path)[0 if which == "postgres" else 1]
    store.max_bytes = 200_000
    src = Source(5 * CHUNK_BYTES)
    with db.transaction() as tx:
        with pytest.raises(TooLarge, match="200,000 bytes"):
            store.put(tx, "acme", src)
        with pytest.raises(ContentMismatch, match="says 999"):
            store.put(tx, "acme", Source(1000), expected_size=999)
    assert src.pulled <= 200_000 + (64 << 10), "the stream stops at the limit, it is not read to its end"
    assert db.sql("SELECT count(*) AS n FROM crm.file_blobs")[0]["n"] == 0
    assert db.sql("SELECT count(*) AS n FROM crm.file_blob_chunks")[0]["n"] == 0
    if which == "directory":
        assert [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == []


def test_an_empty_file_is_a_content_too(db, tmp_path) -> None:
    with db.transaction() as tx:
        for store in stores(tmp_path):
            stored = store.put(tx, "acme", iter(()), expected_size=0)
            assert stored.sha256 == hashlib.sha256(b"").hexdigest() and stored.size == 0
            assert b"".join(store.read(tx, "acme", stored.sha256)) == b""


def test_the_store_comes_from_the_environment(tmp_path) -> None:
    assert isinstance(files.store_from_env({}), PostgresFileStore)
    chosen = files.store_from_env({"MIGRATE_FILE_STORE": str(tmp_path), "MIGRATE_FILE_MAX_BYTES": "1024"})
    assert isinstance(chosen, DirectoryFileStore) and chosen.max_bytes == 1024
    with pytest.raises(ConfigError, match="MIGRATE_FILE_MAX_BYTES must be an integer"):
        files.store_from_env({"MIGRATE_FILE_MAX_BYTES": "1MB"})
    with pytest.raises(ConfigError, match="MIGRATE_FILE_STORE"):
        files.store_from_env({"MIGRATE_FILE_STORE": "relative/dir"})
    with pytest.raises(ValueError, match="cannot name"):
        DirectoryFileStore(tmp_path).path("../etc", "0" * 64)
    assert not os.listdir(tmp_path)
