"""Cursors and stripes as data: v1 kinds walk from four pages and hand on start + 4 x 500; v2
kinds are cut into four update_time spans that cover everything (open at both ends, never
overlapping); email tasks are ten deals, keyed so a retried discovery page finds them again. The
provider seeds each kind without I/O."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from engine_core.models import Run
from engine_core.providers.pipedrive import stripes
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.providers.pipedrive.provider import PipedriveProvider


def test_v1_kinds_stripe_by_page_arithmetic() -> None:
    seeds = stripes.v1_seeds("notes")
    assert [(s.cursor_key, s.cursor) for s in seeds] == [(f"notes:{n}", {"start": n}) for n in (0, 500, 1000, 1500)]
    nxt = stripes.v1_next("notes", 1000)
    assert (nxt.cursor_key, nxt.cursor) == ("notes:3000", {"start": 3000})


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
    assert keys["users"] == ["users:0", "users:500", "users:1000", "users:1500"]
    assert keys["organizations"] == ["organizations:discover"]
    assert keys["emails"] == ["emails:discover:deals:p0", "emails:discover:deals_archived:p0"]
    assert provider.phases() == [list(g) for g in PHASES]
