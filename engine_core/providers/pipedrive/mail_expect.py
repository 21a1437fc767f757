"""How many more email tasks a mail discovery walk is expected to seed: the phase's expected total
before its discovery ends, so its percent moves forward and its ETA holds from the start of mail.

A walk over one deal list seeds, per page of `PAGE` deals, a task per `DEALS_PER_TASK` deals with
mail, and its next discovery page. Each page hands its successor, in the successor's cursor,
`expected_tasks` (`EXPECTED`): the tasks the walk will still seed beyond those that exist (the
successor itself exists). The progress (`engine_core.progress`) adds the `expected_tasks` of the
tasks not yet finished to the phase's task total; once a page runs, its seeds are real and its own
successor carries the estimate of the rest, so the last page of a walk leaves none and the total is
the real count.

The deals left to list are the list's count (`list_count`: the deals phase's `source_total` of this
run, or the deals it saw, whichever is larger) less the deals the walk has listed; unknown, or
already passed (the list grew), a full page is assumed. Their share with mail is the walk's share so
far plus one standard error of it, so the estimate errs high: a count found later more often shrinks
the total (the percent jumps ahead) than grows it (the percent steps back). "With mail" counts the
deals the walk seeds tasks for: a deal waiting for the catch-up's walk has its mail listed by the
catch-up (`walk_proof.mail_left_to_catchup`), so it is neither a task here nor expected to be one;
its messages are no rows of this phase (counted once, by the catch-up's mail task that lists them).
"""
from __future__ import annotations

import math
from typing import Any

from engine_core.db import Database
from engine_core.runs_reads import kind_count
from engine_core.providers.pipedrive.stripes import DEALS_PER_TASK, PAGE

EXPECTED = "expected_tasks"  # a discovery page's cursor: email tasks expected beyond the existing ones
LISTED, WITH_MAIL = "listed", "with_mail"  # a discovery page's cursor: its walk's deals so far, and those it seeded


def list_count(db: Database, run_id: int, kind: str) -> int | None:
    """The deals of one list (`kind`: "deals" or "deals_archived") as this run's deals phase knows
    them: the larger of the source's count its discovery recorded and the rows its tasks saw; None
    when the run has neither (a run without the deals phase)."""
    known = kind_count(db, run_id, kind)
    n = max(known["source_total"] or 0, known["seen"])
    return n or None


def expected_after(listed: int, with_mail: int, total: int | None, *, page: int = PAGE,
                   per_task: int = DEALS_PER_TASK) -> int:
    """Tasks a walk is expected to seed after the discovery page that exists next: email tasks for
    the deals still to list (`total` less `listed`; a full `page` when `total` is None or passed),
    `with_mail` of `listed` with mail plus one standard error, `per_task` deals a task, counted per
    page as discovery seeds them; plus the discovery pages after that next one. 0 <= result."""
    remaining = total - listed if total is not None and total > listed else page
    share = with_mail / listed if listed > 0 else 1.0
    if 0 < listed:
        share = min(1.0, share + math.sqrt(share * (1.0 - share) / listed))
    full, last = divmod(remaining, page)
    tasks = full * math.ceil(page * share / per_task) + math.ceil(last * share / per_task)
    return tasks + max(0, math.ceil(remaining / page) - 1)


def with_expectation(cursor: dict[str, Any], listed: int, with_mail: int, total: int | None) -> dict[str, Any]:
    """The next discovery page's cursor with its walk's figures so far (`listed`, `with_mail`) and
    the tasks it is expected to seed (`expected_after`) set on it."""
    return {**cursor, LISTED: listed, WITH_MAIL: with_mail, EXPECTED: expected_after(listed, with_mail, total)}
