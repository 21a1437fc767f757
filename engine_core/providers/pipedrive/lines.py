"""Deal products (a deal's product lines) as a kind of the run: `/api/v2/deals/products?deal_ids=`,
up to 100 deals a call, cursor paging, into crm.deal_products through the ledger.

The deals are the ones the ledger holds: the phase runs after the deals phase, and its discovery
task (`deal_products:discover`) reads the tenant's written deals (a dry run: the deals this run
would have written, `migration_dry_records`), in id order, and seeds tasks of `DEALS_PER_TASK`
deals (`{"deals": [ids]}`, keyed by their place in that order, so a retried discovery finds its
tasks already there). A task asks for its deals' lines `IDS_PER_CALL` deals at a time; its offset
is the index of the first deal whose lines are not yet written (as the email phase's tasks), so
a task resumed after a crash asks only for the deals it had not finished. A chunk's lines are
written in the engine's windows, each window checkpointing the chunk's first deal, and the
chunk's last commit moves the offset past it.

Changes and removals through the same versioned ledger: a line served again at a newer
`update_time` is updated in place (`ledger.write_once`); a line the ledger holds for a deal whose
lines were just listed in full, and that the listing no longer serves, was removed from its deal
at the source and is marked deleted there (`marks.mark_gone`, in the chunk's last
transaction). The catch-up (`catchup.run_page`) lists again the lines of the deals it wrote (new,
or at a newer version: Pipedrive moves a deal's `update_time` when its products change) in tasks
`catchup:lines:...` of up to `IDS_PER_CALL` deals, through the same code, so a sync finds a line
added, changed or removed since; a deal the catch-up finds deleted takes its lines with it
(`mark_lines_of_deleted_deals`).

A deal the token may not read (private to another user) is left out of the batched answer by the
source itself: none of its lines is listed, and lines the product holds of it from an earlier run
are marked removed - the batched list cannot tell a private deal's lines from none (only
`/api/v2/deals/{id}/products` could, at a call per deal).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine_core import holdings, write
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.marks import mark_gone
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.pipedrive import kinds
from engine_core.providers.pipedrive.mapping import MalformedRow, sound_id, unreadable_key
from engine_core.providers.pipedrive.writers import Mapper, probe_of

KIND = "deal_products"
PATH = kinds.BY_NAME[KIND].path
IDS_PER_CALL = 100  # the spec's cap on `deal_ids` (the sandbox answers 400 beyond it)
DEALS_PER_TASK = 500  # five calls a task: a task's claim and finish cost less than its listing
CATCHUP_PREFIX = "catchup:lines"


def held_deals(conn: Any, run: Run) -> list[int]:
    """The source ids of the deals the tenant's ledger holds written and not deleted at the source
    (a dry run: the deals this run would have written), as integers in ascending order."""
    return holdings.written_ids(conn, run, "deals")


def seeds() -> list[Successor]:
    """The phase's first task: the discovery."""
    return [Successor(f"{KIND}:discover", {"discover": True})]


def discover(ctx: TaskContext) -> TaskOutcome:
    """Tasks of `DEALS_PER_TASK` of the deals the ledger holds (module docstring); no request."""
    with ctx.db.connection() as conn:
        deals = held_deals(conn, ctx.run)
    ctx.stats.values["deals_held"] = len(deals)  # set, not added: a retried discovery reads again
    return TaskOutcome(tuple(Successor(f"{KIND}:d{i}", {"deals": deals[i : i + DEALS_PER_TASK]})
                             for i in range(0, len(deals), DEALS_PER_TASK)))


def catchup_tasks(list_kind: str, page: int, deals: Sequence[int]) -> list[Successor]:
    """The catch-up's line tasks for the deals (source ids) one of its deal pages wrote: one task
    per `IDS_PER_CALL` deals, keyed by the page, so a page listed again finds them there."""
    ids = sorted({int(d) for d in deals})
    return [Successor(f"{CATCHUP_PREFIX}:{list_kind}:p{page}:c{j // IDS_PER_CALL}", {"lines": ids[j : j + IDS_PER_CALL]})
            for j in range(0, len(ids), IDS_PER_CALL)]


def list_lines(client: Any, deals: Sequence[int], cancel: Any = None) -> list[dict[str, Any]]:
    """Every line of these deals (at most `IDS_PER_CALL`), following `next_cursor`: one request a
    page of 500 lines. `deal_ids` goes repeated, as the spec's array parameter. Raises as the
    client does."""
    if not 0 < len(deals) <= IDS_PER_CALL:
        raise ValueError(f"a deal products call takes 1 to {IDS_PER_CALL} deals, got {len(deals)}")
    params = {"deal_ids": [int(d) for d in deals]}
    rows: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = client.list_v2(PATH, params, cursor=cursor, limit=kinds.PAGE, cancel=cancel)
        rows.extend(page.rows)
        if not page.more or not page.next_cursor:
            return rows
        cursor = page.next_cursor


def held_lines(conn: Any, run: Run, deals: Sequence[int]) -> dict[str, str]:
    """The live lines (written, not deleted at the source) the ledger holds for these deals:
    line source id -> its deal's source id (`holdings.held_under`)."""
    return holdings.held_under(conn, run, KIND, "deal_products", "deal_id", "deals", deals)


def removed(held: dict[str, str], rows: Sequence[Any]) -> list[str]:
    """The held lines (`held_lines`) the listing of their deals did not serve: removed from their
    deal at the source."""
    served = {sid for sid in (sound_id(r) for r in rows) if sid is not None}
    return sorted(sid for sid in held if sid not in served)


def mark_lines_of_deleted_deals(tx: Conn, run: Run, deals: Sequence[object]) -> int:
    """Before the catch-up marks deals deleted at the source (404): their lines, which the source
    no longer lists either, marked deleted too (`marks.mark_gone`). Returns how many."""
    ids = [int(str(d)) for d in deals if str(d).isdigit()]
    held = held_lines(tx, run, ids) if ids else {}
    return mark_gone(tx, run, KIND, sorted(held))


def write_chunk(ctx: TaskContext, client: Any, mapper: Mapper, rows: Sequence[Any], deals: Sequence[int],
                at: int, after: int) -> None:
    """Write one chunk's lines in the engine's windows, each window checkpointing `at` (the chunk's
    first deal: a crash lists the chunk again, and its written lines are already here), then mark
    the held lines it no longer serves deleted at the source and checkpoint `after`, in one
    transaction."""
    prepared = write.map_page(rows, mapper, malformed=MalformedRow, raw_id=sound_id, raw_key=unreadable_key)
    if prepared:
        page = write.resolve_page(ctx, KIND, prepared, probe_of(ctx, client))

        def writer(tx: Conn, row: Any) -> str:
            if row["error"] is not None:
                raise row["error"]
            return write.write_mapped(tx, ctx.run, KIND, row["mapped"], page.found, page.dry, exists=page.exists,
                                      on_event=ctx.stats.bump, held=page.held.get(row["id"]), parents=page)

        batch = write.window_batch(ctx, KIND, page) if not ctx.run.dry_run else None
        ctx.write_rows(list(prepared), writer, kind=KIND, resume_from=0, offset_after=lambda _: at,
                       fail_if_all_failed=False, batch=batch)
    with ctx.db.transaction() as tx:
        gone = removed(held_lines(tx, ctx.run, deals), rows)
        if gone:
            marked = mark_gone(tx, ctx.run, KIND, gone)
            ctx.stats.bump("deleted_at_source", marked)
        ctx.stats.bump("deals", after - at)
        ctx.checkpoint(tx, after)


def run_task(ctx: TaskContext, client: Any, mapper: Mapper, deals: Sequence[int]) -> TaskOutcome:
    """A task's deals from its offset on, `IDS_PER_CALL` a call (module docstring). A stop is
    honoured between chunks. Raises as the client does (the task is retried from its offset)."""
    ids = [int(d) for d in deals]
    at = min(ctx.offset, len(ids))
    while at < len(ids):
        ctx.stop_point()
        chunk = ids[at : at + IDS_PER_CALL]
        rows = list_lines(client, chunk, ctx.cancel)
        ctx.stats.bump("lines_listed", len(rows))
        write_chunk(ctx, client, mapper, rows, chunk, at, at + len(chunk))
        at += len(chunk)
    return TaskOutcome()
