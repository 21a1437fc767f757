"""File contents as a kind of the run (`file_contents`, opt-in): each file's bytes downloaded once
(`/v1/files/{id}/download`, 20 tokens), streamed, checksummed (sha256) and kept in the file store
(`engine_core.file_contents`, the store port `engine_core.store`: Postgres by default, a directory with MIGRATE_FILE_STORE, content-
addressed, one copy per distinct content a tenant has).

Which files: those whose metadata the product holds with `content_status` 'pending' - written by
the `files` kind and not downloaded since (a file whose metadata changes at the source is written
again with its status back to 'pending': its new bytes are fetched once more). The discovery
(`file_contents:discover`; in the catch-up, seeded when the files list has been walked) reads them
in id order and seeds tasks of `FILES_PER_TASK`; a task's offset is the index of its first file not
yet settled, each file settled in a transaction of its own with the checkpoint.

A file, in order: the download goes to a temporary file (`tempfile.SpooledTemporaryFile`: at most
`SPOOL_BYTES` in memory, the rest on disk), hashed and counted as it passes and given up as soon as
it passes the store's size limit, and asked again when it breaks off (fewer bytes than the file's
`file_size`: a cut body can end cleanly) - all outside any database transaction; then one short
transaction stores the bytes from the temporary file (unless the tenant has that content
already), sets crm.files' `content_status` 'stored' and `content_sha256`, and claims the file in
the ledger under kind `file_contents` (record crm.files, version "sha256:<hex>": a later content
is an update in place, the same one already here).

A file whose bytes are not kept keeps its metadata row and says why, never failing the run:
`content_status` 'forbidden' (403: private to another user, once the token itself reads the
account: `paging.settle_refusals`), 'missing' (404: purged from the source's storage while still
listed) or 'too_large' (past MIGRATE_FILE_MAX_BYTES), and the ledger holds the file under
`file_contents` as skipped with the reason, so `migrate rows` and `migrate explain file_contents
<id>` tell it like any skipped row. A download that fails otherwise (the client's retries spent, a
connection lost mid-body) is skipped with that reason and stays 'pending': the next run or sync
asks again. A dry run downloads nothing.
"""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from engine_core import file_contents
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.pipedrive.paging import settle_refusals
from engine_core.providers.pipedrive.errors import (AuthError, Cancelled, DailyLimitReached, ItemRefused,
                                                    PipedriveError, TransientHTTPError)
from engine_core.providers.pipedrive.files import content_status
from engine_core.store import CHUNK_BYTES, FileStore

KIND = "file_contents"
DOWNLOAD_TRIES = 3  # a download broken off is asked again, at most this many times in all
FILES_PER_TASK = 20  # downloads a task settles: a task's claim costs less than one download
SPOOL_BYTES = CHUNK_BYTES  # a download's bytes held in memory before its temporary file goes to disk
DOWNLOAD_PATH = "/v1/files/{}/download"
CATCHUP_DISCOVERY = "catchup:file_contents:discover"


def seeds() -> list[Successor]:
    """The phase's first task: the discovery."""
    return [Successor(f"{KIND}:discover", {"discover": True})]


def discover(ctx: TaskContext, prefix: str = KIND) -> TaskOutcome:
    """Tasks of `FILES_PER_TASK` pending files (module docstring), keyed `<prefix>:f<index>`; none
    in a dry run (nothing is downloaded)."""
    if ctx.run.dry_run:
        ctx.log.note("info", KIND, "a dry run downloads no file content")
        return TaskOutcome()
    with ctx.db.connection() as conn:
        files = file_contents.pending_files(conn, ctx.run)
    ctx.stats.values["files_pending"] = len(files)
    catchup = prefix != KIND
    return TaskOutcome(tuple(
        Successor(f"{prefix}:f{i}", {"contents": "files", "files": files[i : i + FILES_PER_TASK]} if catchup
                  else {"files": files[i : i + FILES_PER_TASK]})
        for i in range(0, len(files), FILES_PER_TASK)))


@dataclass
class Fetched:
    """A download's outcome: its bytes in `spool` (sha256 hex, size), or why there are none
    (`status`: a crm.files content_status other than 'stored' and `reason`)."""

    spool: IO[bytes] | None = None
    sha256: str | None = None
    size: int = 0
    status: str = "stored"
    reason: str | None = None
    cut: bool = False  # the download broke off (asked again)


class _TooLarge(Exception):
    pass


def fetch(client: Any, file_id: int, max_bytes: int, expected: int | None = None, cancel: Any = None) -> Fetched:
    """Download one file into a spooled temporary file (module docstring), holding no database
    connection; a download broken off - the connection lost mid-body, or fewer or more bytes than
    `expected` (the file's `file_size`; a body cut short can end cleanly without a length) - is
    asked again, `DOWNLOAD_TRIES` times in all, then returned 'pending' with the reason. The
    token's refusal (401, a 403 the account's identity shares), a stop and a daily limit raise;
    the file's own outcomes are returned."""
    reason = ""
    for _ in range(DOWNLOAD_TRIES):
        got = _fetch_once(client, file_id, max_bytes, cancel)
        if got.spool is not None and expected is not None and got.size != expected:
            got.spool.close()
            reason = (f"file content download failed: {got.size:,} bytes came, the file's metadata says "
                      f"{expected:,} (cut short, or the file changed since it was listed)")
            continue
        if got.status == "pending" and got.reason and got.cut:
            reason = got.reason
            continue
        return got
    return Fetched(status="pending", reason=f"{reason}; asked {DOWNLOAD_TRIES} times, the next run or sync asks again"[:500])


def _fetch_once(client: Any, file_id: int, max_bytes: int, cancel: Any = None) -> Fetched:
    path = DOWNLOAD_PATH.format(int(file_id))
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
    digest, size = hashlib.sha256(), 0
    try:
        with client.download(path, cancel=cancel) as chunks:
            for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise _TooLarge()
                digest.update(chunk)
                spool.write(chunk)
    except ItemRefused as e:
        spool.close()
        settle_refusals(client, [e], cancel=cancel)  # a 403 is the file's unless the token is refused
        why = "private to another user" if e.status == 403 else "purged from the source's storage while still listed"
        return Fetched(status=content_status(e.status or 404),
                       reason=f"file content not downloaded: the source answered HTTP {e.status} ({why})")
    except _TooLarge:
        spool.close()
        return Fetched(status="too_large", size=size,
                       reason=f"file content not kept: larger than MIGRATE_FILE_MAX_BYTES ({max_bytes:,} bytes)")
    except (AuthError, Cancelled, DailyLimitReached):
        spool.close()
        raise
    except PipedriveError as e:
        spool.close()
        return Fetched(status="pending", reason=f"file content download failed ({e})"[:400],
                       cut=isinstance(e, TransientHTTPError))
    except BaseException:
        spool.close()
        raise
    spool.seek(0)
    return Fetched(spool=spool, sha256=digest.hexdigest(), size=size)


def settle(tx: Conn, run: Run, store: FileStore, file_id: int, got: Fetched) -> str:
    """Hand one download to the engine in the caller's transaction (`file_contents.settle`: the
    content stored, crm.files' status and checksum, the ledger's claim or skip). Returns the
    ledger outcome; raises KeyError when the product holds no metadata row for the file."""
    return file_contents.settle(tx, run, store, KIND, file_id, spool=got.spool, sha256=got.sha256, size=got.size,
                                status=got.status, reason=got.reason)


def run_task(ctx: TaskContext, client: Any, files: Sequence[int], store: FileStore | None = None) -> TaskOutcome:
    """A task's files from its offset on, one download and one transaction each (module
    docstring); a stop is honoured between files. Raises what `fetch` raises."""
    store = store or file_contents.file_store()
    ids = [int(f) for f in files]
    with ctx.db.connection() as conn:
        sizes = file_contents.file_sizes(conn, ctx.run, ids)
    at = min(ctx.offset, len(ids))
    while at < len(ids):
        ctx.stop_point()
        got = fetch(client, ids[at], store.max_bytes, sizes.get(ids[at]), ctx.cancel)
        try:
            counted = ctx.stats.copy()
            try:
                with ctx.db.transaction() as tx:
                    outcome = settle(tx, ctx.run, store, ids[at], got)
                    ctx.stats.bump("seen")
                    ctx.stats.bump(outcome)
                    if got.spool is not None:
                        ctx.stats.bump("bytes_downloaded", got.size)
                    else:
                        ctx.stats.bump(f"content_{got.status}")
                    ctx.checkpoint(tx, at + 1)
            except BaseException:
                ctx.stats = counted
                raise
        finally:
            if got.spool is not None:
                got.spool.close()
        if got.reason:
            ctx.log.note("warning", KIND, got.reason, subject=str(ids[at]))
        at += 1
    return TaskOutcome()
