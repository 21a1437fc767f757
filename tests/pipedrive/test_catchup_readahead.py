"""The catch-up's chain reads every list at once (`inventory.ReadAhead`) while it still writes one
list after another, parents first: under latency the chain waited for each page of each list in
turn (one page asked ahead), ~6 s of a 17 s small run. Every page is still listed once, counted
by the task that takes it; a page the read-ahead failed is listed by the walker itself. Real
sandbox (pages capped at 15 rows, a tenth of the realistic latency), real Postgres, real threads.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from engine_core.providers.pipedrive import catchup, inventory, walk_proof, writers
from engine_core.providers.pipedrive.inventory import ReadAhead, Step
from tests.pipedrive.support import failed_tasks, migrate, sandbox

KINDS = ["organizations", "persons", "deals", "deals_archived"]


def _record(monkeypatch, fail: Any = None) -> list[dict[str, Any]]:
    """Every catch-up list page asked: kind, position, thread, start and end (monotonic); `fail`
    (kind, position, thread) -> True raises instead of asking."""
    seen: list[dict[str, Any]] = []
    lock = threading.Lock()
    real = inventory.list_step

    def list_step(meter, kind, at, since=None):
        entry = {"kind": kind, "at": inventory.position(at), "thread": threading.current_thread().name,
                 "start": time.monotonic()}
        if fail is not None and fail(entry):
            with lock:
                seen.append({**entry, "end": time.monotonic(), "failed": True})
            raise RuntimeError("a page the read-ahead could not read")
        try:
            return real(meter, kind, at, since)
        finally:
            with lock:
                seen.append({**entry, "end": time.monotonic()})

    monkeypatch.setattr(catchup, "list_step", list_step)
    return seen


def _inventory(db, run_id: int) -> dict[str, int]:
    return {r["kind"]: r["n"] for r in db.sql("SELECT kind, count(*) AS n FROM migration_inventory"
                                              " WHERE migration_id = %(r)s GROUP BY kind", {"r": run_id})}


def _expected(truth: dict[str, Any]) -> dict[str, int]:
    """The inventory's ids per ledger kind: every id of the run's kinds the source serves."""
    return {"organizations": len(truth["organizations"]), "persons": len(truth["persons"]),
            "deals": len(truth["deals"]) + len(truth["deals_archived"])}


def _list_requests(db, run_id: int) -> int:
    rows = db.sql("SELECT coalesce(sum((stats->>'requests')::int), 0) AS n FROM migration_tasks"
                  " WHERE migration_id = %(r)s AND kind = 'catchup' AND cursor ? 'list'", {"r": run_id})
    return int(rows[0]["n"])


def test_the_chains_lists_are_read_at_once_and_every_page_is_listed_once(db, monkeypatch) -> None:
    seen = _record(monkeypatch)
    with sandbox(page_cap=15, latency="realistic:0.1") as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=KINDS)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    orgs = [s for s in seen if s["kind"] == "organizations"]
    deals = [s for s in seen if s["kind"] == "deals"]
    assert len(orgs) >= 2 and len([s for s in seen if s["kind"] == "persons"]) >= 4, "the lists must be several pages"
    assert min(s["start"] for s in deals) < max(s["end"] for s in orgs), \
        "the deals' first page was asked only after the organizations' walk (one list after another)"
    archived = [s for s in seen if s["kind"] == "deals_archived"]
    assert min(s["start"] for s in archived) >= max(s["end"] for s in deals), \
        "the archived deals were read before the deals' walk ended (a deal archived meanwhile is in neither)"
    pages = [(s["kind"], s["at"]) for s in seen]
    assert len(pages) == len(set(pages)), f"a page was listed twice: {pages}"
    assert _list_requests(db, run.id) == len(seen), "each page read ahead is counted by the task that took it"
    assert _inventory(db, run.id) == _expected(truth)


def test_a_page_the_read_ahead_failed_is_listed_by_the_walker(db, monkeypatch) -> None:
    def fail(entry: dict[str, Any]) -> bool:  # the persons' second page, read ahead
        return entry["kind"] == "persons" and entry["at"] != "{}" and entry["thread"].startswith("readahead")

    seen = _record(monkeypatch, fail)
    with sandbox(page_cap=15) as sb:
        truth = sb.truth()["ids"]
        run = migrate(db, sb, kinds=KINDS)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    failed = [s for s in seen if s.get("failed")]
    assert len(failed) == 1, failed
    again = [s for s in seen if (s["kind"], s["at"]) == (failed[0]["kind"], failed[0]["at"]) and not s.get("failed")]
    assert len(again) == 1 and not again[0]["thread"].startswith("readahead"), again
    assert _inventory(db, run.id) == _expected(truth)


def _pages(n: int, started: list[int], gate: threading.Event | None = None) -> Any:
    """A step over a list of `n` pages of one row each (position = the page's number)."""
    def step(meter, kind, at, since):
        page = int(at.get("start", 0))
        started.append(page)
        if gate is not None:
            gate.wait(5)
        return Step(({"id": page},), {"start": page + 1} if page + 1 < n else None)
    return step


def _settle(reader: ReadAhead, asked: int) -> None:
    deadline = time.monotonic() + 5
    while reader.asked < asked and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def test_a_read_ahead_holds_at_most_ahead_pages_a_list_and_reads_on_as_its_walker_takes() -> None:
    started: list[int] = []
    reader = ReadAhead(object(), ["notes"], step=_pages(10, started), ahead=3)
    _settle(reader, 3)
    assert started == [0, 1, 2] and reader.asked == 3, "three pages read, the fourth waits for the walker"
    assert reader.take("notes", {}).rows == ({"id": 0},)
    _settle(reader, 4)
    assert started == [0, 1, 2, 3]
    assert reader.take("notes", {"start": 5}) is None, "a page not read is the walker's own"
    for page in range(1, 10):
        assert reader.take("notes", {"start": page} if page else {}).rows == ({"id": page},)
    assert reader.asked == reader.taken == 10 and reader.reading("notes")


def test_a_read_ahead_left_idle_reads_no_more() -> None:
    started: list[int] = []
    now = [0.0]
    reader = ReadAhead(object(), ["notes"], step=_pages(10, started), ahead=1, idle=60.0, clock=lambda: now[0])
    _settle(reader, 1)
    now[0] = 61.0  # nobody took a page for a minute
    assert reader.take("notes", {}) is None and not reader.reading("notes")
    time.sleep(0.05)
    assert started == [0], "nothing read after it was left idle"


def test_a_list_that_follows_another_is_read_once_that_one_is_read_to_its_end() -> None:
    started: list[tuple[str, int]] = []

    def step(meter, kind, at, since):
        started.append((kind, int(at.get("start", 0))))
        page = int(at.get("start", 0))
        return Step(({"id": page},), {"start": page + 1} if page + 1 < 3 else None)

    reader = ReadAhead(object(), ["deals", "deals_archived"], step=step, follows={"deals_archived": "deals"}, ahead=3)
    _settle(reader, 6)
    assert started[:3] == [("deals", 0), ("deals", 1), ("deals", 2)], started
    assert sorted(started[3:]) == [("deals_archived", 0), ("deals_archived", 1), ("deals_archived", 2)], started


def test_a_read_ahead_tells_each_page_read_and_when_no_page_of_a_list_is_being_read() -> None:
    started: list[int] = []
    heard: list[tuple[str, int, bool]] = []
    reader: list[ReadAhead] = []

    def arrived(kind: str, step: Step) -> None:
        deadline = time.monotonic() + 5
        while not reader and time.monotonic() < deadline:
            time.sleep(0.01)
        heard.append((kind, step.rows[0]["id"], reader[0].settled([kind])))

    reader.append(ReadAhead(object(), ["notes"], step=_pages(5, started), ahead=2, arrived=arrived))
    _settle(reader[0], 2)
    assert [h[:2] for h in heard] == [("notes", 0), ("notes", 1)], heard
    assert heard[-1][2] and reader[0].settled(["notes"]), "two pages held: the list waits for its walker"
    for page in range(5):
        assert reader[0].take("notes", {"start": page} if page else {}) is not None
        _settle(reader[0], min(5, page + 3))
    assert [h[1] for h in heard] == [0, 1, 2, 3, 4] and heard[-1][2], "read to its end: settled"


def test_the_last_levels_parents_are_asked_while_the_chain_writes_once_a_kind(db, monkeypatch) -> None:
    """Activities and notes whose deal or lead is archived (lists this run does not take) stay
    placeholders, and the catch-up retakes them: in a run whose walk does not settle them (as a
    sync's: here the lists a full run walks only to settle parents are turned off,
    `walk_proof.proof_lists`), their parents are asked of the source while the
    chain still writes, the pages' parents together - one `ids=` question for the deals, each lead
    once - and the requests counted by the last level's tasks as the source counted them."""
    kinds = ["organizations", "persons", "deals", "leads", "activities", "notes"]
    monkeypatch.setattr(walk_proof, "proof_lists", lambda kinds: ())
    monkeypatch.setattr(catchup, "proof_lists", lambda kinds: ())
    questions: list[list[tuple[str, str]]] = []
    catching = threading.Event()
    asked = threading.Event()
    real_request, real_ask, real_write, real_page = (writers._request, catchup.LastParents.ask,
                                                     catchup.write_changed, catchup.run_page)

    def request(client, pairs, cancel):
        if catching.is_set():
            questions.append(list(pairs))
        return real_request(client, pairs, cancel)

    def ask(self) -> None:
        real_ask(self)
        asked.set()

    def write_changed(ctx, client, mapper_of, kind, lk, rows, **kw):
        if kind == "leads":  # the chain's last list: written once the read-ahead asked
            assert asked.wait(20), "the last level's parents were not asked ahead"
        return real_write(ctx, client, mapper_of, kind, lk, rows, **kw)

    def run_page(ctx, client, mapper_of):
        if not catching.is_set():
            catching.set()
            sb.reset_stats()
        return real_page(ctx, client, mapper_of)

    monkeypatch.setattr(writers, "_request", request)
    monkeypatch.setattr(catchup.LastParents, "ask", ask)
    monkeypatch.setattr(catchup, "write_changed", write_changed)
    monkeypatch.setattr(catchup, "run_page", run_page)
    with sandbox() as sb:
        run = migrate(db, sb, kinds=kinds)
        spent = sb.stats()
    assert run.status == "succeeded", failed_tasks(db, run.id)
    skipped = db.sql("SELECT count(*) AS n FROM migration_records WHERE migration_id = %(r)s AND action = 'skipped'"
                     " AND kind IN ('activities', 'notes') AND reason LIKE %(w)s", {"r": run.id, "w": f"%{writers.NOT_WRITTEN}%"})
    assert skipped[0]["n"] > 0, "the account must have rows whose parent is archived"
    deals = [q for q in questions if q[0][0] == "deals"]
    assert len(deals) == 1 and len(deals[0]) > 1, f"the deals asked page by page: {questions}"
    leads = [p for q in questions for p in q if p[0] == "leads"]
    assert len(leads) == len(set(leads)), f"a lead asked twice: {leads}"
    counted = db.sql("SELECT coalesce(sum((stats->>'requests')::int), 0) AS n FROM migration_tasks"
                     " WHERE migration_id = %(r)s AND kind = 'catchup'", {"r": run.id})[0]["n"]
    assert counted == spent["requests_total"], (counted, spent["requests"])
