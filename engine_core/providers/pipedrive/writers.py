"""Writing a page of Pipedrive rows through the engine's write path (`engine_core/write.py`, issue
11): the provider maps its rows (`mapping`) and says how to ask the source about missing parents
(`ask_source`, the probe); the engine resolves the page's references in one ledger query and
writes it in windows (set-based statements for plain rows, a savepoint a row for the rest).

A row whose parents are not all in the ledger is skipped as "not linked to any record": a
placeholder that a later run importing the parent takes over. Owners, the people on a mail,
custom fields that point at records and a deal's pipeline and stage are softer references: linked
when found, empty when not.

Parents deleted at the source (issue 8, item 5). Pipedrive keeps a child's `org_id` after the
organization was permanently deleted, and such a parent is never listed. The proof that a parent
does not exist is the source itself: for each missing parent the ledger knows nothing about
(no created, matched, skipped or failed entry) of a kind this run imports, the page asks the
source once - `GET /api/v2/organizations/{id}` and the like, through the provider's budgeted
client, before the page's windows open and holding no database connection - and remembers the
answer for the run (`SourceAnswers`). 404: the row is imported with that link empty, and the
dangling reference is kept on the product row (`dangling_refs`) and on its ledger entry
(`dangling`, counted per kind by `ledger.dangling_counts`), with a reason `migrate explain` shows
("imported; org_id 42 does not exist at the source (404)"). 200: the parent exists but is not
written (it failed, or its listing missed it), so the row stays a placeholder, saying so. A parent
that failed or was skipped, and a parent of a kind the run does not import, stay placeholders
without a request. Owners stay soft references.

One identity per source record (issue 8, item 6): the archived lists' tasks write ledger kind
`deals` / `leads` (`mapping.ledger_kind`), so a deal listed by `/api/v2/deals` and again, archived
since, by `/api/v2/deals/archived` is one ledger entry and one product row. Archiving moves a
record's update time, so its second sighting is a newer version: `updated` in place (below), with
`archived_updated` in the task's stats; a sighting whose version cannot be ordered against the
written one (equal times) is `already_here` and only brings the archived flag up
(`crm.refresh_archived`).

Changes (issue 9). Every row carries its source version (`Mapped.version`: `update_time` as
served, or a content hash); a written row seen again with a newer version is written over its
product row in place (`crm.update`, same record id, never a second row), outcome `updated`, the
previous values in the ledger's history (`ledger.write_once`). A matched row (the product's own
contact, company or user) is not overwritten unless the run option `overwrite_matched` is true.

In a dry run nothing is written (the engine rolls each row's savepoint back), so a parent that
this same run would have created earlier is not in the ledger; the engine remembers the dry run's
would-be writes (`ledger.dry_written`), and a parent found there counts as linked.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from engine_core import ledger, write
from engine_core.context import Batch, PageResult, TaskContext
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.mapping import FieldBook, MalformedRow, Mapped, apply_links, ledger_kind
from engine_core.target import crm
from engine_core.write import (  # noqa: F401 - the engine's names, as this module always offered them
    DANGLING,
    NOT_LINKED,
    NOT_WRITTEN,
    Event,
    Mapper,
    Pair,
    ledger_refs,
    lookup,
    missing_parents,
)

# How to ask the source whether a parent exists: one record by id, per parent ledger kind.
# Users (owners) are soft references and never asked about.
PARENT_PATHS: dict[str, str] = {
    "organizations": "/api/v2/organizations/{}",
    "persons": "/api/v2/persons/{}",
    "deals": "/api/v2/deals/{}",
    "leads": "/v1/leads/{}",
    "pipelines": "/api/v2/pipelines/{}",
    "stages": "/api/v2/stages/{}",
}


class Getter(Protocol):
    """What the parent probe needs of the provider's client (`PipedriveClient.get`)."""

    def get(self, path: str, params: Mapping[str, Any] | None = None, *, cancel: Any = None) -> dict[str, Any]: ...


def _raw_id(row: Any) -> str | None:
    # A malformed row is recorded under its id only when the id itself is sound.
    value = row.get("id") if isinstance(row, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)
    if isinstance(value, str) and len(value) == 36 and value.count("-") == 4:
        return value.lower()
    return None


class Prepared(write.Prepared):
    """A Pipedrive row ready for its window (`write.Prepared`): a malformed row is recorded under
    its id only when the id itself is sound."""

    @classmethod
    def of(cls, row: Any, mapper: Mapper, **_: Any) -> Prepared:  # type: ignore[override]
        return super().of(row, mapper, malformed=MalformedRow, raw_id=_raw_id)  # type: ignore[return-value]


# --- parents deleted at the source -------------------------------------------------------------


class SourceAnswers:
    """What the source answered about parents, per run and in memory: `True` exists (200), `False`
    does not exist (404). Shared by the lane threads of a process; a few runs are kept."""

    RUNS_KEPT = 32

    def __init__(self) -> None:
        self._by_run: OrderedDict[tuple[str, int], dict[Pair, bool]] = OrderedDict()
        self._lock = threading.Lock()
        # parents being asked now, by one lane thread each: the others wait for its answer
        self._asking: dict[tuple[tuple[str, int], Pair], threading.Event] = {}

    def take(self, key: tuple[str, int], pair: Pair) -> threading.Event | None:
        """None: the caller asks the source about `pair` and then `put`s the answer or `drop`s the
        question; else the Event another thread sets when it has (wait, then `get`)."""
        with self._lock:
            if pair in self._by_run.get(key, {}):
                done = threading.Event()
                done.set()
                return done
            asking = self._asking.get((key, pair))
            if asking is not None:
                return asking
            self._asking[(key, pair)] = threading.Event()
            return None

    def drop(self, key: tuple[str, int], pair: Pair) -> None:
        """The caller's question failed: a waiting thread asks again itself."""
        with self._lock:
            asking = self._asking.pop((key, pair), None)
        if asking is not None:
            asking.set()

    def get(self, key: tuple[str, int], pairs: Iterable[Pair]) -> dict[Pair, bool]:
        with self._lock:
            known = self._by_run.get(key, {})
            return {p: known[p] for p in pairs if p in known}

    def put(self, key: tuple[str, int], pair: Pair, exists: bool) -> None:
        with self._lock:
            self._by_run.setdefault(key, {})[pair] = exists
            self._by_run.move_to_end(key)
            while len(self._by_run) > self.RUNS_KEPT:
                self._by_run.popitem(last=False)
            asking = self._asking.pop((key, pair), None)
        if asking is not None:
            asking.set()


ANSWERS = SourceAnswers()


def askable(run: Run, pairs: Iterable[Pair], known: Mapping[Pair, str]) -> list[Pair]:
    """Missing parents worth a request: unknown to the ledger, of a kind the run imports, and of a
    kind the source can be asked about by id."""
    imported = {ledger_kind(k) for k in run.kinds}
    return sorted(p for p in pairs if p not in known and p[0] in imported and p[0] in PARENT_PATHS)


PROBE_THREADS = 4  # parents asked at once by one page (each a GET through the budgeted client)


def ask_source(client: Getter, pairs: Iterable[Pair], key: tuple[str, int], cancel: Any = None,
               answers: SourceAnswers = ANSWERS, threads: int | None = None) -> dict[Pair, bool]:
    """Whether each parent exists at the source: one GET per pair not answered before in this run.
    404 -> False, a record -> True; any other failure (rate limit, server error after the client's
    retries) propagates and the page is retried like any failed fetch. Never call this holding a
    database connection or transaction.

    Up to `threads` (default `PROBE_THREADS`) parents are asked at once (issue 11: a page of notes pointing at 25 deleted
    parents waited for 25 round trips one after another); the requests are the same ones, paced by
    the same budget, each parent still asked once per run (`SourceAnswers`). When one question
    fails, the questions not yet sent are not sent and the first failure propagates."""
    pairs = list(pairs)
    out = answers.get(key, pairs)
    todo = [p for p in dict.fromkeys(pairs) if p not in out]
    threads = PROBE_THREADS if threads is None else threads
    if len(todo) <= 1 or threads <= 1:
        for pair in todo:
            out[pair] = _ask_one(client, pair, key, cancel, answers)
        return out
    with ThreadPoolExecutor(max_workers=min(threads, len(todo)), thread_name_prefix="probe") as pool:
        futures = {pool.submit(_ask_one, client, pair, key, cancel, answers): pair for pair in todo}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in pending:
            f.cancel()
    failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
    if failed:
        raise failed[0].exception()  # type: ignore[misc]
    for f, pair in futures.items():
        out[pair] = f.result()
    return out


def _ask_one(client: Getter, pair: Pair, key: tuple[str, int], cancel: Any, answers: SourceAnswers) -> bool:
    """One parent's answer: asked of the source by this thread, or awaited from the lane thread
    asking it now (two pages on one deleted organization ask once: test_references' count)."""
    while True:
        waiting = answers.take(key, pair)
        if waiting is not None:
            waiting.wait()
            known = answers.get(key, [pair])
            if pair in known:
                return known[pair]
            continue  # the asker failed: take it again
        kind, sid = pair
        try:
            client.get(PARENT_PATHS[kind].format(sid), cancel=cancel)
        except NotFound:
            exists = False
        except BaseException:
            answers.drop(key, pair)
            raise
        else:
            exists = True
        answers.put(key, pair, exists)
        return exists


def probe_of(ctx: TaskContext, client: Getter) -> write.Probe:
    """The engine's probe for a Pipedrive page: parents unknown to the ledger, of kinds this run
    imports and the source answers by id, asked once per run through the budgeted `client`."""
    return lambda pairs: ask_source(client, askable(ctx.run, pairs, {}), (ctx.db.url, ctx.run.id), ctx.cancel)


def write_mapped(
    tx: Conn, run: Run, kind: str, mapped: Mapped, found: Mapping[Pair, int],
    dry: set[Pair] | None = None, *, exists: Mapping[Pair, bool] | None = None,
    on_event: Event | None = None, held: ledger.Held | None = None,
) -> str:
    """One Pipedrive row, per row (`write.write_mapped` with Pipedrive's `apply_links`: mail
    parties); the email phase writes its messages through this."""
    return write.write_mapped(tx, run, kind, mapped, found, dry, exists=exists, on_event=on_event, held=held,
                              link=apply_links)


def mail_batch(ctx: TaskContext, kind: str, found: dict[Pair, int], written: Iterable[str]) -> Batch:
    """The email phase's optimistic windows (`write.window_batch` with Pipedrive's `apply_links`):
    a window's messages mapped, their deal written and no written ledger entry for them are
    claimed and inserted in set-based statements; `written`: the ids the ledger holds written (a
    newer version: updated in place, per row). The rows are the phase's `MailRow`s (`.mapped`,
    `.error`). Not for a dry run."""
    page = write.PageRefs(found=found, held=dict.fromkeys(written))
    return write.window_batch(ctx, kind, page, apply_links, parts=lambda row: (row.mapped, row.error))


def write_page(
    ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, *, kind: str | None = None, client: Getter | None = None,
    optimistic: bool = True,
) -> PageResult:
    """Map a page, resolve its references in one query, write it in the engine's windows
    (`write.write_page`).

    `kind`: the ledger kind (default: the task kind's, `mapping.ledger_kind`). With a `client`, the
    page's parents that the ledger does not know are asked of the source first (`ask_source`).
    `optimistic=False`: every row per row (the baseline)."""
    return write.write_page(ctx, rows, mapper, kind=kind or ledger_kind(ctx.task.kind),
                            probe=probe_of(ctx, client) if client is not None else None, link=apply_links,
                            malformed=MalformedRow, raw_id=_raw_id, optimistic=optimistic)


def write_listed_page(ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, client: Getter) -> PageResult:
    """A listing's page (`write_page`) whose missing parents are checked at the source through the
    provider's budgeted `client`: parents deleted there leave their rows imported, links empty."""
    return write_page(ctx, rows, mapper, client=client)


# --- field definitions -----------------------------------------------------------------------


def normal_definition(entity: str, item: dict[str, Any], position: int) -> dict[str, Any]:
    """A v2 (`field_code`, `field_name`) or v1 (`key`, `name`) field definition, normalised."""
    key = item.get("field_code") or item.get("key")
    name = item.get("field_name") or item.get("name")
    ftype = item.get("field_type")
    if not isinstance(key, str) or not key or not isinstance(name, str) or not isinstance(ftype, str):
        raise MalformedRow(f"{entity} field definition without key, name or type: {str(item)[:80]}")
    options = item.get("options")
    if options is not None and not isinstance(options, list):
        raise MalformedRow(f"{entity} field {key} has options that are not a list")
    is_custom = item.get("is_custom_field")
    if is_custom is None:  # v1: custom fields are the editable ones with a 40-hex key
        is_custom = bool(item.get("edit_flag")) and len(key) == 40
    return {
        "id": f"{entity}:{key}",
        "entity": entity,
        "field_key": key,
        "name": name,
        "field_type": ftype,
        "options": [{"id": o.get("id"), "label": o.get("label")} for o in options or [] if isinstance(o, dict)] or None,
        "subfields": item.get("subfields"),
        "is_custom": bool(is_custom),
        "position": int(item.get("order_nr", position)) if isinstance(item.get("order_nr", position), int) else position,
    }


DEFINITION_COLUMNS = ("entity", "field_key", "name", "field_type", "options", "subfields", "is_custom", "position")


def write_definitions(ctx: TaskContext, definitions: Sequence[dict[str, Any]]) -> PageResult:
    """Store the run's field definitions: refreshed in place every run, claimed once in the ledger.

    A definition's version is its content's hash (`ledger.content_version` of the normalised
    definition: definitions have no update time); a changed one counts `updated`, with the
    previous values in the ledger's history."""

    def writer(tx: Conn, d: dict[str, Any]) -> str:
        values = {k: d[k] for k in DEFINITION_COLUMNS}
        # The refresh happens outside the claim's savepoint: a field already here still gets
        # its current name and option labels. What it replaced is kept for the history.
        old = crm.field_definition(tx, ctx.run.tenant_id, ctx.run.source, d["entity"], d["field_key"])
        def_id = crm.upsert_field_definition(tx, {"tenant_id": ctx.run.tenant_id, "source": ctx.run.source, **values})
        before = {k: old[k] for k in DEFINITION_COLUMNS if old is not None and old[k] != values[k]}
        return ledger.write_once(tx, ctx.run, "fields", d["id"], lambda: ledger.Written("crm.custom_field_definitions", def_id),
                                 version=ledger.content_version(values), update=lambda _record_id: before,
                                 on_event=ctx.stats.bump)

    return ctx.write_rows(list(definitions), writer, kind="fields")


def book_from_db(conn: Conn, run: Run) -> FieldBook:
    return FieldBook(crm.field_definitions(conn, run.tenant_id, run.source))
