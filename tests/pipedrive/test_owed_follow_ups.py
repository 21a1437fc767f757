"""The follow-ups of the deals a catch-up task writes survive the task dying right after the write.

A catch-up task writes changed deals in the write's own transactions and commits their follow-up
tasks later (the next page's move, or its finish): listing again a deal's product lines, reading
again its participants, followers and history. Pinned here, on a sync after live changes of the
tiny account (a line removed from a deal, deals updated, a deal created): the task fails right
after `write_changed` committed the changed deals and before those tasks are committed - a page of
the walk, or the deals task asking by id the changed deals the walk did not serve (hidden from the
deals lists here, as deals moving between lists while the walk passed) - and is retried, finding
the deals written at their version; afterwards every deal's product lines, participants, followers
and history match the sandbox's truth row by row.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from engine_core.errors import TransientError
from engine_core.providers.pipedrive import catchup
from engine_core.providers.pipedrive.inventory import row_id
from engine_core.providers.pipedrive.kinds import ledger_kind
from tests.pipedrive.support import failed_tasks, ledger, live_op, migrate, sandbox, sync
from tests.pipedrive.test_crm_batch_run import reconcile_lines
from tests.pipedrive.test_crm_fanouts_run import reconcile

TENANT = "acme"
LISTS = ["+participants", "+followers", "+deal_history"]
HISTORY_FIELDS = {"stage_id", "value", "title"}


def _changes(sb: Any, follow_up: str) -> set[str]:
    """Live changes whose deals' follow-ups the sync must read again; the changed deals' ids."""
    if follow_up == "lines":
        return {str(live_op(sb, "product_remove")["deal_id"]) for _ in range(3)}
    updated = [c for c in (live_op(sb, "update") for _ in range(40)) if c["kind"] == "deals"]
    changed = {str(c["id"]) for c in updated if HISTORY_FIELDS & set(c.get("fields", ()))}
    assert changed, updated
    created = next(c for c in (live_op(sb, "create") for _ in range(40)) if c["kind"] == "deals")
    return changed | {str(created["id"])}  # followed by its owner since its creation


@pytest.mark.parametrize("path", ["page", "by_id"])
@pytest.mark.parametrize("follow_up", ["lines", "lists"])
def test_a_catch_up_task_dying_after_writing_changed_deals_still_reads_their_lists_again(
        db, monkeypatch, follow_up: str, path: str) -> None:
    real_write, real_step = catchup.write_changed, catchup.list_step
    changed: set[str] = set()
    died: list[set[str]] = []

    def list_step(meter, kind, at, since=None):  # by_id: the changed deals the ledger holds, unlisted
        step = real_step(meter, kind, at, since)
        if path == "by_id" and ledger_kind(kind) == "deals":
            step = replace(step, rows=tuple(r for r in step.rows if row_id(r) not in hidden))
        return step

    def write_changed(ctx, client, mapper_of, kind, lk, rows, **kw):  # the real write, then the death
        written = real_write(ctx, client, mapper_of, kind, lk, rows, **kw)
        mine = {row_id(r) for r in written} & changed
        if lk == "deals" and mine and not died and ("deletes" in ctx.task.cursor) == (path == "by_id"):
            died.append(mine)
            raise TransientError("the worker died after writing deals, before their follow-up tasks were committed")
        return written

    with sandbox() as sb:
        first = migrate(db, sb, TENANT, kinds=LISTS if follow_up == "lists" else None)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        changed |= _changes(sb, follow_up)
        hidden = changed & set(ledger(db, TENANT, "deals"))
        monkeypatch.setattr(catchup, "list_step", list_step)
        monkeypatch.setattr(catchup, "write_changed", write_changed)
        sync(db, sb, TENANT)
        assert died, "the sync wrote changed deals there"
        if follow_up == "lines":
            reconcile_lines(db, sb.truth("deal_products")["deal_products"])
        else:
            reconcile(db, sb, {"deals": set()})
