"""Issue 11: what a run's start costs at the source and in CPU, whatever its width. The lanes of a
process ask `/v1/users/me` for the company their settings reach once per run (each lane asked,
before its first claim), the run's field definitions are read by one lane while the others wait for its book
(each walker of the first entity phase read all six lists), and every client of the process shares
one TLS context (each built its own: ~15 ms of CPU reading the CA bundle). Real sandbox, real lanes.
"""
from __future__ import annotations

from typing import Any

from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core import runs
from engine_core.providers.pipedrive import provider as provider_module
from engine_core.worker import drain_threads
from tests.pipedrive.support import FAST, for_run, migrate, sandbox, start

FIELD_LISTS = ("/api/v2/dealFields", "/api/v2/personFields", "/api/v2/organizationFields",
               "/api/v2/activityFields", "/v1/leadFields", "/v1/noteFields")


def test_four_lanes_ask_for_the_company_once_and_read_the_field_definitions_once(db) -> None:
    with sandbox() as sb:
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "persons"], width=4)
        requests = sb.stats()["requests"]
    assert run.status == "succeeded"
    # once in all: the start's identity answer also dates the snapshot, and the lanes reuse the identity
    assert requests.get("/v1/users/me") == 1, requests
    assert {path: requests.get(path) for path in FIELD_LISTS} == dict.fromkeys(FIELD_LISTS, 1), requests


def test_clients_share_one_tls_context() -> None:
    def context(client: PipedriveClient):
        return client._http._transport._pool._ssl_context

    a, b = PipedriveClient("https://example.invalid", "t1"), PipedriveClient("https://example.invalid", "t2")
    try:
        assert context(a) is context(b)
    finally:
        a.close()
        b.close()


def test_a_discovery_asks_its_walkers_first_pages_ahead(db) -> None:
    """Issue 11: a discovery asks its walkers' first pages as it seeds them, so each walker starts
    with its page in hand (`prefetch.Prefetch`); every page asked ahead is taken, none asked twice
    (the sandbox's count of list requests is unchanged). Persons' discovery runs early, in the
    organizations' tail: its pages are taken once the barrier lets the walkers run."""
    from engine_core.providers.pipedrive import prefetch

    with sandbox() as sb:
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "persons"], width=4)
        requests = sb.stats()["requests"]
    assert run.status == "succeeded"
    walkers = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s"
                     " AND kind IN ('organizations', 'persons') AND cursor_key LIKE '%%:p0'", {"r": run.id})[0]["n"]
    (store,) = [s for scope, s in prefetch._prefetch_stores.items() if scope[:2] == (db.url, run.id)]
    assert walkers >= 1 and store.asked + store.held >= walkers, (store.asked, store.held, walkers)
    assert store.taken == store.asked
    persons_pages = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'persons'"
                           " AND cursor_key LIKE '%%:p%%'", {"r": run.id})[0]["n"]
    catchup = db.sql("SELECT count(*) AS n FROM migration_inventory WHERE migration_id = %(r)s AND kind = 'persons'",
                     {"r": run.id})[0]["n"]
    # tiny's persons fit the discovery's first page, which its one walker takes: discovery, catch-up
    assert persons_pages == 1 and store.held >= 1
    assert catchup and requests["/api/v2/persons"] == 1 + 1, requests
    # the catch-up's walk dropped what the walks before it had asked ahead (walk_proof)
    assert store.cut_at == len(run.plan) - 1 and "catchup" in run.plan[store.cut_at], (store.cut_at, run.plan)


def test_an_early_discovery_asks_the_first_pages_of_the_phase_after_its_own(db, monkeypatch) -> None:
    """Persons' discovery runs early, in the organizations' phase; it asks the deals discovery's
    sorted first page and the leads' first page (the phase after persons) ahead, on the store's
    threads, so the deals discovery starts with its page in hand. Every page asked ahead is taken;
    no list is asked more than its walk and the catch-up ask (tiny: one page each)."""
    import threading

    from engine_core.providers.pipedrive import prefetch, stripes

    asked: list[tuple[str, str, dict]] = []
    real = PipedriveClient._attempt

    def attempt(self, path, query, reservation=None):
        asked.append((threading.current_thread().name, path, dict(query)))
        return real(self, path, query, reservation)

    monkeypatch.setattr(PipedriveClient, "_attempt", attempt)
    with sandbox() as sb:
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "persons", "deals", "leads"], width=4)
        requests = sb.stats()["requests"]
    assert run.status == "succeeded"
    (store,) = [s for scope, s in prefetch._prefetch_stores.items() if scope[:2] == (db.url, run.id)]
    assert store.taken == store.asked, (store.taken, store.asked)
    deals_first = [name for name, path, query in asked
                   if path == "/api/v2/deals" and query.get("sort_by") == stripes.SORTED["sort_by"] and "cursor" not in query]
    assert deals_first and all(name.startswith("prefetch") for name in deals_first), deals_first
    assert requests["/api/v2/deals"] == 1 + 1 and requests["/v1/leads"] == 1 + 1, requests  # the walks' and the catch-up's


def test_a_run_without_the_fields_kind_asks_the_field_lists_as_its_first_discovery_lists(db, monkeypatch) -> None:
    """The field lists are asked when the first discovery starts, beside its first page (each once):
    under latency the run's first page was mapped a round trip of the field lists after its discovery."""
    import threading
    import time

    asked: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    real = PipedriveClient._attempt

    def attempt(self, path, query, reservation=None):
        started = time.monotonic()
        try:
            return real(self, path, query, reservation)
        finally:
            with lock:
                asked.append((path, started, time.monotonic()))

    monkeypatch.setattr(PipedriveClient, "_attempt", attempt)
    with sandbox(latency="realistic:0.2") as sb:  # a list ~60 ms: the field lists start well before one ends
        sb.reset_stats()
        run = migrate(db, sb, kinds=["organizations", "persons"], width=4)
        requests = sb.stats()["requests"]
    assert run.status == "succeeded"
    assert {path: requests.get(path) for path in FIELD_LISTS} == dict.fromkeys(FIELD_LISTS, 1), requests
    first_page = min(end for path, _, end in asked if path in ("/api/v2/organizations", "/api/v2/persons"))
    fields = [started for path, started, _ in asked if path in FIELD_LISTS]
    assert len(fields) == len(FIELD_LISTS) and max(fields) < first_page, sorted(asked, key=lambda a: a[1])



def _unpaced(monkeypatch) -> list[str]:
    """The paths of the requests sent from now on outside the account's budget (no budget, no slot)."""
    unpaced: list[str] = []
    attempt = PipedriveClient._attempt

    def watched(self: PipedriveClient, path: str, query: Any, reservation: Any) -> Any:
        if self._budget is None and reservation is None:
            unpaced.append(path)
        return attempt(self, path, query, reservation)

    monkeypatch.setattr(PipedriveClient, "_attempt", watched)
    return unpaced


def test_every_request_of_a_run_is_paced_by_the_accounts_budget(db, monkeypatch) -> None:
    """The budget's proof holds only if every request to the account takes a slot: the identity's
    `/v1/users/me` at the run's start (which also dates the snapshot) went out unpaced, the one
    request beyond the burst window's limit when the schedule filled a window (a 429 at the email
    bench's turn from idle to busy)."""
    unpaced = _unpaced(monkeypatch)
    with sandbox() as sb:
        sb.reset_stats()
        run = start(db, sb, kinds=["organizations"])
        provider_module._identities.clear()  # as a worker process of its own asks again
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        requests = sb.stats()["requests"]
    assert runs.get_run(db, run.id).status == "succeeded"
    assert requests.get("/v1/users/me") == 2, requests  # the start's, and the lanes' process's
    assert unpaced == []


def test_the_launch_and_the_lane_sensor_ask_the_identity_through_the_accounts_budget(db, monkeypatch) -> None:
    """A tenant's launch checks that its settings reach the company of the tenant's data, and the lane
    sensor that a run's source is the deployment's: each one `/v1/users/me`, taken from the same
    budget as the runs' requests (a launch beside a busy run of the same account would otherwise go
    out beyond the burst window's limit)."""
    from types import SimpleNamespace

    from migration_pipeline.launch.checks import check_tenant_source
    from migration_pipeline.sensors import _identities, same_source

    with sandbox() as sb:
        run = start(db, sb, kinds=["organizations"])
        unpaced = _unpaced(monkeypatch)
        provider_module._identities.clear()  # as a launch's and the daemon's processes ask
        sb.reset_stats()
        check_tenant_source(db, run.tenant_id, run.source)
        provider_module._identities.clear()
        _identities.clear()
        context = SimpleNamespace(log=SimpleNamespace(info=lambda *a, **k: None))
        assert same_source(context, run, db)
        requests = sb.stats()["requests"]
    assert requests.get("/v1/users/me") == 2, requests
    assert unpaced == []
