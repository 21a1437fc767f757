"""`migrate plan`'s estimate (`PipedriveProvider.estimate`) against what a real run then spends,
by the sandbox's own counters, at three sizes: tiny and small with mail, and a stand-in of the seed
customer (its counts divided by 40, lists of several pages that stripe) without. Requests and
tokens within 10% of the run's; the CLI prints the same figures."""
from __future__ import annotations

import dataclasses

import pytest

from engine_core.providers.pipedrive import estimate as pd_estimate
from engine_core.providers.pipedrive import kinds as pd_kinds
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.provider import PipedriveProvider
from tests.pipedrive.support import TOKEN, failed_tasks, migrate, sandbox

SEED_DIVISOR = 40


@pytest.fixture
def scaled_seed(monkeypatch):
    """The seed customer's spec with every count divided by SEED_DIVISOR, for this test only (the
    process's cached datasets are dropped before and after, so no other test meets the stand-in)."""
    from pipedrive_sandbox import data

    spec = data.SCALE_SPECS["seed-customer"]
    counts = {f.name: max(1, getattr(spec, f.name) // SEED_DIVISOR) for f in dataclasses.fields(spec)
              if f.type in ("int", int) and f.name not in ("pipelines", "stages_per_pipeline")}
    monkeypatch.setitem(data.SCALE_SPECS, "seed-customer",
                        dataclasses.replace(spec, **counts, big_deal_messages=spec.big_deal_messages // SEED_DIVISOR))
    data.dataset_for.cache_clear()
    yield
    data.dataset_for.cache_clear()


# the six kinds a plain loader reads: the archived lists are walked only to settle parents
SIX = ["organizations", "persons", "deals", "leads", "activities", "notes"]


@pytest.mark.parametrize("scale, mail, six", [("tiny", True, False), ("small", True, False),
                                              ("seed-customer", False, False), ("small", False, True)])
def test_the_plan_is_within_ten_percent_of_the_runs_spend(db, request, scale: str, mail: bool, six: bool) -> None:
    if scale == "seed-customer":
        request.getfixturevalue("scaled_seed")
    kinds = SIX if six else [k.name for k in pd_kinds.KINDS if k.default and (mail or k.name != "emails")]
    with sandbox(scale=scale, daily_budget=10_000_000) as sb:
        est = PipedriveProvider(base_url=sb.base_url).estimate(kinds, share=0.8)
        sb.reset_stats()
        run = migrate(db, sb, kinds=kinds)
        spent = sb.stats()
    assert run.status == "succeeded", failed_tasks(db, run.id)
    requests, tokens = spent["requests_total"], spent["tokens_total"]
    assert abs(est.requests - requests) <= 0.1 * requests, (est.requests, requests, [vars(k) for k in est.kinds])
    assert abs(est.tokens - tokens) <= 0.1 * tokens, (est.tokens, tokens, [vars(k) for k in est.kinds])
    assert est.daily_limit == 10_000_000 and est.days == pytest.approx(est.tokens / 8_000_000)
    assert est.burst_limit > 0 and est.burst_seconds == pytest.approx(est.requests * 2 / est.burst_limit)
    assert est.wall_seconds == max(est.burst_seconds, est.trip_seconds)
    assert {k.kind for k in est.opt_in} == {k.name for k in pd_kinds.KINDS if not k.default}
    assert all(k.requests > 0 and k.tokens > 0 for k in est.opt_in)


def test_migrate_plan_prints_the_figures_per_kind_with_the_opt_in_prices(monkeypatch) -> None:
    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    with sandbox(daily_budget=1_000_000) as sb:
        result = CliRunner().invoke(main, ["plan", "acme"], catch_exceptions=False)
        bad = CliRunner().invoke(main, ["plan", "no/such"])
        alone = CliRunner().invoke(main, ["plan", "acme", "--kinds", "emails"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "link to" not in result.output  # the defaults take every parent
    assert "asking the source for its counts" in result.output  # not half a minute of silence under latency
    assert alone.exit_code == 0 and "emails link to deals" in alone.output, alone.output  # every message skipped
    lines = result.output.splitlines()
    assert any(line.startswith("persons ") for line in lines) and any(line.startswith("total ") for line in lines)
    assert "1,000,000 tokens a day" in result.output and "80% share" in result.output
    assert "opt-in deal_history: +" in result.output and "--kinds +deal_history" in result.output
    assert bad.exit_code == 2 and "TENANT" in bad.output


class Clock:
    """A test clock and a client over a real one whose requests take `answers` seconds of it (by
    method): `now` moves only when a request answers or the counting sleeps; `sent` keeps each
    request's send time."""

    def __init__(self, client: PipedriveClient, answers: dict[str, float]) -> None:
        self.now = 0.0
        self.sent: list[float] = []
        self.client, self.answers = client, answers

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def __getattr__(self, name: str):
        real = getattr(self.client, name)
        if name not in self.answers:
            return real

        def answered(*args, **kw):
            self.sent.append(self.now)
            out = real(*args, **kw)
            self.now += self.answers[name]
            return out
        return answered

    def counter(self, burst_limit: int) -> pd_estimate.Counter:
        return pd_estimate.Counter(self, burst_limit, clock=lambda: self.now, sleep=self.sleep)


ANSWERS = {"list_v2": 0.3, "list_v1": 0.3, "get": 0.2, "mail_messages": 0.4, "mail_body": 1.0}


def test_the_wall_time_is_the_round_trips_the_plan_measured_over_the_requests_in_flight() -> None:
    """Under latency the run's wall time is its round trips, not the burst floor: each class of
    request at the median the counting measured (a mail body sampled too), over the requests a run
    keeps in flight; the longer of that and the burst floor."""
    with sandbox(scale="tiny") as sb, PipedriveClient(sb.base_url, TOKEN) as client:
        clock = Clock(client, ANSWERS)
        est = pd_estimate.estimate(clock, kinds=[k.name for k in pd_kinds.KINDS if k.default], share=0.8,
                                   burst_limit=80, lane_width=4, counter=clock.counter(80))
    assert est.round_trips == pytest.approx({"list": 0.3, "single": 0.2, "mail listing": 0.4, "body": 1.0})
    emails = next(k for k in est.kinds if k.kind == "emails")
    listings = emails.requests - emails.rows - 2  # after the walk of the two deal lists, a page each on tiny
    assert emails.seconds == pytest.approx(2 * 0.3 + listings * 0.4 + emails.rows * 1.0)
    assert est.in_flight == pytest.approx(pd_estimate.IN_FLIGHT_PER_SLOT * 4)
    assert est.trip_seconds == pytest.approx(sum(k.seconds for k in est.kinds) / est.in_flight)
    assert est.wall_seconds == est.trip_seconds > est.burst_seconds == pytest.approx(est.requests * 2 / 80)


def test_the_plans_counting_keeps_to_half_the_burst_limit() -> None:
    """No 2 s window holds more than half the burst limit of the counting's requests (82 unpaced
    requests met the 80-per-2-s burst on a source without latency)."""
    with sandbox(scale="tiny") as sb, PipedriveClient(sb.base_url, TOKEN) as client:
        clock = Clock(client, dict.fromkeys(ANSWERS, 0.001))
        pd_estimate.estimate(clock, kinds=["persons", "deals", "emails"], share=0.8, burst_limit=20,
                             lane_width=4, counter=clock.counter(20))
    sent = clock.sent
    assert len(sent) > 20
    assert max(sum(1 for t in sent if start <= t < start + 2.0) for start in sent) == 10


def test_the_plan_stripes_a_v2_list_as_its_discovery_will() -> None:
    """The discovery sizes a list by its first page's pace up to now, not up to the newest update
    the plan's count reads: a list of three pages whose first page's pace runs to 9,000 rows by
    now is striped by the engine (probes, partial pages, the deals summary), and the plan says so."""
    from datetime import datetime, timedelta, timezone

    persons, deals = pd_kinds.BY_NAME["persons"], pd_kinds.BY_NAME["deals"]
    assert pd_estimate.listing(persons, 1500) == 3
    assert pd_estimate.listing(persons, 1500, sized=9000) == pd_estimate.PROBES + 3 + pd_estimate.STRIPE_PARTIALS
    assert pd_estimate.striped(deals, 1500, sized=9000) and not pd_estimate.striped(deals, 1500, sized=1500)
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    page = [{"id": i, "update_time": (now - timedelta(days=100 - i / 10)).strftime("%Y-%m-%dT%H:%M:%SZ")}
            for i in range(500)]  # 500 rows over 50 days, the oldest 100 days ago: about 1,000 rows by now
    assert 990 <= pd_estimate.sized_by_discovery(page, now) <= 1010
