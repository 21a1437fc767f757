"""The engine's write path ("the engine owns the write"): a provider maps its source
rows into the engine's row shape (`engine_core.rows.Mapped`); the engine resolves the page's
references through the ledger in one query, optionally asks the provider whether missing parents
exist at the source, then writes the page in windows with the checkpoint.

    map -> resolve (one ledger query per page) -> probe (the provider's, holding no connection)
        -> windows (`TaskContext.write_rows`): set-based statements for plain rows, per row else

References. A row whose parents are not all in the ledger is skipped as "not linked to any
record": a placeholder that a later write takes over. Soft links are filled when found, empty
when not; one to a kind neither the run nor an earlier one took (`taken_before`) is owed (`OWED`)
until a run writes it, one to a kind the run takes until the run ends (`pending_links`: the
parent may be written later in the run). A `probe` (the provider's: Pipedrive asks `GET /api/v2/organizations/{id}` and the like
through its budgeted client) is given the missing parents the ledger knows nothing about, before
the windows open and holding no database connection, and answers which exist: a parent it says
does not exist (404 by id, or absent from an `ids=` list) leaves the row imported with that link empty, the reference kept on the
product row (`dangling_refs`) and the ledger entry (`dangling`) with a reason; one that exists
but is not written keeps the row a placeholder, saying so. A parent the probe leaves to a later
walk that settles it without a request (answered None: Pipedrive's full run leaves it to its
catch-up, `walk_proof`) keeps the row a placeholder that `WAITS_FOR_WALK`, counted `rows.WAITING`
(not skipped), as does a row whose parent is such a placeholder (`resolve_page`).

Optimistic windows. Each window's plain rows - mapped, every parent written (or gone
at the source), no written ledger entry for them when the page was read, their id once in the
window, not a dry run, not a revisit's own rows - are written with set-based statements in a
savepoint of the window's transaction: one match query per matched table (`crm.match_rows`, the
one-row matches' rule), then one statement per table and column set that claims the rows in the
ledger and inserts the product rows of the claims that won (`ledger.claim_window` with
`ledger.NewRows`, `claim_record`'s contract: `ROWS`). A claim that lost (another list, run or
worker holds the row) inserts nothing, and that row goes through the per-row path in the same
transaction (its sighting: already here, or an update in place). Every other row goes through
the per-row savepoints (`write_mapped` -> `ledger.write_once`). When the set-based part raises,
its savepoint is rolled back and the window is written per row, so a malformed row still fails
alone with its reason. `optimistic=False` keeps the per-row path alone (the baseline the bench
and the tests compare with): the ledger and product rows are the same either way.

Changes. A written row seen again with a newer version is written over its product row
in place (`crm.update`), outcome `updated`, the previous values in the ledger's history; a matched
row (the product's own contact, company or user) is not overwritten unless the run option
`overwrite_matched` is true. A dry run writes nothing (the per-row savepoints roll back); a parent
this same run would have written earlier counts as linked (`ledger.dry_written`).
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine_core import ledger
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.models import Run
from engine_core.ledger_reads import tenant_unreadable
from engine_core.rows import WAITING, WAITS_FOR_WALK, MalformedRow, Mapped, Ref, apply_links, link_values, unreadable_key
from engine_core.skip_reason import (DANGLING, NOT_LINKED, NOT_WRITTEN, OWED, dangling_reason, not_linked,  # noqa: F401
                                     untaken_lists)
from engine_core.taken_before import taken_before
from engine_core.pending_links import owed_links, pending_links
from engine_core.target import crm
from engine_core.window import PageResult, row_id

# The words of the reasons (NOT_LINKED, DANGLING, NOT_WRITTEN, OWED) are `skip_reason`'s.
# Said of a parent the probe left to the catch-up's walk (answered None): no request now; that walk
# links the row, or - the parent not listed by it - finds it gone (the provider's proof). The row's
# outcome is `rows.WAITING`, not skipped (`WAITS_FOR_WALK`, `_outcome_of_skip`).

Mapper = Callable[[Any], Mapped]
Event = Callable[[str], None]
Pair = tuple[str, str]  # (ledger kind, source id)
# The provider's question to its source: of these missing parents the ledger knows nothing about,
# which exist ({pair: True}), which do not ({pair: False}), which the catch-up's walk settles later
# without a request ({pair: None}: `WAITS_FOR_WALK`); pairs it leaves out stay placeholders.
Probe = Callable[[list[Pair]], Mapping[Pair, "bool | None"]]

# How an optimistic window writes its product rows: "claimed" - inserted by the window's ledger
# claim itself, one statement per table and column set (`ledger.claim_window` with
# `ledger.NewRows`: ids, claim and insert together; a claim that loses inserts nothing); "copy" -
# COPY with ids drawn from the sequence first, then the claim, then a delete of the rows whose
# claim lost; "insert" - the same with one multi-row INSERT. bench/write_path.py measures the three.
ROWS = "claimed"


class Prepared(dict):
    """A row ready for its window: a dict (the engine reads its `id`) carrying the mapping or the
    reason it cannot be mapped."""

    @classmethod
    def of(cls, row: Any, mapper: Mapper, *, malformed: type[BaseException] | tuple[type[BaseException], ...] = MalformedRow,
           raw_id: Callable[[Any], str | None] = row_id, raw_key: Callable[[Any], str] = unreadable_key) -> Prepared:
        """Map `row`; an exception of the `malformed` kinds makes a row that fails alone in its
        window with that reason, recorded in the ledger under `raw_id(row)`; when that is None (the
        row has no readable id) it keeps the row as served under `raw` and `raw_key(row)` under
        `raw_key`, and the window records it among the rows without a readable id
        (`ledger.note_unreadable`)."""
        try:
            mapped = mapper(row)
        except malformed as e:
            sid = raw_id(row)
            if sid is None:
                return cls(id=None, mapped=None, error=e, raw=row, raw_key=raw_key(row))
            return cls(id=sid, mapped=None, error=e)
        return cls(id=mapped.source_id, mapped=mapped, error=None)


def ledger_refs(mapped: Iterable[Mapped | None]) -> set[Pair]:
    """Every (ledger kind, source id) the rows' references may be found under, each once (a
    page's rows share most of their parents: `ledger.references` reads each pair once)."""
    pairs: set[Pair] = set()
    for m in mapped:
        if m is None:
            continue
        for ref in m.refs():
            pairs.update((kind, ref.source_id) for kind in ref.kinds)
    return pairs


def lookup(found: Mapping[Pair, int], ref: Ref) -> int | None:
    """The local record id a reference resolves to, else None."""
    for kind in ref.kinds:
        record_id = found.get((kind, ref.source_id))
        if record_id is not None:
            return record_id
    return None


def missing_parents(mapped: Iterable[Mapped | None], found: Mapping[Pair, int], dry: Collection[Pair] | None) -> set[Pair]:
    """Parents of these rows that are not written (nor, in a dry run, would-be written)."""
    out: set[Pair] = set()
    for m in mapped:
        if m is None:
            continue
        for ref in m.parents:
            if lookup(found, ref) is None and not (dry and any((k, ref.source_id) in dry for k in ref.kinds)):
                out.add((ref.parent_kind, ref.source_id))
    return out


def parents_json(mapped: Mapped, missing: Collection[Ref]) -> str:
    """A placeholder's parents as its ledger entry keeps them (migration 0019, JSON text): every
    parent of `mapped` - `{"kinds": [ledger kinds], "id": source id, "missing": bool}` - so a later
    step can tell when all are written and which record listed the row (`ledger_reads.takeable`)."""
    gone = {(ref.parent_kind, ref.source_id) for ref in missing}
    return json.dumps([{"kinds": list(ref.kinds), "id": ref.source_id, "missing": (ref.parent_kind, ref.source_id) in gone}
                       for ref in mapped.parents], separators=(",", ":"))


def _outcome_of_skip(outcome: str, reason: str) -> str:
    """A placeholder's outcome as counted: `rows.WAITING` when its reason leaves a parent to the
    catch-up's walk (`WAITS_FOR_WALK`), else the ledger's (SKIPPED, or ALREADY_HERE)."""
    return WAITING if outcome == ledger.SKIPPED and WAITS_FOR_WALK in reason else outcome


def _write_for(tx: Conn, mapped: Mapped, values: dict[str, Any]) -> Callable[[], ledger.Written]:
    if mapped.table == "contacts":
        return lambda: crm.write_contact(tx, values, mapped.match_emails)
    if mapped.table == "companies":
        return lambda: crm.write_company(tx, values)
    if mapped.table == "users":
        return lambda: crm.write_user(tx, values)
    return lambda: crm.write(tx, mapped.table, values)


def write_mapped(
    tx: Conn, run: Run, kind: str, mapped: Mapped, found: Mapping[Pair, int],
    dry: Collection[Pair] | None = None, *, exists: Mapping[Pair, bool | None] | None = None,
    on_event: Event | None = None, held: ledger.Held | None = None, parents: PageRefs | None = None,
) -> str:
    """One row, per row: link, then write once through the ledger: imported, matched,
    already_here, updated or skipped.

    `found`: the page's resolved references (`ledger.resolve`); `dry`: a dry run's would-be
    writes (`ledger.dry_written`). `exists`: what the source answered about missing parents (the
    provider's probe); a parent it answered 404 for is dangling - the row is imported with that
    link empty and the reference recorded; one it left to the catch-up (None) keeps the row a
    placeholder saying so (`WAITS_FOR_WALK`), at the row's version. `on_event` hears `dangling`, `archived_updated` and
    `update_skipped` (a written row's newer version whose parents are not here: outcome skipped,
    the product row keeps its version; a retry's revisit of the task tries it again) (stats of
    the task). `held`: the row's ledger entry as its page read it (`ledger.held`), so a row
    already here at this version costs no write. Resolved references fill the values as plain
    data says (`rows.apply_links`). `parents`: the page's references (`PageRefs`), whose unwritten
    parents' ledger states word a placeholder's reason (`skip_reason`).
    """
    exists = exists or {}
    resolved: dict[Ref, int | None] = {}
    missing: list[Ref] = []
    dangling: list[Ref] = []
    for ref in mapped.parents:
        resolved[ref] = lookup(found, ref)
        if resolved[ref] is None:
            if exists.get((ref.parent_kind, ref.source_id)) is False:
                dangling.append(ref)
            else:
                missing.append(ref)
    pending = False
    if missing:
        # a dry run: a parent this run would itself have written counts as linked
        would_exist = dry is not None and all(any((k, ref.source_id) in dry for k in ref.kinds) for ref in missing)
        if run.dry_run and would_exist:
            pending = True  # a dry run: this run would have created the parent first
        else:
            why = not_linked(missing, exists, parents.held_as if parents else None,
                             parents.kept_apart if parents else None, parents.untaken if parents else None)
            outcome = _outcome_of_skip(ledger.skip(tx, run, kind, mapped.source_id, why, mapped.version,
                                                   parents_json(mapped, missing)), why)
            if outcome == ledger.ALREADY_HERE and held is not None and ledger.newer(mapped.version, held.version):
                # a newer version the product cannot take yet (its parent is not here): the row keeps
                # the version it has, and the sighting says skipped, not already here
                if on_event:
                    on_event("update_skipped")
                return ledger.SKIPPED
            return outcome
    for ref in mapped.links:
        resolved[ref] = lookup(found, ref)
    spec = crm.TABLES[mapped.table]
    if pending:
        return ledger.write_once(tx, run, kind, mapped.source_id, lambda: ledger.Written(spec.record_type, None))
    values = apply_links(mapped, resolved)
    refs = [ref.dangling() for ref in dangling]
    owed = owed_links(mapped, [resolved[ref] for ref in mapped.refs()], (*run.kinds, *(parents.earlier if parents else ())),
                      parents.pending if parents else ())
    kept = refs + owed if "dangling_refs" in spec.columns else refs
    if kept:
        values["dangling_refs"] = kept
    reason = dangling_reason(refs + owed)
    write = _write_for(tx, mapped, values)
    archived_before: list[bool] = []

    def update(record_id: int) -> dict[str, Any] | None:
        # a newer version at the source: the same product row, every mapped column brought up to it
        # (its dangling references too: a parent the new version points at may exist now)
        changed = {**values, "dangling_refs": kept or None} if "dangling_refs" in spec.columns else values
        before = crm.update(tx, mapped.table, record_id, changed)
        if before and "archived" in before:
            archived_before.append(True)
        return before

    outcome = ledger.write_once(tx, run, kind, mapped.source_id, write, dangling=refs + owed, reason=reason,
                                version=mapped.version, update=update, on_event=on_event, held=held)
    if outcome == ledger.ALREADY_HERE:
        if mapped.table in crm.ARCHIVE_COLUMNS and not run.dry_run:
            # another list wrote this record at a version that cannot be ordered against this one:
            # its archived flag may have moved since
            record_id = ledger.record_of(tx, run, kind, mapped.source_id)
            if record_id is not None and crm.refresh_archived(tx, mapped.table, record_id, mapped.values):
                if on_event:
                    on_event("archived_updated")
    elif outcome == ledger.UPDATED:
        if archived_before and on_event:
            on_event("archived_updated")  # the update moved the archived flag (archived or restored)
    elif refs and on_event:
        on_event("dangling")
    return outcome


# --- a page ----------------------------------------------------------------------------------


@dataclass
class PageRefs:
    """What a page's rows need from the ledger and the source, read once before its windows."""

    found: dict[Pair, int] = field(default_factory=dict)  # written references -> local ids
    dry: set[Pair] | None = None  # a dry run's would-be writes
    held: dict[str, ledger.Held | None] = field(default_factory=dict)  # the page's rows written already
    exists: dict[Pair, bool | None] = field(default_factory=dict)  # the probe's answers
    held_as: dict[Pair, str] = field(default_factory=dict)  # parents the ledger holds as failed
    kept_apart: dict[str, int] = field(default_factory=dict)  # kind -> rows kept without a readable id (`skip_reason`)
    untaken: dict[str, tuple[str, ...]] = field(default_factory=dict)  # `untaken_lists` (`skip_reason`)
    earlier: frozenset[str] = frozenset()  # link kinds an earlier run took: not owed (`taken_before`)
    pending: frozenset[Pair] = frozenset()  # soft links' parents the run takes, not written: owed to its end (`pending_links`)


def resolve_page(ctx: TaskContext, kind: str, prepared: Sequence[Prepared], probe: Probe | None = None) -> PageRefs:
    """Resolve a page's references, its rows' ledger entries and (a dry run) its would-be writes
    in one connection; then, with that connection back in the pool, ask `probe` about missing
    parents the ledger knows nothing about. With a probe, a missing parent the ledger holds as a
    placeholder left to the catch-up's walk (`ledger.references`: WAITING) leaves its child to that
    walk too (answered None, no request): the walk writes parents before children."""
    mapped = [p["mapped"] for p in prepared]
    refs = ledger_refs(mapped)
    unknown: list[Pair] = []
    with ctx.db.connection() as conn:
        found, known = ledger.references(conn, ctx.run, refs)
        dry = ledger.dry_written(conn, ctx.run, refs) if ctx.run.dry_run else None
        held = ledger.held(conn, ctx.run, kind, [p["id"] for p in prepared if p["mapped"] is not None])
        earlier = taken_before(conn, ctx.run, mapped)
        if probe is not None:
            unknown = _unknown(mapped, found, dry, known)
    # the connection is back in the pool: the source is asked holding nothing of the database
    exists: dict[Pair, bool | None] = dict(probe(unknown)) if unknown and probe is not None else {}
    if probe is not None:
        exists.update((p, None) for p in missing_parents(mapped, found, dry) if known.get(p) == WAITING)
    return PageRefs(found, dry, held, exists, held_as(known), _kept_apart(ctx, exists),
                    untaken_lists(ctx.lists, ctx.run.kinds), earlier, pending_links(mapped, found, ctx.run.kinds))


def held_as(known: Mapping[Pair, str]) -> dict[Pair, str]:
    """The references `ledger.references` found held as failed: a child's reason names that state
    (`skip_reason.HELD_AS`)."""
    return {p: action for p, action in known.items() if action == ledger.FAILED}


def _kept_apart(ctx: TaskContext, exists: Mapping[Pair, bool | None]) -> dict[str, int]:
    """Per kind of a parent the probe found existing though unwritten: how many of the tenant's
    rows of it were kept without a readable id (`skip_reason`: perhaps the parent itself)."""
    kinds = sorted({kind for (kind, _), there in exists.items() if there is True})
    if not kinds:
        return {}
    with ctx.db.connection() as conn:
        counts = {k: len(tenant_unreadable(conn, ctx.run.tenant_id, ctx.run.source, k)) for k in kinds}
    return {k: n for k, n in counts.items() if n}


def unknown_parents(ctx: TaskContext, prepared: Sequence[Prepared]) -> list[Pair]:
    """The parents of a mapped page (`map_page`) that `resolve_page` would ask its probe about now:
    not written (nor would-be written in a dry run) and unknown to the ledger. For a source that
    asks about a page's parents before the page's task runs; holds a connection only while it reads."""
    mapped = [p["mapped"] for p in prepared]
    refs = ledger_refs(mapped)
    with ctx.db.connection() as conn:
        found, known = ledger.references(conn, ctx.run, refs)
        dry = ledger.dry_written(conn, ctx.run, refs) if ctx.run.dry_run else None
        return _unknown(mapped, found, dry, known)


def _unknown(mapped: Sequence[Mapped | None], found: Mapping[Pair, int], dry: Collection[Pair] | None,
             known: Mapping[Pair, str]) -> list[Pair]:
    """The missing parents of `mapped` (not in `found`, nor in a dry run's `dry`) that the ledger
    knows nothing about (not in `known`: the entries of the page's references, read with `found`
    by `ledger.references`), sorted: what a probe is asked."""
    missing = missing_parents(mapped, found, dry)
    return sorted(p for p in missing if p not in known)


def map_page(
    rows: Sequence[Any], mapper: Mapper, *, start: int = 0,
    malformed: type[BaseException] | tuple[type[BaseException], ...] = MalformedRow,
    raw_id: Callable[[Any], str | None] = row_id, raw_key: Callable[[Any], str] = unreadable_key,
) -> list[Prepared]:
    """A page in the engine's row shape (`Prepared.of` per row), for a source to apply before it
    hands the page over (`write_mapped_page`). Rows before `start` (a window committed them:
    the task's offset) are not mapped again and stand as empty rows."""
    return [Prepared.of(row, mapper, malformed=malformed, raw_id=raw_id, raw_key=raw_key) if i >= start
            else Prepared(id=None, mapped=None, error=None) for i, row in enumerate(rows)]


def write_mapped_page(
    ctx: TaskContext, prepared: Sequence[Prepared], *, kind: str | None = None, probe: Probe | None = None,
    optimistic: bool = True, resume_from: int | None = None, offset_after: Callable[[int], int] | None = None,
    fail_if_all_failed: bool = True, refs: PageRefs | None = None,
) -> PageResult:
    """Write a mapped page (`map_page`): resolve its references in one query, ask `probe` about
    missing parents the ledger does not know (once per page), write it in the engine's windows.
    `refs`: the page's references read already (`sighting.decide_page`): not read again, no probe.

    `kind`: the ledger kind (default: the task's kind). `optimistic`: plain rows in set-based
    statements per window (False: every row through the per-row savepoints, the baseline). The
    engine calls no source code per row: references, key rules and versions are plain data.
    `resume_from`, `offset_after`, `fail_if_all_failed`: as `Windows.write_rows` (a task whose
    offset counts something else than the page's rows - a fan-out's records - says where the page
    starts and what each window checkpoints)."""
    kind = kind or ctx.task.kind
    start = ctx.offset if resume_from is None else resume_from
    page = refs if refs is not None else resolve_page(ctx, kind, prepared[start:], probe)

    def writer(tx: Conn, row: Prepared) -> str:
        if row["error"] is not None:
            raise row["error"]
        return write_mapped(tx, ctx.run, kind, row["mapped"], page.found, page.dry, exists=page.exists,
                            on_event=ctx.stats.bump, held=page.held.get(row["id"]), parents=page)

    batch = window_batch(ctx, kind, page) if optimistic and not ctx.run.dry_run else None
    return ctx.write_rows(list(prepared), writer, kind=kind, batch=batch, resume_from=resume_from,
                          offset_after=offset_after, fail_if_all_failed=fail_if_all_failed)


def write_page(
    ctx: TaskContext, rows: Sequence[Any], mapper: Mapper, *, kind: str | None = None, probe: Probe | None = None,
    malformed: type[BaseException] | tuple[type[BaseException], ...] = MalformedRow,
    raw_id: Callable[[Any], str | None] = row_id, optimistic: bool = True,
    raw_key: Callable[[Any], str] = unreadable_key,
) -> PageResult:
    """Map a page (`map_page`) and write it (`write_mapped_page`): `malformed`, `raw_id`,
    `raw_key`: which mapper errors mean a malformed row, the id it is recorded under, the key of
    one whose id is unreadable (`rows.unreadable_key`)."""
    prepared = map_page(rows, mapper, start=ctx.offset, malformed=malformed, raw_id=raw_id, raw_key=raw_key)
    return write_mapped_page(ctx, prepared, kind=kind, probe=probe, optimistic=optimistic)


# --- optimistic windows ----------------------------------------------------------------------


@dataclass
class _Plain:
    pos: int
    mapped: Mapped
    values: dict[str, Any]
    refs: list[dict[str, str]]
    written: ledger.Written | None = None


# A window row's mapping and the reason it cannot be mapped (`Prepared`'s keys by default).
Parts = Callable[[Any], "tuple[Mapped | None, BaseException | None]"]


def _prepared_parts(row: Any) -> tuple[Mapped | None, BaseException | None]:
    return row["mapped"], row["error"]


def _plain(row: Any, page: PageRefs, parts: Parts = _prepared_parts, taken: Collection[str] = ()) -> _Plain | None:
    """The row as the set-based part writes it, or None when it goes per row."""
    m, error = parts(row)
    if m is None or error is not None or m.source_id in page.held or m.table not in crm.TABLES:
        return None
    found = page.found
    ids: list[int | None] = []
    dangling: list[Ref] = []
    for ref in m.parents:
        record_id = lookup(found, ref)
        if record_id is None:
            if page.exists.get((ref.parent_kind, ref.source_id)) is not False:
                return None  # a placeholder (or a dry run's pending row): per row
            dangling.append(ref)
        ids.append(record_id)
    for ref in m.links:
        ids.append(lookup(found, ref))
    values = link_values(m, ids)
    if values.get("source_id") != m.source_id:
        return None  # the set-based insert finds its rows by source id
    refs = [ref.dangling() for ref in dangling]
    owed = owed_links(m, ids, taken, page.pending)
    kept = refs + owed if "dangling_refs" in crm.TABLES[m.table].columns else refs
    if kept:
        values["dangling_refs"] = kept
    return _Plain(0, m, values, refs + owed)


def _skipped(row: Any, page: PageRefs, parts: Parts = _prepared_parts) -> tuple[str, str] | None:
    """The reason the set-based part skips the row (a parent neither written nor gone at the
    source: `write_mapped`'s placeholder) and its parents (`parents_json`), or None when it does
    not. A row the page found written (`page.held`: its newer version may be an `update_skipped`) goes per row."""
    m, error = parts(row)
    if m is None or error is not None or m.source_id in page.held:
        return None
    missing = [ref for ref in m.parents
               if lookup(page.found, ref) is None and page.exists.get((ref.parent_kind, ref.source_id)) is not False]
    return (not_linked(missing, page.exists, page.held_as, page.kept_apart, page.untaken),
            parents_json(m, missing)) if missing else None


def _same_columns(spec: crm.Table, rows: list[_Plain]) -> list[tuple[_Plain, dict[str, Any]]]:
    """The rows' values over one column set where that writes the same row: a row without a
    reference lacks its link column (and one without dangling parents `dangling_refs`), which
    without a value is NULL (no default) - the same as an explicit None. Other differences keep
    a row's own columns (one INSERT per column set)."""
    keys = [tuple(p.values) for p in rows]
    shapes = dict.fromkeys(keys)  # each column set in its order, as the rows first have it
    if len(shapes) <= 1:
        return [(p, p.values) for p in rows]  # one column set, in one order: every row as it is
    union: dict[str, None] = {}
    for shape in shapes:
        union.update(dict.fromkeys(shape))
    columns = tuple(union)
    # the columns some row lacks: fillable when they are a reference's column in some row
    unsure = set(columns) - set.intersection(*[set(shape) for shape in shapes])
    unsure.discard("dangling_refs")
    fillable = {"dangling_refs"}
    for p in rows:
        if not unsure:
            break
        for ref in p.mapped.refs():
            if ref.column in unsure:
                unsure.discard(ref.column)
                fillable.add(ref.column)
    fillable &= spec.columns
    full_of = {shape: shape == columns or (union.keys() - shape) <= fillable for shape in shapes}
    out = []
    for p, shape in zip(rows, keys):
        if shape == columns or not full_of[shape]:
            out.append((p, p.values))  # every column in the union's order, or a column set of its own
        else:
            full = dict.fromkeys(columns)  # (in the union's order: one statement for every such row)
            full.update(p.values)
            out.append((p, full))
    return out


def window_batch(ctx: TaskContext, kind: str, page: PageRefs,
                 parts: Parts = _prepared_parts) -> Callable[[Conn, list[tuple[int, Any]]], dict[int, str]]:
    """The optimistic windows' set-based part (`TaskContext.write_rows`'s `batch`) for rows whose
    references `page` resolved: the module's docstring says which rows it writes and how. `parts`
    reads a row's `Mapped` and mapping error (default: a `Prepared` row's); a row `page.held`
    names (written already: its sighting may update it) goes per row. Not for a dry run. It
    carries `leaves(rows)`, the rows it would leave per row for certain (`window.Batch`)."""
    run = ctx.run

    def batch(tx: Conn, todo: list[tuple[int, Any]]) -> dict[int, str]:
        counts = Counter(row["id"] for _, row in todo)
        taken = frozenset(run.kinds) | page.earlier  # (`Run.kinds` builds its tuple at every call)
        plain: list[_Plain] = []
        skips: dict[str, tuple[int, str, str | None, str]] = {}  # source id -> (position, reason, version, parents)
        for pos, row in todo:
            if row["id"] is None or counts[row["id"]] > 1:
                continue  # a duplicate id in the window: per row, in order
            p = _plain(row, page, parts, taken)
            if p is not None:
                p.pos = pos
                plain.append(p)
                continue
            skipped = _skipped(row, page, parts)
            if skipped is not None:
                m = parts(row)[0]
                skips[m.source_id] = (pos, skipped[0], m.version, skipped[1])  # type: ignore[union-attr]
        out: dict[int, str] = {}
        if skips:
            # the window's placeholders in one statement (a savepoint and a statement a row)
            noted = ledger.skip_window(tx, run, kind, {sid: s[1] for sid, s in skips.items()},
                                       {sid: s[2] for sid, s in skips.items()}, {sid: s[3] for sid, s in skips.items()})
            for sid, (pos, reason, _, _) in skips.items():
                out[pos] = _outcome_of_skip(noted[sid], reason)
        if not plain:
            return out
        by_table: dict[str, list[_Plain]] = {}
        groups: list[ledger.NewRows] = []
        for p in plain:
            by_table.setdefault(p.mapped.table, []).append(p)
        for table, group in by_table.items():
            spec = crm.TABLES[table]
            to_insert = group
            if table in crm.MATCHED_TABLES:
                matched = crm.match_rows(tx, table, [(p.pos, p.values, p.mapped.match_emails) for p in group])
                for p in group:
                    if p.pos in matched:
                        p.written = ledger.Written(spec.record_type, matched[p.pos], matched=True)
                to_insert = [p for p in group if p.written is None]
            columns: dict[tuple[str, ...], list[tuple[_Plain, dict[str, Any]]]] = {}
            for p, values in _same_columns(spec, to_insert):
                columns.setdefault(tuple(values), []).append((p, values))
            for pairs in columns.values():
                same = [p for p, _ in pairs]
                if ROWS == "claimed":
                    groups.append(crm.new_rows(table, [v for _, v in pairs]))
                    new = ledger.Written(spec.record_type, None)  # each row's id: its claim's (one, frozen)
                    for p in same:
                        p.written = new
                    continue
                ids = (crm.copy_rows if ROWS == "copy" else crm.insert_rows)(tx, table, [v for _, v in pairs])
                for p in same:
                    p.written = ledger.Written(spec.record_type, ids[p.mapped.source_id])
        claims = {p.mapped.source_id: ledger.Claim(p.mapped.source_id, p.written, p.mapped.version,
                                                   dangling_reason(p.refs), p.refs or None)
                  for p in plain if p.written is not None}
        if groups:
            # one statement per table and column set: its new rows' claims, the first also the matches'
            won: set[str] = set()
            rest = {sid for sid, c in claims.items() if c.written.record_id is not None}
            for new in groups:
                mine = [claims[str(r["source_id"])] for r in new.rows] + [claims[sid] for sid in sorted(rest)]
                rest = set()
                won |= ledger.claim_window(tx, run, kind, mine, new)
        else:
            won = ledger.claim_window(tx, run, kind, list(claims.values()))
        lost: dict[str, list[int]] = {}
        for p in plain:
            if (p.mapped.source_id not in won and p.written is not None and not p.written.matched
                    and p.written.record_id is not None):
                lost.setdefault(p.mapped.table, []).append(p.written.record_id)
        for table, ids in lost.items():
            # someone else holds these rows: our writes go, and each row is seen again per row
            crm.delete_rows(tx, table, ids)
        events: list[str] = []
        for p in plain:
            if p.mapped.source_id in won:
                out[p.pos] = ledger.MATCHED if p.written and p.written.matched else ledger.IMPORTED
                if any(not r.get("owed") for r in p.refs):
                    events.append("dangling")
        for e in events:
            ctx.stats.bump(e)
        return out

    def leaves(todo: list[tuple[int, Any]]) -> int:
        # rows `batch` leaves per row for certain: written before (`page.held`: a catch-up's
        # updates), or an id twice (a malformed row is left to the statement: it is rare, and a
        # window of many is the database's refusal to find, as before)
        counts = Counter(row["id"] for _, row in todo)
        n = 0
        for _, row in todo:
            if row["id"] is not None and counts[row["id"]] > 1:
                n += 1
                continue
            m, error = parts(row)
            if m is not None and error is None and m.source_id in page.held:
                n += 1
        return n

    batch.leaves = leaves  # type: ignore[attr-defined]  # asked before a large window (TaskContext)
    return batch
