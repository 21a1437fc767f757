"""A phase boundary waits for no first page of a v1 list: a walker's last page asks the next
phase's v1 lists' first pages ahead (`listing.ask_next_phase`, the run's `prefetch.Prefetch`), and
the next phase's first task takes it - no request more, counted in that task's stats, the same rows.
Real threads (four lanes) over the sandbox, on real Postgres."""
from __future__ import annotations

import time

from engine_core.providers.pipedrive.prefetch import Prefetch
from tests.pipedrive.support import failed_tasks, ledger, ledger_truth, migrate, sandbox

FIRST = ("/v1/notes", (("limit", "500"), ("start", "0")))


def test_the_next_phases_v1_first_page_is_asked_ahead_once_and_taken(db, monkeypatch) -> None:
    asked: dict[tuple, float] = {}
    taken: list[tuple] = []
    real_ask, real_take = Prefetch.ask, Prefetch.take

    def ask(self, client, path, query, then=None, **kw):
        asked.setdefault(self.key(path, query), time.time())
        return real_ask(self, client, path, query, then, **kw)

    def take(self, path, query, cancel):
        body = real_take(self, path, query, cancel)
        if body is not None:
            taken.append(self.key(path, query))
        return body

    monkeypatch.setattr(Prefetch, "ask", ask)
    monkeypatch.setattr(Prefetch, "take", take)
    with sandbox(scale="small") as sb:
        truth = sb.truth()
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "notes"])
        listings = sb.stats()["listings"]
    assert run.status == "succeeded", failed_tasks(db, run.id)
    (task,) = db.sql("SELECT stats, extract(epoch FROM started_at) AS started FROM migration_tasks"
                     " WHERE migration_id = %(r)s AND cursor_key = 'notes:0'", {"r": run.id})
    assert asked.get(FIRST, float("inf")) < float(task["started"]), \
        "the organizations walker's last page asks the notes' first page before the notes phase starts"
    assert FIRST in taken, "the page asked ahead is taken"
    # once for the notes phase (asked ahead), once for the catch-up's walk of the list
    assert listings.get("/v1/notes?limit=500&start=0") == 2, listings
    assert task["stats"]["requests"] >= 1, "the page asked ahead is counted by the task that takes it"
    assert set(ledger(db, "acme", "notes")) == ledger_truth(truth)["notes"]
