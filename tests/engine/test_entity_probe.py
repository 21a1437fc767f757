"""The entity path: a page's missing parents are asked of the source a few at a time
(`writers.ask_source`, `PROBE_THREADS`), not one after another - each still once per run, and a
question that fails propagates with the parent left to be asked again. Stages: a parent kind asked by
id (organizations, persons and deals are asked many at a time through their lists' `ids`:
tests/pipedrive/test_probe_batch.py)."""
from __future__ import annotations

import threading

import pytest

from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.writers import SourceAnswers, ask_source

KEY = ("db", 1)
PAIRS = [("stages", str(i)) for i in range(1, 9)]


class Source:
    """Answers 404 for odd ids and a record for even ones, but only once `together` requests are in
    flight at once (a barrier: a source asked one parent at a time never answers, and the wait
    breaks after 10 s). `fail`: that id's request raises after the barrier."""

    def __init__(self, together: int, fail: str | None = None) -> None:
        self.barrier = threading.Barrier(together)
        self.asked: list[str] = []
        self.fail = fail
        self._lock = threading.Lock()

    def get(self, path: str, cancel=None) -> dict:
        sid = path.rsplit("/", 1)[1]
        with self._lock:
            self.asked.append(sid)
        try:
            self.barrier.wait(10)
        except threading.BrokenBarrierError:
            raise AssertionError("the parents were not asked at once") from None
        if sid == self.fail:
            raise RuntimeError("server error after the client's retries")
        if int(sid) % 2:
            raise NotFound(path)
        return {"data": {"id": int(sid)}}


def test_a_pages_missing_parents_are_asked_at_once_each_once() -> None:
    answers = SourceAnswers()
    source = Source(together=4)
    out = ask_source(source, PAIRS + PAIRS[:3], KEY, answers=answers)
    assert out == {p: int(p[1]) % 2 == 0 for p in PAIRS}
    assert sorted(source.asked, key=int) == [p[1] for p in PAIRS], "each parent asked once"
    assert answers.get(KEY, PAIRS) == out, "the answers are kept for the run"


def test_a_failed_question_propagates_and_its_parent_is_asked_again_later() -> None:
    answers = SourceAnswers()
    with pytest.raises(RuntimeError, match="server error"):
        ask_source(Source(together=4, fail="3"), PAIRS[:4], KEY, answers=answers)
    assert ("stages", "3") not in answers.get(KEY, PAIRS[:4])
    again = Source(together=1)
    out = ask_source(again, PAIRS[:4], KEY, answers=answers)
    assert out == {p: int(p[1]) % 2 == 0 for p in PAIRS[:4]}
    assert "3" in again.asked


def test_every_question_of_a_page_goes_in_one_round_trip() -> None:
    # eight parents by id: all eight in flight together (four at a time never meets the barrier)
    source = Source(together=len(PAIRS))
    out = ask_source(source, PAIRS, KEY, answers=SourceAnswers())
    assert out == {p: int(p[1]) % 2 == 0 for p in PAIRS}


class Lists:
    """The deal lists' `ids=`: the active list serves `active`, the archived one `archived`, each
    only once both requests are in flight (a barrier: asked one after the other, neither answers)."""

    def __init__(self, active: set[str], archived: set[str]) -> None:
        self.served = {"/api/v2/deals": active, "/api/v2/deals/archived": archived}
        self.barrier = threading.Barrier(2)
        self.asked: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def get(self, path: str, params=None, cancel=None) -> dict:
        with self._lock:
            self.asked.append((path, params["ids"]))
        try:
            self.barrier.wait(10)
        except threading.BrokenBarrierError:
            raise AssertionError("the deal lists were not asked at once") from None
        ids = params["ids"].split(",")
        return {"data": [{"id": int(i)} for i in ids if i in self.served[path]]}


def test_a_kinds_lists_are_asked_at_once_with_the_same_answers() -> None:
    deals = [("deals", str(i)) for i in (3, 5, 8, 13)]
    source = Lists(active={"3"}, archived={"8"})
    out = ask_source(source, deals, KEY, answers=SourceAnswers())
    assert out == {("deals", "3"): True, ("deals", "5"): False, ("deals", "8"): True, ("deals", "13"): False}
    assert sorted(source.asked) == [("/api/v2/deals", "3,5,8,13"), ("/api/v2/deals/archived", "3,5,8,13")]
