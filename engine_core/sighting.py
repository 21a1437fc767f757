"""Decide before fetch: a listed page judged against the ledger before anything is fetched for its
rows, for a source that pays a request per row to complete it (Pipedrive's mail: a body a message).

    list -> map -> decide (one connection: the rows' entries, the references) -> fetch what is
        worth it -> write (`write.write_mapped_page` with the page's references, not read again)

A row the ledger holds at the same version costs no request and no write (`seen_before`); a row
that goes to a window but cannot be written as served (a parent not here: a placeholder, or a dry
run) goes without its completion.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_core import ledger
from engine_core.context import TaskContext
from engine_core.models import Run
from engine_core.skip_reason import untaken_lists
from engine_core.taken_before import taken_before
from engine_core.pending_links import pending_links
from engine_core.write import PageRefs, Pair, Prepared, held_as, ledger_refs, missing_parents

RECORDED = "recorded"  # `seen_before`: this run recorded the row in a window that committed


def seen_before(run: Run, state: Mapping[str, Any] | None, held_version: str | None, version: str | None, *,
                revisit: bool = False, retake: bool = False) -> str | None:
    """A listed row the ledger already has, judged before anything is fetched for it: what it needs.

    `state`: its ledger entry (`migration_id`, `action`; None: no entry); `held_version`: the
    version the entry holds; `version`: the sighting's. Returns None - the row goes to a window: no
    entry, an entry not written (a placeholder, a failure: unless it is this run's and not
    `retake`n), or a newer version than the one written; `RECORDED` - this run recorded it in a
    window that committed, counts and all (not on a `revisit`): neither counted nor written again;
    else the outcome it counts without a write: already_here (another run wrote it), imported or
    matched (this run wrote it: a revisit's fresh counts). Unlike `write_once`'s rule, a version
    written before versions (None) is not superseded here (that would cost every such row's
    completion again on every run), and a row marked deleted at the source is not restored at the
    same version."""
    if state is None or (held_version is not None and ledger.newer(version, held_version)):
        return None
    ours, written = state["migration_id"] == run.id, state["action"] in ledger.WRITTEN_ACTIONS
    if ours and not revisit and (written or not retake):
        return RECORDED
    if not written:
        return None
    return ledger.ALREADY_HERE if not ours else (ledger.IMPORTED if state["action"] == "created" else ledger.MATCHED)


@dataclass
class Decided:
    """A listed page judged before its rows are completed (`decide_page`), per row in order:
    `outcomes` - `seen_before`'s answer (None: the row goes to a window); `fetch` - the row goes to
    a window and will be written as served (mapped, every parent written, not a dry run): its
    completion is worth a request. `refs`: the page's references (a dry run's would-be writes too)
    and, in `held`, the written entries of the rows that go to a window, for
    `write.write_mapped_page(refs=...)`."""

    outcomes: list[str | None]
    fetch: list[bool]
    refs: PageRefs


def decide_page(ctx: TaskContext, kind: str, prepared: Sequence[Prepared], *, retake: bool = False) -> Decided:
    """Judge a mapped page (`write.map_page` rows) of ledger `kind` before anything is fetched for
    its rows: their ledger entries (one query), their references and, in a dry run, the run's
    would-be writes, in one connection. `retake`: this run's own placeholders go to a window again
    (a catch-up writing what the run skipped); a task's `revisit` counts what this run recorded."""
    run = ctx.run
    mapped = [p["mapped"] for p in prepared]
    refs = ledger_refs(mapped)
    with ctx.db.connection() as conn:
        entries = ledger.entries(conn, run, kind, [p["id"] for p in prepared])
        found, known = ledger.references(conn, run, refs)
        dry = ledger.dry_written(conn, run, refs) if run.dry_run else None
        earlier = taken_before(conn, run, mapped)
    # a parent left to the catch-up's walk leaves its rows to it too (`write.resolve_page`)
    waiting: dict[Pair, bool | None] = {p: None for p in missing_parents(mapped, found, dry) if known.get(p) == ledger.WAITING}
    outcomes: list[str | None] = []
    fetch: list[bool] = []
    held: dict[str, ledger.Held | None] = {}
    for p, m in zip(prepared, mapped):
        entry = entries.get(p["id"]) if p["id"] is not None else None
        outcome = seen_before(run, entry, entry["source_version"] if entry else None,
                              m.version if m is not None else None, revisit=ctx.revisit, retake=retake)
        outcomes.append(outcome)
        fetch.append(outcome is None and m is not None and not run.dry_run and not missing_parents([m], found, None))
        if outcome is None and entry is not None and entry["action"] in ledger.WRITTEN_ACTIONS:
            held[p["id"]] = ledger.Held(entry["action"], entry["source_version"], entry["deleted_at_source"])
    return Decided(outcomes, fetch, PageRefs(found, dry, held, waiting, held_as(known),
                                             untaken=untaken_lists(ctx.lists, run.kinds), earlier=earlier,
                                             pending=pending_links(mapped, found, run.kinds)))
