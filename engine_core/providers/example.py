"""An in-process example provider: rows generated in memory, failures you can inject.

It exercises every engine path without a network: striped page walks, references resolved
through the ledger, skips, malformed rows, failing and transient pages. Options (run options):
  counts          {kind: rows}            default 60 per kind
  page_size       rows per page           default 500 (the source's maximum)
  malformed       {kind: [ids]}           rows that fail alone
  dangling        {kind: [ids]}           rows whose parent does not exist (skipped)
  malformed rows fail alone with "ValueError: <kind> row has a non-text name"
  fail_pages      {kind: [starts]}        pages whose task fails
  transient_pages {kind: {start: times}}  pages that raise a transient error the first N attempts
  row_delay       seconds per row write   (to give tests a mid-page moment)
  version         source version of every row: a run with another version sees every
                  row changed (its name carries the version) and updates it in place

Its rows go through the engine's write path (engine_core/write.py) like the Pipedrive provider's:
mapped into the engine's row shape (table `example_items`, the parent as a reference by source id),
resolved, claimed and written by the engine.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine_core import rows, write
from engine_core.context import TaskContext
from engine_core.errors import TransientError
from engine_core.models import Run, Successor, TaskOutcome

PAGE_SIZE = 500  # rows per listing page by default (a Pipedrive page's maximum)
STRIPES = 4  # tasks that walk every STRIPES-th page of a kind at once

PHASES = [["companies"], ["contacts"], ["deals"], ["activities"], ["notes"]]
PARENT = {"contacts": "companies", "deals": "contacts", "activities": "deals", "notes": "deals"}

# Every row mapped for writing, rolled back or not: lets tests prove a resumed page does not rewrite
# rows (rows a window committed before are not mapped again).
WRITE_CALLS: collections.Counter[tuple[str, str]] = collections.Counter()
_calls_lock = threading.Lock()


def generate(kind: str, options: dict[str, Any]) -> list[dict[str, Any]]:
    """Every row of `kind` as the example source serves it, from the run's options: `counts[kind]`
    rows (default 60) with ids 1..n, a name, and the parent's id; `malformed` rows get a
    name that is not text, `dangling` ones a parent that does not exist."""
    n = int(options.get("counts", {}).get(kind, 60))
    malformed = set(options.get("malformed", {}).get(kind, []))
    dangling = set(options.get("dangling", {}).get(kind, []))
    parent = PARENT.get(kind)
    parent_n = int(options.get("counts", {}).get(parent, 60)) if parent else 0
    version = options.get("version")
    rows = []
    for i in range(1, n + 1):
        row: dict[str, Any] = {"id": i, "name": f"{kind[:-1]} {i}" + (f" {version}" if version else "")}
        if parent:
            row["parent_id"] = (i % parent_n) + 1 if parent_n else None
            if i in dangling:
                row["parent_id"] = 10_000_000 + i
        if i in malformed:
            row["name"] = {"unexpected": "object"}  # wrong type: the writer refuses it
        rows.append(row)
    return rows


@dataclass(frozen=True)
class _Parent(rows.Ref):
    """The parent of an example row, under its ledger kind; a skip says only "not linked"."""

    def describe(self) -> str:
        """Nothing: an example skip says only "not linked to any record"."""
        return ""


def mapper(tenant_id: str, kind: str, options: dict[str, Any]) -> Callable[[dict[str, Any]], rows.Mapped]:
    """An example row -> the engine's row shape: an `example_items` row whose `parent_id` is the
    parent's reference. Counts every call in WRITE_CALLS and sleeps `row_delay`; raises ValueError
    for a row whose name is not text (a malformed row)."""
    parent = PARENT.get(kind)
    delay = float(options.get("row_delay", 0))
    version = options.get("version")

    def map_row(row: dict[str, Any]) -> rows.Mapped:
        with _calls_lock:
            WRITE_CALLS[(kind, str(row.get("id")))] += 1
        if delay:
            time.sleep(delay)
        if not isinstance(row.get("name"), str):
            raise ValueError(f"{kind} row has a non-text name")
        sid = str(row["id"])
        parents = [_Parent("parent_id", parent, str(row.get("parent_id")))] if parent else []
        values = {"tenant_id": tenant_id, "kind": kind, "source_id": sid, "payload": row}
        return rows.Mapped("example_items", sid, values, parents=parents, version=str(version) if version else None)

    return map_row


class ExampleProvider:
    """The in-process example source (see the module's docstring for its options): five kinds in
    five phases, each walked as STRIPES stripes of pages."""
    source = "example"

    def __init__(self, run: Run | None = None) -> None:
        self.options = dict(run.options) if run else {}

    def phases(self) -> list[list[str]]:
        """One kind a phase: companies, contacts, deals, activities, notes."""
        return [list(g) for g in PHASES]

    def account(self) -> str:
        """One shared budget account for every example run."""
        return "example-account"

    def depends_on(self, kind: str) -> tuple[str, ...]:
        """The kind a kind's rows link to (its parent), so a retry revisits the kinds that skipped
        rows."""
        return (PARENT[kind],) if kind in PARENT else ()

    def page_size(self) -> int:
        """Rows per page: the run option `page_size`, default PAGE_SIZE."""
        return int(self.options.get("page_size", PAGE_SIZE))

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        """STRIPES tasks for the kind, starting at pages 0..STRIPES-1; each hands on the next page
        of its stripe."""
        size = int(dict(run.options).get("page_size", PAGE_SIZE))
        return [Successor(f"{kind}:{i * size}", {"start": i * size}) for i in range(STRIPES)]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        """Write one page of the task's kind through the engine's write path (`write.write_page`);
        raises the injected failures (`fail_pages`, `transient_pages`); returns the
        stripe's next page while the kind has more rows."""
        self.options = dict(ctx.run.options)
        kind, start, size = ctx.task.kind, int(ctx.task.cursor["start"]), self.page_size()
        if start in self.options.get("fail_pages", {}).get(kind, []):
            raise RuntimeError(f"injected failure on {kind} page at {start}")
        times = int(self.options.get("transient_pages", {}).get(kind, {}).get(str(start), 0))
        if ctx.task.attempts <= times:
            raise TransientError(f"injected transient error on {kind} page at {start}")
        everything = generate(kind, self.options)
        page = everything[start : start + size]
        write.write_page(ctx, page, mapper(ctx.run.tenant_id, kind, self.options), malformed=ValueError)
        if len(page) == size and start + size < len(everything):
            nxt = start + STRIPES * size
            return TaskOutcome((Successor(f"{kind}:{nxt}", {"start": nxt}),))
        return TaskOutcome()


