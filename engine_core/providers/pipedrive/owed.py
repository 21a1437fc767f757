"""The follow-ups a catch-up task owes for the rows it writes, named in its own cursor first.

A catch-up task writes a page's changed rows (`catchup.write_changed`, in the write's own
transactions) and commits the follow-up tasks of those rows later: with its next page's cursor
move, or with its finish. A task that dies between (a killed worker, a transient error) is
retried from its saved cursor, lists or asks the same rows again and finds them written at their
version - no longer changed - so nothing would make their follow-ups: a deal's mail, product lines,
participants or followers never read again. So the rows' follow-ups are added to the task's
cursor in one committed statement before the write (`owe`, called from `write_changed`'s
`before`), and the task makes its follow-up tasks from its cursor, not from what it wrote:

* `MAIL_DUE`: deals whose mail tasks the task owes (`catchup.mail_wanted`, or a waiting deal);
* `LINES_DUE`: deals whose product lines are listed again (`lines.catchup_tasks`), carried from
  page to page until the ledger kind's lists are walked (one `deal_ids` call per 100 deals);
* `RECHECK_DUE`: records whose per-record lists are read again (`record_lists.catchup_tasks`).

A by-id task (`catchup._settle`) also names the ids that answered before writing them
(`ANSWERED`): the run records them seen when it compares them, so a retry would not ask them again.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from engine_core.context import TaskContext
from engine_core.models import Run, Successor
from engine_core.providers.pipedrive import lines, record_lists

MAIL_DUE = "mail_due"
LINES_DUE = "lines_due"
RECHECK_DUE = "recheck_due"
ANSWERED = "answered"


def owe(ctx: TaskContext, cursor: dict[str, Any], due: Mapping[str, Collection[Any]]) -> None:
    """Add each `due[key]` to the list `cursor[key]` of the task's own cursor (its current one,
    updated in place), committed at once in one statement when any list grew; nothing when none did."""
    grew = False
    for key, values in due.items():
        held = sorted(set(cursor.get(key, ())) | set(values))
        if held != cursor.get(key, []):
            cursor[key] = held
            grew = True
    if grew:
        ctx.move_cursor(dict(cursor))


def owed(cursor: Mapping[str, Any], key: str) -> list[Any]:
    """The values the cursor owes under `key` (ascending; empty when none)."""
    return list(cursor.get(key, ()))


def record_ids(rows: Iterable[Any]) -> list[int]:
    """The positive integer ids of these rows as served, ascending."""
    return sorted({r["id"] for r in rows if isinstance(r, dict) and isinstance(r.get("id"), int)
                   and not isinstance(r.get("id"), bool) and r["id"] > 0})


def lists_due(run: Run, lk: str, rows: Sequence[Any]) -> dict[str, list[int]]:
    """What writing these rows of ledger kind `lk` owes besides mail, in the run's kinds: the
    deals' product lines (`LINES_DUE`) and the records' per-record lists (`RECHECK_DUE`)."""
    ids = record_ids(rows)
    due: dict[str, list[int]] = {}
    if ids and lk == "deals" and lines.KIND in run.kinds:
        due[LINES_DUE] = ids
    if ids and record_lists.lists_records_of(run.kinds, lk):
        due[RECHECK_DUE] = ids
    return due


def rechecks(run: Run, cursor: Mapping[str, Any], lk: str, listed_as: str, page: int) -> list[Successor]:
    """The recheck tasks of the records of ledger kind `lk` the cursor owes (`RECHECK_DUE`)."""
    return record_lists.catchup_tasks(run.kinds, lk, listed_as, page, owed(cursor, RECHECK_DUE))
