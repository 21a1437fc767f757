"""A phase boundary waits for no first page of a v1 list: a walker's last page asks the next
phase's v1 lists' first pages ahead (`listing.ask_next_phase`, the run's `prefetch.Prefetch`), and
the next phase's first task takes it - no request more, counted in that task's stats, the same rows.
Real threads (four lanes) over the sandbox, on real Postgres. Nothing is asked ahead for a phase after
the last one the launch executes."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from engine_core.config import Settings
from engine_core.providers.pipedrive.ahead import Ahead
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.providers.pipedrive.prefetch import Prefetch
from engine_core.providers.pipedrive.stripes import v1_first
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


class _Asked:
    """A client that records what is asked ahead of it (the requests `Prefetch` would start)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def prefetch_v1(self, path, params=None, **kw) -> None:
        self.paths.append(path)

    def prefetch_v2(self, path, params=None, **kw) -> None:
        self.paths.append(path)


def _ahead(last_phase: int | None, task_phase: int, current_phase: int) -> Ahead:
    run = SimpleNamespace(plan=[list(group) for group in PHASES], current_phase=current_phase, is_sync=False)
    ctx = SimpleNamespace(run=run, task=SimpleNamespace(kind=PHASES[task_phase][0], phase=task_phase),
                          settings=Settings(launch_last_phase=last_phase))
    return Ahead(ctx, None, Prefetch(), lambda kind: None, lambda run, kind: v1_first(kind))


@pytest.mark.parametrize("last_phase, asks", [(None, True), (5, True), (4, False)])
def test_nothing_is_asked_ahead_for_a_phase_after_the_last_one_the_launch_executes(last_phase, asks) -> None:
    # a walker's last page of phase 5 (activities, deal_products) asks phase 6's v1 first pages
    # (notes, files) and an early discovery of phase 5 asks phase 6's too - unless the launch (a
    # Dagster run of phases 1-5) ends before phase 6: no task of it would take them
    walker, discovery = _Asked(), _Asked()
    _ahead(last_phase, task_phase=4, current_phase=4).walk(walker, ())
    _ahead(last_phase, task_phase=4, current_phase=3).discovered(discovery, ())
    for client in (walker, discovery):
        assert bool({"/v1/notes", "/v1/files"} & set(client.paths)) == asks, client.paths
