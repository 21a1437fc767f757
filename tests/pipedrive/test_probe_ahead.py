"""A walk's pages asked ahead have their parents asked ahead too (`ahead.Ahead`,
`writers.probe_ahead`): once the phases of the parents are closed, a page's parents the ledger does
not know are asked of the source as the page arrives, not when its task starts - each still once
per run, counted in the kind's tasks, the same rows written; only while the source is slow
(`Prefetch.slow`). Four lane threads over the sandbox's small account (dangling organization ids
on persons), on real Postgres. A full run leaves its parents to the catch-up's walk (`walk_proof`):
these runs ask as the runs that still ask do (a dry run, a sync), with that rule off."""
from __future__ import annotations

import threading
import time

from engine_core.providers.pipedrive import walk_proof, writers
from engine_core.providers.pipedrive.prefetch import Prefetch
from tests.pipedrive.support import failed_tasks, ledger, ledger_truth, migrate, sandbox


def test_a_walks_later_pages_have_their_parents_asked_before_their_tasks_start(db, monkeypatch) -> None:
    asked: list[tuple[float, list]] = []
    lock = threading.Lock()
    real_request = writers._request

    def request(client, pairs, cancel):
        with lock:
            asked.append((time.time(), list(pairs)))
        return real_request(client, pairs, cancel)

    monkeypatch.setattr(writers, "_request", request)
    _asking(monkeypatch)
    monkeypatch.setattr(Prefetch, "SLOW", 0.0)  # the sandbox answers at once: count it as slow
    taken: list[bool] = []
    real_take = writers.MappedPages.take
    monkeypatch.setattr(writers.MappedPages, "take", lambda self, rows: (
        lambda got: (taken.append(got is not None), got)[1])(real_take(self, rows)))
    with sandbox(scale="small") as sb:
        truth = sb.truth()
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "persons"])
        stats = sb.stats()
    assert run.status == "succeeded", failed_tasks(db, run.id)
    tasks = {r["cursor_key"]: r for r in db.sql(
        "SELECT cursor_key, extract(epoch FROM started_at) AS started, stats FROM migration_tasks"
        " WHERE migration_id = %(r)s AND kind = 'persons'", {"r": run.id})}
    last = tasks["persons:s0:p2"]  # the small account's 1,500 persons: three pages, one walker
    asked_at = [at for at, _ in asked]
    assert asked_at and max(asked_at) < float(last["started"]), \
        "every page's parents were asked before the walk's last task started"
    pairs = [p for _, question in asked for p in question]
    assert len(pairs) == len(set(pairs)), "each parent asked once in the run"
    probes = sum(n for path, n in stats["requests"].items() if path.startswith("/api/v2/organizations/"))
    probes += sum(n for key, n in stats["listings"].items() if key.startswith("/api/v2/organizations?") and "ids=" in key)
    counted = sum(int(t["stats"].get("requests", 0)) for t in tasks.values())
    assert counted == probes + 3, "the persons tasks count their three pages and every probe made for them"
    for kind in ("organizations", "persons"):
        assert set(ledger(db, "acme", kind)) == ledger_truth(truth)[kind]
    dangling = db.sql("SELECT count(*) AS n FROM migration_records WHERE migration_id = %(r)s AND kind = 'persons'"
                      " AND dangling IS NOT NULL", {"r": run.id})[0]["n"]
    assert dangling > 0, "persons pointing at deleted organizations are imported, the link dangling"
    assert sum(taken) >= 2, f"the pages mapped to ask their parents ahead were mapped again by their tasks: {taken}"


def test_a_fast_source_has_no_parents_asked_ahead(db, monkeypatch) -> None:
    asked: list[str] = []
    real_probe = writers.probe_ahead
    monkeypatch.setattr(writers, "probe_ahead", lambda ctx, *a: (asked.append(ctx.task.kind), real_probe(ctx, *a)))
    _asking(monkeypatch)
    monkeypatch.setattr(Prefetch, "SLOW", 60.0)
    with sandbox(scale="small") as sb:
        run = migrate(db, sb, kinds=["organizations", "persons"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert asked == [], "mapping a page twice costs more than a fast source's probe"


def _asking(monkeypatch) -> None:
    """Walks that ask about their missing parents (no parent left to the catch-up's walk)."""
    for module in (writers, walk_proof):
        monkeypatch.setattr(module, "walk_settles", lambda run, kind, parent_kind: False)


def test_a_page_asked_ahead_by_several_walkers_is_mapped_once(monkeypatch) -> None:
    # A page's answer reaches each walker that asked for it (each its own `then`): it was mapped once
    # per arrival (and its parents looked up again), and once more after its task had taken it.
    monkeypatch.setattr(writers, "MAPPED", writers.MappedPages())
    mapped: list[int] = []
    started, release = threading.Event(), threading.Event()

    def mapper(row: dict) -> writers.Mapped:
        mapped.append(row["id"])
        if row["id"] == 1 and len(mapped) == 1:
            started.set()
            release.wait(5)
        return writers.Mapped("notes", str(row["id"]), {"source_id": str(row["id"])})

    rows = tuple({"id": i} for i in range(1, 4))
    first = threading.Thread(target=writers.map_ahead, args=(rows, mapper))
    first.start()
    started.wait(5)
    assert writers.map_ahead(rows, mapper) is None  # being mapped: not mapped again
    taken: list = []
    taker = threading.Thread(target=lambda: taken.append(writers.MAPPED.take(rows)))
    taker.start()  # the task waits for the mapping under way instead of mapping the page itself
    release.set()
    first.join(5)
    taker.join(5)
    assert [p["id"] for p in taken[0]] == ["1", "2", "3"]
    assert writers.map_ahead(rows, mapper) is None  # taken: not mapped ahead any more
    assert writers.MAPPED.take(rows) is None
    assert mapped == [1, 2, 3]
