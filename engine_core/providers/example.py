"""An in-process example provider: rows generated in memory, failures you can inject.

It exercises every engine path without a network: striped page walks, references resolved
through the ledger, skips, malformed rows, failing and transient pages. Options (run options):
  counts          {kind: rows}            default 60 per kind
  page_size       rows per page           default 500 (the source's maximum)
  malformed       {kind: [ids]}           rows that fail alone
  dangling        {kind: [ids]}           rows whose parent does not exist (skipped)
  fail_pages      {kind: [starts]}        pages whose task fails
  transient_pages {kind: {start: times}}  pages that raise a transient error the first N attempts
  row_delay       seconds per row write   (to give tests a mid-page moment)
  version         source version of every row (issue 9): a run with another version sees every
                  row changed (its name carries the version) and updates it in place
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any

from engine_core import ledger
from engine_core.config import PAGE_SIZE, STRIPES
from engine_core.context import TaskContext
from engine_core.db import Conn
from engine_core.errors import TransientError
from engine_core.models import Run, Successor, TaskOutcome
from engine_core.providers.base import register

PHASES = [["companies"], ["contacts"], ["deals"], ["activities"], ["notes"]]
PARENT = {"contacts": "companies", "deals": "contacts", "activities": "deals", "notes": "deals"}

# Every writer call, rolled back or not: lets tests prove a resumed page does not rewrite rows.
WRITE_CALLS: collections.Counter[tuple[str, str]] = collections.Counter()
_calls_lock = threading.Lock()


def generate(kind: str, options: dict[str, Any]) -> list[dict[str, Any]]:
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


class ExampleProvider:
    source = "example"

    def __init__(self, run: Run | None = None) -> None:
        self.options = dict(run.options) if run else {}

    def phases(self) -> list[list[str]]:
        return [list(g) for g in PHASES]

    def account(self) -> str:
        return "example-account"

    def depends_on(self, kind: str) -> tuple[str, ...]:
        return (PARENT[kind],) if kind in PARENT else ()

    def page_size(self) -> int:
        return int(self.options.get("page_size", PAGE_SIZE))

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        size = int(dict(run.options).get("page_size", PAGE_SIZE))
        return [Successor(f"{kind}:{i * size}", {"start": i * size}) for i in range(STRIPES)]

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        self.options = dict(ctx.run.options)
        kind, start, size = ctx.task.kind, int(ctx.task.cursor["start"]), self.page_size()
        if start in self.options.get("fail_pages", {}).get(kind, []):
            raise RuntimeError(f"injected failure on {kind} page at {start}")
        times = int(self.options.get("transient_pages", {}).get(kind, {}).get(str(start), 0))
        if ctx.task.attempts <= times:
            raise TransientError(f"injected transient error on {kind} page at {start}")
        everything = generate(kind, self.options)
        page = everything[start : start + size]
        parent = PARENT.get(kind)
        refs = ledger.resolve(ctx.db, ctx.run, [(parent, r.get("parent_id")) for r in page]) if parent else {}  # type: ignore[arg-type]
        delay = float(self.options.get("row_delay", 0))

        def write(tx: Conn, row: dict[str, Any]) -> str:
            with _calls_lock:
                WRITE_CALLS[(kind, str(row.get("id")))] += 1
            if delay:
                time.sleep(delay)
            if not isinstance(row.get("name"), str):
                raise ValueError(f"{kind} row has a non-text name")
            parent_id = None
            if parent:
                parent_id = refs.get((parent, str(row.get("parent_id"))))
                if parent_id is None:
                    return ledger.skip(tx, ctx.run, kind, row["id"], "not linked to any record")

            def insert() -> ledger.Written:
                got = tx.sql(
                    "INSERT INTO example_items (tenant_id, kind, source_id, parent_id, payload)"
                    " VALUES (%(t)s, %(k)s, %(s)s, %(p)s, %(d)s) RETURNING id",
                    {"t": ctx.run.tenant_id, "k": kind, "s": str(row["id"]), "p": parent_id, "d": row},
                )
                return ledger.Written("example_items", got[0]["id"])

            def update(record_id: int) -> dict[str, Any] | None:
                got = tx.sql(
                    "UPDATE example_items n SET parent_id = %(p)s, payload = %(d)s FROM example_items o"
                    " WHERE n.id = %(id)s AND o.id = n.id RETURNING o.parent_id, o.payload",
                    {"id": record_id, "p": parent_id, "d": row},
                )
                return {"parent_id": got[0]["parent_id"], "payload": got[0]["payload"]} if got else None

            version = self.options.get("version")
            return ledger.write_once(tx, ctx.run, kind, row["id"], insert,
                                     version=str(version) if version else None, update=update)

        ctx.write_rows(page, write)
        if len(page) == size and start + size < len(everything):
            nxt = start + STRIPES * size
            return TaskOutcome((Successor(f"{kind}:{nxt}", {"start": nxt}),))
        return TaskOutcome()


register("example", ExampleProvider)
