"""Field definitions, written by the engine from the rows a source yields.

A source lists its custom field definitions and hands them over normalised: one dict a definition
with `id` ("<entity>:<field_key>") and the `DEFINITION_COLUMNS`. The engine keeps them in the
product (crm.custom_field_definitions), refreshed in place every run, each claimed once in the
ledger under kind `fields`. A definition has no update time: its version is its content's hash
(`rows.content_version`), so a renamed field or a relabelled option counts `updated`, with the
previous values in the ledger's history - a run or a sync notices field changes although no
record's update time moved, and the product reads the new names at once (records keep keys and
option ids only: crm.custom_field_values).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_core import ledger
from engine_core.context import TaskContext
from engine_core.db import Conn, Database
from engine_core.models import Run
from engine_core.rows import content_version
from engine_core.target import crm
from engine_core.window import PageResult

KIND = "fields"
DEFINITION_COLUMNS = ("entity", "field_key", "name", "field_type", "options", "subfields", "is_custom", "position")


def write_definitions(ctx: TaskContext, definitions: Sequence[dict[str, Any]], *, complete: bool = False) -> PageResult:
    """Store the run's field definitions (module docstring) in the task's windows; returns the
    windows' result. `complete`: `definitions` is the source's whole listing, so a stored
    definition it no longer has is marked deleted at the source (`mark_deleted_definitions`, with
    the checkpoint and the count `fields_deleted_at_source`); one listed again is restored."""

    def writer(tx: Conn, d: dict[str, Any]) -> str:
        values = {k: d[k] for k in DEFINITION_COLUMNS}
        # The refresh happens outside the claim's savepoint: a field already here still gets
        # its current name and option labels. What it replaced is kept for the history.
        old = crm.field_definition(tx, ctx.run.tenant_id, ctx.run.source, d["entity"], d["field_key"])
        def_id = crm.upsert_field_definition(tx, {"tenant_id": ctx.run.tenant_id, "source": ctx.run.source, **values})
        before = {k: old[k] for k in DEFINITION_COLUMNS if old is not None and old[k] != values[k]}
        return ledger.write_once(tx, ctx.run, KIND, d["id"], lambda: ledger.Written("crm.custom_field_definitions", def_id),
                                 version=content_version(values), update=lambda _record_id: before,
                                 on_event=ctx.stats.bump)

    result = ctx.write_rows(list(definitions), writer, kind=KIND)
    if complete and not ctx.run.dry_run:
        counted = ctx.stats.copy()
        try:
            with ctx.db.transaction() as tx:
                gone = mark_deleted_definitions(tx, ctx.run, {d["id"] for d in definitions})
                if gone:  # counted with the marks it counts
                    ctx.stats.bump("fields_deleted_at_source", gone)
                    ctx.checkpoint(tx, len(definitions))
        except BaseException:
            ctx.stats = counted
            raise
        if gone:
            ctx.log.note("warning", KIND, f"{gone} field definition(s) no longer listed by the source: marked deleted "
                         "at the source, their values kept on the records (crm.custom_field_values.field_deleted_at_source)")
    return result


def mark_deleted_definitions(tx: Conn, run: Run, listed: set[str]) -> int:
    """Mark the tenant's stored field definitions the source's listing no longer has (`listed`:
    ids "<entity>:<field_key>") deleted at the source, through the ledger (`ledger.mark_deleted`:
    the definition's `deleted_at_source` and a `deleted` history row). Their values stay on the
    records, flagged by the view. Returns how many were marked now."""
    stored = tx.sql("SELECT entity, field_key FROM crm.custom_field_definitions"
                    " WHERE tenant_id = %(t)s AND source = %(s)s AND deleted_at_source IS NULL",
                    {"t": run.tenant_id, "s": run.source})
    gone = [f"{r['entity']}:{r['field_key']}" for r in stored if f"{r['entity']}:{r['field_key']}" not in listed]
    return ledger.mark_deleted(tx, run, KIND, gone)


def stored_definitions(conn: Conn | Database, run: Run) -> list[dict[str, Any]]:
    """The run's field definitions as the product keeps them (crm.custom_field_definitions),
    ordered by entity and position: the rows `DEFINITION_COLUMNS` name."""
    return crm.field_definitions(conn, run.tenant_id, run.source)  # type: ignore[arg-type]
