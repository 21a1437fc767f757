"""Cursors and stripes as data: v1 kinds walk from four pages and hand on span + 4 x 500 - but
only when the API's `more_items_in_collection` says more, and a short page the API says is not the
last goes on at its `next_start` inside its span; v2 kinds are cut into four update_time spans
that cover every timed row (open at both ends, never overlapping), plus a walker for null-time
rows when there are any; email tasks are ten deals, keyed so a retried discovery page finds them
again. The provider seeds each kind without I/O."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from engine_core.models import Run
from engine_core.providers.pipedrive import stripes
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.providers.pipedrive.provider import PipedriveProvider


def test_v1_kinds_stripe_by_page_arithmetic() -> None:
    seeds = stripes.v1_seeds("notes", walked=2)
    assert [(s.cursor_key, s.cursor) for s in seeds] == [(f"notes:{n}", {"start": n}) for n in (1000, 1500, 2000, 2500)]
    nxt = stripes.v1_next("notes", 1000, walked=2)
    assert [(s.cursor_key, s.cursor) for s in nxt] == [("notes:3000", {"start": 3000})]


def _after(cursor, more, next_start):
    s = stripes.v1_after("notes", cursor, more=more, next_start=next_start, walked=1)
    assert len(s) <= 1 or cursor["start"] < 500, s  # a striped span hands on to one span at most
    return None if not s else (s[0].cursor_key, s[0].cursor)


def test_v1_hand_on_is_decided_by_the_api_fields() -> None:
    first = {"start": 500}
    # a full page: the stripe's next span
    assert _after(first, True, 1000) == ("notes:2500", {"start": 2500})
    # the API says no more: the stripe ends, however full the page was
    assert _after(first, False, None) is None
    # a short page (the server capped limit at 15) that is not the last: same span, at next_start
    assert _after(first, True, 515) == ("notes:515", {"start": 515, "span": 500})
    sub = {"start": 515, "span": 500}
    assert stripes.v1_limit(first) == 500 and stripes.v1_limit(sub) == 485
    assert _after(sub, True, 530) == ("notes:530", {"start": 530, "span": 500})
    # the sub-page that reaches the span's end hands on to the stripe's next span
    assert _after({"start": 995, "span": 500}, True, 1000) == ("notes:2500", {"start": 2500})
    # next_start wins over arithmetic inside the span; past the span's end the span is done
    assert _after(first, True, 742) == ("notes:742", {"start": 742, "span": 500})
    assert _after(sub, True, 1100) == ("notes:2500", {"start": 2500})
    # an empty page that still says more goes on too
    assert _after({"start": 0}, True, 10) == ("notes:10", {"start": 10, "span": 0})


def test_v1_cursors_that_cannot_be_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="more_items_in_collection without a next_start"):
        stripes.v1_after("notes", {"start": 0}, more=True, next_start=None)
    with pytest.raises(ValueError, match="not inside a span"):
        stripes.v1_limit({"start": 1000, "span": 500})
    with pytest.raises(ValueError, match="not a v1 listing cursor"):
        stripes.v1_limit({"begin": 0})


def test_v1_sub_page_keys_never_collide_with_span_keys() -> None:
    spans = {"notes:0"} | {s.cursor_key for n in range(0, 8000, 500) for s in stripes.v1_next("notes", n)}
    subs = {k.cursor_key for n in range(0, 8000, 7) if (n + 1) % 500
            for k in stripes.v1_after("notes", {"start": n - n % 500, "span": n - n % 500}, more=True, next_start=n + 1)}
    assert len(spans) == 8000 // 500 + 4 and not spans & subs


def _covers(spans, moment: datetime) -> int:
    text = stripes.rfc3339(moment)
    return sum(1 for since, until in spans if (since is None or since <= text) and (until is None or text < until))


def test_update_time_spans_cover_everything_once() -> None:
    oldest = datetime(2019, 1, 1, tzinfo=timezone.utc)
    newest = datetime(2026, 7, 1, 12, 30, 15, tzinfo=timezone.utc)
    spans = stripes.time_spans(oldest, newest)
    assert len(spans) == 4 and spans[0][0] is None and spans[-1][1] is None
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), "contiguous: each until is the next since"
    for moment in (oldest - timedelta(days=400), oldest, newest, newest + timedelta(days=30),
                   *(oldest + (newest - oldest) * k / 7 for k in range(8))):
        assert _covers(spans, moment) == 1, moment
    # a history of two seconds cannot make four spans: fewer, never empty ones
    assert len(stripes.time_spans(oldest, oldest + timedelta(seconds=1))) == 2
    assert stripes.time_spans(None, None) == [(None, None)] == stripes.time_spans(oldest, oldest)


def test_v2_walkers_carry_their_span_and_cursor() -> None:
    seeds = stripes.v2_stripe_seeds("deals", [(None, "2020-01-01T00:00:00Z"), ("2020-01-01T00:00:00Z", None)])
    assert [s.cursor_key for s in seeds] == ["deals:s0:p0", "deals:s1:p0"]
    assert stripes.v2_params(seeds[0].cursor) == {"updated_until": "2020-01-01T00:00:00Z"}
    nxt = stripes.v2_next("deals", seeds[1].cursor, "abc")
    assert nxt.cursor_key == "deals:s1:p1" and nxt.cursor["cursor"] == "abc"
    assert stripes.v2_params(nxt.cursor) == {"updated_since": "2020-01-01T00:00:00Z"}


def test_a_null_walker_is_seeded_only_when_nulls_exist_and_the_spans_are_bounded() -> None:
    spans = [(None, "2020-01-01T00:00:00Z"), ("2020-01-01T00:00:00Z", None)]
    assert [s.cursor_key for s in stripes.v2_stripe_seeds("deals", spans)] == ["deals:s0:p0", "deals:s1:p0"]
    seeds = stripes.v2_stripe_seeds("deals", spans, nulls=True)
    assert [s.cursor_key for s in seeds] == ["deals:s0:p0", "deals:s1:p0", "deals:nulls:p0"]
    walker = seeds[-1].cursor
    assert stripes.is_null_walker(walker) and stripes.v2_params(walker) == {}  # the unfiltered list
    nxt = stripes.v2_next("deals", walker, "c1")
    assert nxt.cursor_key == "deals:nulls:p1" and stripes.is_null_walker(nxt.cursor) and nxt.cursor["cursor"] == "c1"
    # one unbounded span is the unfiltered list already
    assert [s.cursor_key for s in stripes.v2_stripe_seeds("deals", [(None, None)], nulls=True)] == ["deals:s0:p0"]
    assert stripes.has_null_time({"id": 1, "update_time": None}) and stripes.has_null_time({"id": 1})
    assert not stripes.has_null_time({"id": 1, "update_time": "2020-01-01T00:00:00Z"})
    assert not stripes.has_null_time({"id": 1, "update_time": "garbage"})  # a time, if a bad one: a span has it


def test_email_tasks_are_ten_deals_with_stable_keys() -> None:
    cursor = {"discover": "deals", "page": 3, "cursor": "x"}
    tasks = stripes.email_tasks(cursor, list(range(1, 26)))
    assert [len(t.cursor["deals"]) for t in tasks] == [10, 10, 5]
    assert [t.cursor_key for t in tasks] == ["emails:deals:p3:c0", "emails:deals:p3:c1", "emails:deals:p3:c2"]
    assert [t.cursor_key for t in stripes.email_tasks(cursor, list(range(1, 26)))] == [t.cursor_key for t in tasks]
    assert stripes.email_discovery_next(cursor, "y").cursor_key == "emails:discover:deals:p4"


def test_the_provider_seeds_every_kind_without_io() -> None:
    provider = PipedriveProvider(env={})  # no configuration at all: seeding needs none
    run = Run(id=1, tenant_id="t", source="pipedrive", source_account="a", status="running", current_phase=0,
              plan=tuple(tuple(g) for g in PHASES), options={}, dry_run=False, cancel_requested=False)
    keys = {k: [s.cursor_key for s in provider.seed_cursors(run, k)] for g in PHASES for k in g}
    assert keys["fields"] == ["fields:all"]
    assert keys["users"] == ["users:0"]  # the other stripes only when its first page says more
    assert keys["organizations"] == ["organizations:discover"]
    assert keys["emails"] == ["emails:discover:deals:p0", "emails:discover:deals_archived:p0"]
    # the data phases, then the catch-up (issue 9): the last phase of every run
    assert provider.phases() == [list(g) for g in PHASES] + [["catchup"]]
    assert [s.cursor_key for s in provider.seed_cursors(run, "catchup")], "the catch-up seeds its tasks"


def test_a_v1_list_is_one_walker_until_it_proves_long_then_four_stripes() -> None:
    """The first STRIPE_MIN_PAGES spans are one walker's, span after span; the last of them, when
    the API says more, seeds the four stripes' first spans, each of which hands on span + 4 x 500.
    A list that ends within those pages asks one call a page (no empty pages of idle stripes)."""
    def keys(cursor, more, next_start, walked=4):
        return [s.cursor_key for s in stripes.v1_successors("notes", cursor, more=more, next_start=next_start, walked=walked)]

    assert keys({"start": 0}, True, 500) == ["notes:500"]
    assert keys({"start": 500}, False, None) == []
    assert keys({"start": 1000}, True, 1500) == ["notes:1500"]
    assert keys({"start": 1500}, True, 2000) == ["notes:2000", "notes:2500", "notes:3000", "notes:3500"]
    assert keys({"start": 2500}, True, 3000) == ["notes:4500"]
    # a capped server's sub-pages: the walker goes on inside its span, the span's end hands on
    assert keys({"start": 0}, True, 15) == ["notes:15"]
    assert keys({"start": 485, "span": 0}, True, 500) == ["notes:500"]
    assert keys({"start": 1985, "span": 1500}, True, 2000) == ["notes:2000", "notes:2500", "notes:3000", "notes:3500"]
    # the default is the module's rule
    assert keys({"start": 0}, True, 500, None) == ["notes:500"]


def test_every_offset_of_a_v1_list_is_asked_once_and_only_three_empty_pages_past_its_end() -> None:
    """Walking the successors of a list of n pages (the API says more while start + 500 < rows):
    every span up to the end is asked exactly once, and a striped list asks three spans past it."""
    for walked in (1, 2, 4):
        for rows in (1, 499, 500, 501, 1999, 2000, 2001, 4000, 4001, 7777):
            asked, queue = [], [0]
            while queue:
                start = queue.pop()
                asked.append(start)
                more = start + 500 < rows
                queue += [s.cursor["start"] for s in stripes.v1_successors(
                    "notes", {"start": start}, more=more, next_start=start + 500 if more else None, walked=walked)]
            n = max(1, -(-rows // 500))
            assert sorted(a for a in asked if a < rows or a == 0) == [i * 500 for i in range(n)], (walked, rows)
            assert len(asked) == len(set(asked)) == (n if n <= walked else n + 3), (walked, rows, sorted(asked))
