"""The write path's probe (Pipedrive's `writers.ask_source`): two lane threads whose pages point at
the same missing parent ask the source about it once - the second waits for the first's answer
(tests/pipedrive/test_references counts one request per deleted parent, and flaked on 2) - and a
question that fails leaves the parent to be asked again."""
from __future__ import annotations

import threading
import time

import pytest

from engine_core.providers.pipedrive.errors import NotFound
from engine_core.providers.pipedrive.writers import SourceAnswers, ask_source

KEY = ("db", 1)
PAIR = ("organizations", "42")


class Source:
    """A source whose first answer waits for `release`; counts its requests."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def get(self, path: str, cancel=None) -> dict:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            self.entered.set()
            self.release.wait(30)
            if self.fail_first:
                raise RuntimeError("server error after the client's retries")
        raise NotFound(path)


def _two_askers(source: Source, answers: SourceAnswers) -> tuple[dict, list[BaseException]]:
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def ask(name: str) -> None:
        try:
            results[name] = ask_source(source, [PAIR], KEY, answers=answers)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    a = threading.Thread(target=ask, args=("a",))
    a.start()
    assert source.entered.wait(30)
    b = threading.Thread(target=ask, args=("b",))
    b.start()
    deadline = time.monotonic() + 2.0  # b asks the source itself, or waits for a's answer
    while source.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    source.release.set()
    a.join(30)
    b.join(30)
    return results, errors


def test_two_lanes_ask_about_one_missing_parent_once() -> None:
    source = Source()
    results, errors = _two_askers(source, SourceAnswers())
    assert not errors
    assert source.calls == 1, "one request per missing parent"
    assert results == {"a": {PAIR: False}, "b": {PAIR: False}}


def test_a_failed_question_is_asked_again_by_the_waiting_lane() -> None:
    source = Source(fail_first=True)
    results, errors = _two_askers(source, SourceAnswers())
    assert [str(e) for e in errors] == ["server error after the client's retries"]
    assert source.calls == 2 and results == {"b": {PAIR: False}}


@pytest.mark.parametrize("exists", [True, False])
def test_an_answer_is_kept_for_the_run(exists: bool) -> None:
    answers = SourceAnswers()
    answers.put(KEY, PAIR, exists)
    source = Source()
    assert ask_source(source, [PAIR], KEY, answers=answers) == {PAIR: exists} and source.calls == 0
