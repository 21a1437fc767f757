"""Catch-up pages held compact while they wait for their walker.

The catch-up reads every list of its walk at once (`inventory.ReadAhead`) while its chain writes
them one after another, parents first (`catchup.run_page`). Under the source's latency the chain's
wait is a list's whole walk when the read-ahead holds only a few pages of each list: on the seed
customer (six kinds, realistic latency) the chain took 271 s of a 394 s run, each list walked in
turn at ~0.4 s a page. Most of a catch-up's rows did not change since the run wrote them, and for
those the walker needs only what the inventory records and compares: the id and the version. So
the reading thread compares each page with the ledger as it arrives (`inventory_ledger.unwritten`,
read only) and keeps the rows the ledger already holds at their version as `{id, version}` alone
(`COMPACT` marks them): a page of 500 unchanged rows ~150 KB instead of ~1.5 MB, and the read-ahead
can hold `AHEAD` pages of a list, a whole list of a large account, so every list is walked at once.

The walker compares again when it takes the page (`inventory_ledger.to_write`, which also records
the ids). A row held compact that must be written by then (its ledger entry changed between the two
reads: nothing of the catch-up itself does that, but nothing forbids it) is not written from the
compact copy: it is asked by id (`full_rows`, 1-2 tokens) and written as served; one answering
404 is left to the source's next listing (it was served by this walk, so the kind's deletes task does
not ask it).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine_core import inventory_ledger
from engine_core.context import TaskContext
from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.inventory import Step, list_step, row_id, version_of
from engine_core.providers.pipedrive.kinds import SINGLE_PATHS, VERSION_FIELD, ledger_kind
from engine_core.providers.pipedrive.meter import Meter

COMPACT = "_compact"  # the key marking a row held as {id, version} only
# Pages of one list a catch-up's read-ahead holds compact before its walker takes them: 250 pages
# of 500 unchanged rows (~35 MB) - the seed customer's lists whole (persons 220 pages, activities
# 201), read while the chain writes the lists before them. At 100 the last level's lists (taken only
# once the chain is done) stopped at 100 pages and their walk went on after the chain: 40 s more
# of the seed customer's catch-up (realistic latency).
AHEAD = 250


def compacting(ctx: TaskContext, read: Callable[..., Step] = list_step) -> Callable[..., Step]:
    """A `ReadAhead` step (`list_step`'s arguments) that reads a page by `read` and holds the rows
    the run's ledger holds at their version compact (module docstring). Reads the ledger once a page."""

    def step(meter: Any, kind: str, at: Any, since: str | None) -> Step:
        return compact(ctx, kind, read(meter, kind, at, since))

    return step


def compact(ctx: TaskContext, kind: str, step: Step) -> Step:
    """`step` with the rows the ledger holds at their version (`inventory_ledger.unwritten` says no
    write) replaced by `{id, version, COMPACT}`; rows without a readable id, and every row of a kind
    the source cannot be asked about by id, stay whole."""
    lk = ledger_kind(kind)
    if lk not in SINGLE_PATHS or not step.rows:
        return step
    listed = [(row_id(r), r) for r in step.rows]
    pairs = [(sid, version_of(kind, r)) for sid, r in listed if sid is not None]
    with ctx.db.connection() as conn:
        wanted = inventory_ledger.unwritten(conn, ctx.run, lk, pairs)
    field = VERSION_FIELD.get(kind, "update_time")
    rows = tuple(r if sid is None or sid in wanted else {"id": r["id"], field: version_of(kind, r), COMPACT: True}
                 for sid, r in listed)
    return Step(rows, step.after)


def full_rows(ctx: TaskContext, client: Any, kind: str, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` to write, whole: a row held compact is asked by id (`SINGLE_PATHS`, one request each)
    and replaced by what the source serves now; one answering 404 is dropped (module docstring).
    Raises as the client does (the page is retried and compared again)."""
    if not any(r.get(COMPACT) for r in rows):
        return list(rows)
    meter = Meter(client, {}, ctx.cancel)
    path = SINGLE_PATHS[ledger_kind(kind)]
    out: list[dict[str, Any]] = []
    for row in rows:
        if not row.get(COMPACT):
            out.append(row)
            continue
        try:
            body = meter.get(path.format(row_id(row)))
        except NotFound:
            continue
        data = body.get("data")
        if isinstance(data, dict):
            out.append(data)
    return out
