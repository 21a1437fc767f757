"""Issue 11, the entity path: a page's missing parents of one kind are asked of the source together,
through the kind's v2 list's `ids` (`kinds.BATCH_PATHS`: up to 100 ids a request; an id that does
not exist is simply absent, per the spec), not by one `GET` each - with the answers `GET` by id
gives. Over the sandbox (a real socket, the real client):
* a page whose parents are existing, deleted (the sandbox's purged ids) and never-existing ids of
  several kinds (organizations, persons, deals active and archived, leads): one request per kind
  (deals: the active and the archived list at once, with every id), leads by id, and
  exactly the answers of per-id `GET`s;
* the spec's cap: 250 ids are three requests of at most 100, and the sandbox refuses 101 as the
  API does (400);
* a failed list request propagates, its parents are left to be asked again (once);
* two lanes asking overlapping parents ask each parent once.
"""
from __future__ import annotations

import threading
from collections import Counter
from urllib.parse import parse_qs

import pytest

from engine_core.providers.pipedrive import writers
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import RequestRejected
from engine_core.providers.pipedrive.writers import IDS_MAX, LEADS_LIST_MIN, SourceAnswers, ask_source
from tests.pipedrive.support import TOKEN, sandbox

KEY = ("db", 1)
GAP = 21  # the sandbox's purged ids: every multiple of 21 (pipedrive_sandbox/data.py GAP_PERIOD)


def _lists_asked(stats: dict) -> dict[str, list[list[str]]]:
    """path -> the `ids` of each `ids=` request to it (sandbox listings counter)."""
    out: dict[str, list[list[str]]] = {}
    for key, n in stats["listings"].items():
        path, _, query = key.partition("?")
        ids = parse_qs(query).get("ids")
        if ids:
            out.setdefault(path, []).extend([ids[0].split(",")] * n)
    return out


def _page_parents(truth: dict) -> tuple[list[tuple[str, str]], dict[tuple[str, str], bool]]:
    """Parents a page may point at, and whether each exists at the source."""
    ids = truth["ids"]
    expected: dict[tuple[str, str], bool] = {}
    for kind, existing in (("organizations", ids["organizations"]), ("persons", ids["persons"]),
                           ("deals", ids["deals"]), ("deals", ids["deals_archived"])):
        for sid in existing[:3]:
            expected[(kind, str(sid))] = True
    for kind in ("organizations", "persons", "deals"):
        top = max(ids[kind] + (ids["deals_archived"] if kind == "deals" else []))
        expected[(kind, str(GAP))] = False  # deleted (purged)
        expected[(kind, str(2 * GAP))] = False
        expected[(kind, str(top + 1000))] = False  # never existed
    expected[("leads", str(ids["leads"][0]).lower())] = True
    expected[("leads", str(ids["leads_archived"][0]).lower())] = True
    expected[("leads", "00000000-0000-4000-8000-000000000000")] = False
    return list(expected), expected


def test_a_pages_parents_are_asked_one_request_per_kind_with_the_answers_of_gets_by_id(monkeypatch) -> None:
    with sandbox() as sb, PipedriveClient(sb.base_url, TOKEN) as client:
        pairs, expected = _page_parents(sb.truth())
        assert {k for k, _ in pairs} == {"organizations", "persons", "deals", "leads"}
        sb.reset_stats()
        batched = ask_source(client, pairs, KEY, answers=SourceAnswers())
        stats = sb.stats()
        monkeypatch.setattr(writers, "BATCH_MIN", 10**9)  # every parent by id: the reference answers
        sb.reset_stats()
        by_id = ask_source(client, pairs, KEY, answers=SourceAnswers())
        singles = sb.stats()["requests"]
    assert by_id == expected, "per-id GETs answer the truth"
    assert batched == by_id
    requests = stats["requests"]
    lists = _lists_asked(stats)
    # one request per kind; deals: the active and the archived list
    assert {p: len(q) for p, q in lists.items()} == {
        "/api/v2/organizations": 1, "/api/v2/persons": 1, "/api/v2/deals": 1, "/api/v2/deals/archived": 1}
    for path, kind in (("/api/v2/organizations", "organizations"), ("/api/v2/persons", "persons"),
                       ("/api/v2/deals", "deals")):
        assert sorted(lists[path][0], key=int) == sorted((s for k, s in pairs if k == kind), key=int)
    assert lists["/api/v2/deals/archived"] == lists["/api/v2/deals"], "both deal lists are asked at once, every id"
    assert requests.get("/v1/leads/{id}") == 3, "leads (v1) take no ids: asked by id"
    for single in ("/api/v2/organizations/{id}", "/api/v2/persons/{id}", "/api/v2/deals/{id}"):
        assert single not in requests
    assert sum(requests.values()) == 7 and sum(singles.values()) == len(pairs)


def test_the_ids_cap_is_one_request_per_100_ids() -> None:
    with sandbox() as sb, PipedriveClient(sb.base_url, TOKEN) as client:
        truth = sb.truth()["ids"]["organizations"]
        pairs = [("organizations", str(i)) for i in range(1, 251)]
        sb.reset_stats()
        out = ask_source(client, pairs, KEY, answers=SourceAnswers())
        lists = _lists_asked(sb.stats())["/api/v2/organizations"]
        # the sandbox refuses more than 100 ids, as the API's spec caps them
        with pytest.raises(RequestRejected):
            client.get("/api/v2/organizations", {"ids": ",".join(str(i) for i in range(1, IDS_MAX + 2))})
    assert out == {p: int(p[1]) in set(truth) for p in pairs}
    assert any(not v for v in out.values()) and any(out.values())
    assert sorted(len(ids) for ids in lists) == [50, 100, 100]
    assert Counter(s for ids in lists for s in ids) == Counter(str(i) for i in range(1, 251)), "each id asked once"


class Source:
    """A source answering `ids=` lists (even ids exist); `fail`: raise on a list request; `hold`:
    the first request waits for `release` (another lane asks meanwhile)."""

    def __init__(self, fail: bool = False, hold: bool = False) -> None:
        self.fail = fail
        self.hold = hold
        self.asked: list[tuple[str, list[str]]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def get(self, path: str, params=None, cancel=None) -> dict:
        assert params and "ids" in params, f"asked by id: {path}"
        ids = params["ids"].split(",")
        with self._lock:
            self.asked.append((path, ids))
            first = len(self.asked) == 1
        if first and self.hold:
            self.entered.set()
            assert self.release.wait(30)
        if self.fail:
            raise RuntimeError("server error after the client's retries")
        return {"success": True, "data": [{"id": int(s)} for s in ids if int(s) % 2 == 0],
                "additional_data": {"next_cursor": None}}


ORGS = [("organizations", str(i)) for i in range(1, 7)]


def test_a_failed_list_request_propagates_and_its_parents_are_asked_again() -> None:
    answers = SourceAnswers()
    failing = Source(fail=True)
    with pytest.raises(RuntimeError, match="server error"):
        ask_source(failing, ORGS, KEY, answers=answers)
    assert [path for path, _ in failing.asked] == ["/api/v2/organizations"], "one list request, no GET by id"
    assert answers.get(KEY, ORGS) == {}, "no answer kept from a failed question"
    again = Source()
    assert ask_source(again, ORGS, KEY, answers=answers) == {p: int(p[1]) % 2 == 0 for p in ORGS}
    assert again.asked == [("/api/v2/organizations", [s for _, s in ORGS])]


def test_two_lanes_asking_overlapping_parents_ask_each_once() -> None:
    answers = SourceAnswers()
    source = Source(hold=True)
    results: dict[str, dict] = {}

    def ask(name: str, pairs) -> None:
        results[name] = ask_source(source, pairs, KEY, answers=answers)

    a = threading.Thread(target=ask, args=("a", ORGS[:4]))
    a.start()
    assert source.entered.wait(30)
    b = threading.Thread(target=ask, args=("b", ORGS[2:]))
    b.start()
    b.join(0.5)  # b asks what a does not ask, then waits for a's answers
    source.release.set()
    a.join(30)
    b.join(30)
    asked = [s for _, ids in source.asked for s in ids]
    assert sorted(asked, key=int) == [s for _, s in ORGS], "each parent asked once"
    assert results["a"] == {p: int(p[1]) % 2 == 0 for p in ORGS[:4]}
    assert results["b"] == {p: int(p[1]) % 2 == 0 for p in ORGS[2:]}


def test_many_leads_are_looked_up_in_the_archived_leads_list_and_remembered_for_later_pages() -> None:
    """Leads take no `ids`: `LEADS_LIST_MIN` or more at once are looked up in the archived leads'
    list (one request instead of a `GET` each), the ones it does not serve asked by id (an active
    lead, a deleted one: the answers of `GET`s by id), and every archived lead it served answers a
    later page without a request."""
    with sandbox(scale="small") as sb, PipedriveClient(sb.base_url, TOKEN) as client:  # 44 archived leads
        ids = sb.truth()["ids"]
        archived = [str(i).lower() for i in ids["leads_archived"]]
        assert len(archived) > LEADS_LIST_MIN, "the account must have more archived leads than one question asks"
        gone = ("leads", "00000000-0000-4000-8000-000000000000")
        active = ("leads", str(ids["leads"][0]).lower())
        pairs = [("leads", sid) for sid in archived[:LEADS_LIST_MIN]] + [active, gone]
        answers = SourceAnswers()
        sb.reset_stats()
        out = ask_source(client, pairs, KEY, answers=answers)
        first = sb.stats()["requests"]
        sb.reset_stats()
        later = ask_source(client, [("leads", archived[-1])], KEY, answers=answers)
        again = sb.stats()["requests"]
    assert out == {**dict.fromkeys(pairs, True), gone: False}
    assert first == {"/v1/leads/archived": 1, "/v1/leads/{id}": 2}, first
    assert later == {("leads", archived[-1]): True} and sum(again.values()) == 0, again
