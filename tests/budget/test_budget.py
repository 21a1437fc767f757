"""The budget row on real Postgres: chunks are leased with one statement each; waiting threads get
their slots at once and the rest of a chunk is spread at the sustained rate; racing leases never
lose one another's slots, and no window of W + d ever holds more than L of them nor d more than B;
1,000 requests cost ~1000/chunk statements, a
burst 429 pauses every worker with one write, a spent daily budget parks every worker sharing the
account without a call to the source, a fetch round's reserved slots are spent with no database,
and stops end a wait early.
"""
from __future__ import annotations

import threading
from contextlib import ExitStack
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
import time

import httpx
import pytest

from engine_core.budget import Budget, BudgetCancelled
from engine_core.budget_waiting import waiting_state
from engine_core.db import Database
from engine_core.errors import RateLimitParked
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.retry import rate_observation
from engine_core.providers.pipedrive.errors import Cancelled
from engine_core.source import RateObservation

SEEN = RateObservation(limit=80, remaining=70, reset=1.0)


def row(db: Database, account: str = "acct") -> dict:
    (found,) = db.sql("SELECT * FROM source_budgets WHERE source = 'pipedrive' AND account = %(a)s", {"a": account})
    return found


def recent(db: Database, account: str = "acct") -> list[float]:
    """The row's granted slot times (database epoch seconds, oldest first)."""
    return list(row(db, account)["recent"])


def log_leases(db: Database) -> None:
    """A trigger logging each granted lease's row state before and after (`granted_slots` reads it)."""
    db.sql("CREATE TABLE lease_log (id bigserial PRIMARY KEY, old_recent float8[], new_recent float8[], n int)")
    db.sql(
        "CREATE FUNCTION log_lease() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.leases > OLD.leases THEN"
        " INSERT INTO lease_log (old_recent, new_recent, n) VALUES (OLD.recent, NEW.recent, NEW.slots_leased - OLD.slots_leased);"
        " END IF; RETURN NEW; END $$"
    )
    db.sql("CREATE TRIGGER log_lease AFTER UPDATE ON source_budgets FOR EACH ROW EXECUTE FUNCTION log_lease()")


def granted_slots(db: Database, limit: int) -> tuple[list[float], int]:
    """Every slot the account was granted since `log_leases`, in order, asserting that in commit
    order each lease built on every slot granted before it (no lost update); and the leases' number."""
    log = db.sql("SELECT old_recent, new_recent, n FROM lease_log ORDER BY id")
    granted: list[float] = list(log[0]["old_recent"]) if log else []
    for entry in log:
        assert list(entry["old_recent"]) == pytest.approx(granted[-limit:], abs=1e-9)
        granted += list(entry["new_recent"])[-entry["n"]:]
        assert list(entry["new_recent"]) == pytest.approx(granted[-limit:], abs=1e-9)
    return granted[len(log[0]["old_recent"]) if log else 0:], len(log)


def test_first_lease_creates_the_row_and_a_lone_thread_s_chunk_is_spread(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=1.0, latency_margin=0.25)
    assert budget.spacing() == pytest.approx(3.25 / 80)  # per slot: (W + ttl + margin) / L
    times = []
    started = time.monotonic()
    for _ in range(17):
        budget.acquire()
        times.append(time.monotonic() - started)
    stats = budget.stats()
    assert stats.leases == 3 and stats.slots_leased == 24 and stats.slots_spent == 17
    assert stats.statements == 5  # a lease that found no row, the insert, then three leases
    assert stats.writes == 4  # the insert and three granted leases
    # one thread waited for each lease: its first slot at once, the rest g apart, each waited for
    for j in range(1, 8):
        assert times[j] >= j * budget.spacing() - 0.005
    slots = recent(db)
    assert len(slots) == 24
    for chunk in (slots[:8], slots[8:16], slots[16:]):
        assert [b - a for a, b in zip(chunk, chunk[1:])] == pytest.approx([budget.spacing()] * 7, abs=1e-5)
    found = row(db)
    assert found["leases"] == 3 and found["slots_leased"] == 24 and found["burst_limit"] == 80


def test_waiting_threads_start_at_once_into_half_a_window_then_evenly(db: Database) -> None:
    # L = 16 per W + d = 0.5 + 1.0 + 0.05 s; a reservation of 4 is four threads waiting at once,
    # held by six workers, not spent: the schedule is the row's, whatever the workers then do
    budgets = [Budget(db, "pipedrive", "acct", burst_limit=16, window_seconds=0.5, chunk=4, lease_ttl=1.0,
                      latency_margin=0.05, burst_slots=16) for _ in range(6)]
    horizon = budgets[0].horizon
    with ExitStack() as held:
        held.enter_context(budgets[0].reserve(4))  # the row exists: every reservation below is a logged lease
        log_leases(db)
        for b in budgets[1:]:
            held.enter_context(b.reserve(4))
    slots, leases = granted_slots(db, 16)
    assert leases == 5 and len(slots) == 20 and len(recent(db)) == 16  # the row keeps the last L
    # the second lease's four start together, as the first's did: the window held fewer than L / 2 ...
    assert len(set(slots[:4])) == 1
    # ... then, half the window used, each slot comes g after the one before (the sustained rate) ...
    g = budgets[0].spacing()
    assert all(b - a >= g - 1e-6 for a, b in zip(slots[3:], slots[4:]))
    # ... and none earlier than W + d after the L-th before it: no L + 1 in W + d
    every = list(db.sql("SELECT old_recent FROM lease_log ORDER BY id LIMIT 1")[0]["old_recent"]) + slots
    assert len(every) == 24 and all(b - a >= horizon - 1e-5 for a, b in zip(every, every[16:]))


def test_the_row_is_one_per_account_not_per_tenant(db: Database) -> None:
    a = Budget(db, "pipedrive", "acct", burst_limit=80)
    b = Budget(db, "pipedrive", "acct", burst_limit=80)
    c = Budget(db, "pipedrive", "other", burst_limit=80)
    for budget in (a, b, c):
        budget.acquire()
    rows = db.sql("SELECT account, leases FROM source_budgets ORDER BY account")
    # Each budget leased at least once; a slot that expired before its turn (a loaded machine: the
    # lease statement slower than the ttl) is leased again, so count what each budget says it did.
    assert [r["account"] for r in rows] == ["acct", "other"]
    assert rows[0]["leases"] == a.stats().leases + b.stats().leases and a.stats().leases >= 1 and b.stats().leases >= 1
    assert rows[1]["leases"] == c.stats().leases >= 1


def test_statements_per_thousand_requests(db: Database) -> None:
    # Count every UPDATE the table sees with a trigger, independently of the Budget's own counter.
    db.sql("CREATE TABLE budget_updates (n bigint NOT NULL)")
    db.sql("INSERT INTO budget_updates VALUES (0)")
    db.sql(
        "CREATE FUNCTION count_budget_update() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN UPDATE budget_updates SET n = n + 1; RETURN NEW; END $$"
    )
    db.sql("CREATE TRIGGER count_budget_update AFTER UPDATE ON source_budgets FOR EACH ROW EXECUTE FUNCTION count_budget_update()")
    # A limit high enough that pacing takes under a second; the statement count does not depend on it.
    budget = Budget(db, "pipedrive", "acct", burst_limit=4000, chunk=8)
    budget.acquire()  # create the row outside the measurement
    db.sql("UPDATE budget_updates SET n = 0")
    before = budget.stats()
    counter = iter(range(1000))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            budget.acquire()
            budget.observe(replace(SEEN, limit=4000, daily_limit=300000, daily_remaining=290000 - i))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = budget.stats()
    statements = after.statements - before.statements
    updates = db.sql("SELECT n FROM budget_updates")[0]["n"]
    print(f"\nbudget row per 1,000 requests: {statements} statements by the Budget, {updates} UPDATEs seen by the trigger (chunk 8)")
    assert after.slots_spent - before.slots_spent == 1000
    assert statements <= 1000 / 8 * 2 and updates <= 1000 / 8 * 2
    assert updates <= statements
    # the headers rode along on the leases: the row knows the daily budget without extra writes
    assert row(db)["daily_limit"] == 300000 and row(db)["daily_remaining"] is not None


def test_burst_429_pauses_every_worker_with_one_write(db: Database) -> None:
    a = Budget(db, "pipedrive", "acct", burst_limit=80)
    b = Budget(db, "pipedrive", "acct", burst_limit=80)
    a.acquire()
    b.acquire()
    writes = a.stats().writes
    # a pause of 3 s: the waits below are measured after the setup in between, which took over
    # a second on a loaded machine (a pause of 1 s had then ended before either acquired)
    threads = [threading.Thread(target=a.note_rate_limited, args=("burst", 3.0)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert a.stats().writes == writes + 1  # eight 429s at once, one write
    assert row(db)["paused_until"] is not None
    # a holds slots from its first chunk but spends none during the pause; b's slots do not
    # know of the pause, but its next lease starts after it
    for _ in range(b.lease_size() - 1):
        b.acquire()
    waited: dict[str, float] = {}

    def timed(name: str, budget: Budget) -> None:
        started = time.monotonic()
        budget.acquire()
        waited[name] = time.monotonic() - started

    threads = [threading.Thread(target=timed, args=(n, x)) for n, x in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert waited["a"] >= 0.8 and waited["b"] >= 0.8


def test_spent_daily_budget_parks_every_worker_until_the_reset(db: Database) -> None:
    a = Budget(db, "pipedrive", "acct", burst_limit=80)
    b = Budget(db, "pipedrive", "acct", burst_limit=80)
    a.acquire()
    a.note_rate_limited("daily", 1.5)
    statements = a.stats().statements
    with pytest.raises(RateLimitParked) as info:
        a.acquire()
    assert 1.0 < info.value.wait_seconds <= 1.5
    assert a.stats().statements == statements  # parked locally: no database
    with pytest.raises(RateLimitParked) as info:
        b.acquire()  # another worker learns it from the row, before any request
    assert 1.0 < info.value.wait_seconds <= 1.5
    assert b.stats().leases == 0
    assert row(db)["daily_remaining"] == 0
    time.sleep(1.6)
    a.acquire()
    b.acquire()


def test_headers_saying_no_daily_tokens_left_park_too(db: Database) -> None:
    a = Budget(db, "pipedrive", "acct", burst_limit=80, daily_probe_seconds=0.5)
    b = Budget(db, "pipedrive", "acct", burst_limit=80)
    a.acquire()
    a.observe(replace(SEEN, daily_remaining=0))
    with pytest.raises(RateLimitParked):
        a.acquire()
    with pytest.raises(RateLimitParked):
        b.acquire()
    time.sleep(0.6)
    b.acquire()


def test_a_lower_reported_limit_slows_the_bucket(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=1.0)  # no slot lapses on a busy machine
    fast = budget.rate()  # slots per second
    budget.observe(RateObservation(limit=20, remaining=19, reset=1.0))
    assert budget.limit == 20 and budget.lease_size() == 5
    slow = budget.rate()
    assert slow == pytest.approx(20 / 3.075) and slow == pytest.approx(fast / 4)  # L / (W + ttl + margin)
    budget.observe(RateObservation(limit=120))  # a higher plan does not raise the configured ceiling
    assert budget.limit == 80
    budget.observe(RateObservation(limit=20))
    budget.acquire()
    assert row(db)["burst_limit"] == 20


def test_full_window_reported_pauses_this_process_and_slows_every_worker(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80)
    budget.acquire()
    budget.observe(RateObservation(limit=80, remaining=0, reset=1.0))
    started = time.monotonic()
    budget.acquire()
    assert time.monotonic() - started >= 0.9
    stats = budget.stats()
    # the insert, the leases and one slow-down for every worker (0.9 of the rate): the pause is local
    assert stats.writes == 1 + stats.leases + 1
    assert row(db)["paused_until"] is None and row(db)["rate_scale"] == pytest.approx(0.9)
    budget.observe(RateObservation(limit=80, remaining=0, reset=1.0))
    assert budget.stats().writes == stats.writes  # once per window


def test_reserved_slots_are_spent_without_the_database(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=1.0)  # no slot lapses on a busy machine
    with budget.reserve(4) as held:
        statements = budget.stats().statements
        assert held.held == 4
        threads = [threading.Thread(target=held.spend) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert held.held == 1
    assert budget.stats().statements == statements and budget.stats().slots_spent == 3
    # the unspent slot went back to the pool: the next acquires use it and the rest of the chunk
    for _ in range(5):
        budget.acquire()
    assert budget.stats().leases == 1
    with pytest.raises(ValueError):
        budget.reserve(9)


def test_unspent_slots_expire(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=0.2)
    budget.acquire()
    time.sleep(0.6)  # the chunk's last slot is 7 spacings (0.2 s) after its first, plus its ttl
    budget.acquire()
    stats = budget.stats()
    # The first chunk's 7 unspent slots expired. On a loaded machine the second chunk's first slot
    # can outlive its 0.2 s ttl before its thread runs again, and then it expires too (CI saw 8).
    assert stats.leases >= 2 and stats.slots_spent == 2 and stats.slots_expired >= 7


def test_spares_that_expired_are_not_leased_again(db: Database) -> None:
    # a chunk's spare slots (beyond the threads waiting) spend the window's room whether sent or not:
    # a process whose spares lapse leases only what its threads wait for, until spares are used again
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=0.2)
    budget.acquire()
    time.sleep(0.6)  # the chunk's last spare is 7 spacings (0.2 s) after its first, plus its ttl
    budget.acquire()
    assert budget.stats().slots_expired >= 7 and budget.stats().leases == 2
    assert row(db)["slots_leased"] == 8 + 1


def test_threads_do_not_wait_for_far_spares_while_a_lease_can_start_them(db: Database) -> None:
    # g = (4 + 1 + 0.075) / 16 = 0.32 s: a lone thread's lease holds spares at +g, +2g, +3g
    budget = Budget(db, "pipedrive", "acct", burst_limit=16, window_seconds=4.0, chunk=4, lease_ttl=1.0)
    budget.acquire()
    with budget.reserve(2):  # two threads at once: one takes the spare a gap away, the other a new slot
        assert budget.stats().leases == 2  # (not the spare two gaps away)


def test_cancel_ends_a_wait_for_slots(db: Database) -> None:
    budget = Budget(db, "pipedrive", "acct", burst_limit=80)
    budget.acquire()
    budget.note_rate_limited("burst", 20.0)
    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(BudgetCancelled):
        budget.acquire(stop)
    assert time.monotonic() - started < 5.0  # the pause is 20-30 s: only a cancel ends it this soon


def test_racing_leases_never_lose_a_slot_nor_crowd_a_window(db: Database) -> None:
    # Six workers hammer the row at once; the row lock must hand each lease the slots granted before
    # it, or two chunks would overlap in the source's window.
    limit = 24
    workers = [Budget(db, "pipedrive", "acct", burst_limit=limit, window_seconds=0.3, chunk=4, lease_ttl=0.3,
                      latency_margin=0.05, burst_slots=6) for _ in range(6)]
    horizon, lag, d = workers[0].horizon, workers[0].lag(), 0.35
    workers[0].acquire()  # the row exists: every lease below is logged
    log_leases(db)
    barrier = threading.Barrier(len(workers))

    def work(budget: Budget) -> None:
        barrier.wait()
        for _ in range(4 * 5):
            budget.acquire()

    threads = [threading.Thread(target=work, args=(b,)) for b in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted, leases = granted_slots(db, limit)
    assert leases == sum(b.stats().leases for b in workers) - 1 >= 6 * 5 - 1
    # across every worker no L + 1 slots fit in W + d, nor B + 1 in d
    assert all(b - a >= horizon - 1e-5 for a, b in zip(granted, granted[limit:]))
    assert all(b - a > d for a, b in zip(granted, granted[lag:]))


def test_fetch_round_reserves_four_then_fetches_with_no_database(db: Database) -> None:
    # The email task's shape: reserve four slots on the job thread, run four fetch threads, join.
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"success": True, "data": {"id": int(r.url.path.rsplit("/", 1)[1]), "body": "<p/>"}}))
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=1.0)  # no slot lapses on a busy machine
    client = PipedriveClient("http://pipedrive.test", "tok-x", budget=budget, transport=transport)
    bodies: dict[int, str] = {}
    for round_start in (0, 4, 8):
        with budget.reserve(4) as held:
            statements = budget.stats().statements
            threads = [
                threading.Thread(target=lambda m: bodies.__setitem__(m, client.mail_body(m, reservation=held)["body"]), args=(m,))
                for m in range(round_start, round_start + 4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert budget.stats().statements == statements  # the fetch threads never touched the database
            assert held.held == 0
    assert sorted(bodies) == list(range(12))
    assert budget.stats().slots_spent == 12 and budget.stats().leases == 2


def test_client_waiting_on_a_paused_budget_stops_when_cancelled(db: Database) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"success": True, "data": []}))
    budget = Budget(db, "pipedrive", "acct", burst_limit=80)
    budget.acquire()
    budget.note_rate_limited("burst", 30.0)
    stop = threading.Event()
    client = PipedriveClient("http://pipedrive.test", "tok-x", budget=budget, transport=transport, cancel=stop)
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        client.list_v2("/api/v2/deals")
    assert time.monotonic() - started < 5.0  # the pause is 20-30 s: only a cancel ends it this soon


def _record_checkouts(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    getconn = db.pool.getconn

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        names.append(threading.current_thread().name)
        return getconn(*args, **kwargs)

    monkeypatch.setattr(db.pool, "getconn", recorded)
    return names


def test_a_deferred_reservation_does_the_fetch_threads_database_work_on_its_owners_thread(db: Database, monkeypatch) -> None:
    # Four fetch threads each spend their held slot, then need two more (retries) and report a 429:
    # the leases and the row write happen, but on the thread serving the round.
    budget = Budget(db, "pipedrive", "acct", burst_limit=400, chunk=4)
    budget.acquire()  # the row exists
    names = _record_checkouts(db, monkeypatch)
    with ThreadPoolExecutor(4, thread_name_prefix="fetch") as pool, budget.reserve(4, deferred=True) as held:

        def fetch(i: int) -> None:
            held.spend()
            held.acquire()
            held.acquire()
            if i == 0:
                held.note_rate_limited("burst", 0.05)

        futures = [pool.submit(fetch, i) for i in range(4)]
        held.serve(futures)
        for f in futures:
            f.result()
    assert names, "leases were needed"
    assert {n for n in names} == {threading.current_thread().name}, names
    assert budget.stats().slots_spent == 1 + 4 + 8
    assert row(db)["paused_until"] is not None, "the 429 reached the row"


def test_when_the_owner_stops_serving_waiting_fetch_threads_are_let_go(db: Database) -> None:
    # the reserved slot must not lapse before the thread spends it: a lapsed one is replaced
    # through the owner, who is not serving, and the thread would wait there instead
    budget = Budget(db, "pipedrive", "acct", burst_limit=400, chunk=4, lease_ttl=60.0)
    held = budget.reserve(1, deferred=True)
    asked = threading.Event()
    outcome: list[BaseException] = []

    def fetch() -> None:
        held.spend()
        asked.set()
        try:
            held.acquire()  # queued for the owner, who is about to fail
        except BaseException as e:  # noqa: BLE001
            outcome.append(e)

    t = threading.Thread(target=fetch, daemon=True)
    t.start()
    assert asked.wait(30)
    deadline = time.monotonic() + 30
    while not held.waiting and time.monotonic() < deadline:  # the request is queued for the owner
        time.sleep(0.01)
    assert held.waiting == 1
    held.release()  # the round failed before serving: nobody will
    t.join(30)
    assert not t.is_alive() and len(outcome) == 1 and isinstance(outcome[0], BudgetCancelled)


@pytest.mark.timeout(60)
def test_serving_ends_when_the_round_does_not_at_the_next_poll(db: Database) -> None:
    """A finished fetch wakes its owner: with an hour between polls, serve still returns as soon
    as the last future is done (a missed wake-up would hang here until the timeout fails it)."""
    budget = Budget(db, "pipedrive", "acct", burst_limit=400, chunk=4)
    with ThreadPoolExecutor(2) as pool, budget.reserve(2, deferred=True) as held:
        held.serve([pool.submit(held.spend) for _ in range(2)], poll=3600)
        futures = [pool.submit(time.sleep, 0.2)]
        held.serve(futures, poll=3600)
    assert all(f.done() for f in futures)


def test_a_burst_429_slows_every_workers_leases_and_the_rate_recovers(db: Database) -> None:
    a = Budget(db, "pipedrive", "acct", burst_limit=80, rate_recovery=0.25, lease_ttl=1.0)
    b = Budget(db, "pipedrive", "acct", burst_limit=80, rate_recovery=0.25, lease_ttl=1.0)
    a.acquire()
    assert row(db)["rate_scale"] == 1.0
    a.note_rate_limited("burst", 0.0)  # one write: pause (none left) and a slower rate for everyone
    assert row(db)["rate_scale"] == pytest.approx(0.75)
    log_leases(db)
    b.acquire()  # another worker's lease right after the 429: its chunk's spare slots g / 0.75 apart
    slots, _ = granted_slots(db, 80)
    assert slots[7] - slots[0] >= 7 * b.spacing() / 0.8  # (0.25 per second of recovery: well below 0.8 yet)
    time.sleep(1.1)  # back to the full rate
    for _ in range(24):
        b.acquire()
    slots, _ = granted_slots(db, 80)
    assert slots[-1] - slots[-8] == pytest.approx(7 * b.spacing(), abs=1e-4)


def test_leases_stop_at_the_daily_share_counting_every_slot_since_the_report(db: Database) -> None:
    # limit 1,000, share 0.5: the floor is 500. A report of 800 left, carried by slot 0; every slot
    # may cost 10 tokens; lag = ceil((ttl + margin) / g) + 1 slots may still be on their way (no
    # burst beyond that: `burst_slots` 1).
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, burst_slots=1, lease_ttl=0.2, latency_margin=0.0,
                    daily_share=0.5, max_cost=10, daily_reset=lambda now: 0.5)
    lag = budget.lag()
    budget.acquire()  # slot 0 (the first chunk: 0..7)
    budget.observe(RateObservation(daily_limit=1000, daily_remaining=800))
    spent = 1
    with pytest.raises(RateLimitParked) as info:
        for _ in range(200):  # 200 slots would be 2,000 tokens: far past the share
            budget.acquire()
            spent += 1
    # a chunk is granted while 800 - 10 * (slots leased with it + lag) >= 500
    granted = max(n for n in range(8, 1000, 8) if n == 8 or 800 - 10 * (n + lag) >= 500)
    assert granted > 8 and row(db)["slots_leased"] == granted and spent <= granted
    assert "share" in str(info.value) and 0 < info.value.wait_seconds <= 0.5
    assert row(db)["daily_reason"] == "share"
    state = waiting_state(db, "acct")
    assert state.kind == "daily_share" and state.until is not None
    # the park is the proof's bound, not the source's count: said so, with what the source reported
    # (not "is used" while the source reports 8% spent)
    assert f"may be spent (the source last reported {row(db)['daily_remaining']:,} left)" in state.reason, state.reason
    # another worker parks from the row without a slot
    other = Budget(db, "pipedrive", "acct", burst_limit=80, daily_share=0.5, max_cost=10, daily_reset=lambda now: 0.5)
    with pytest.raises(RateLimitParked):
        other.acquire()
    # the day resets: its numbers are forgotten and the leases go on
    time.sleep(0.6)
    other.acquire()
    assert row(db)["daily_remaining"] is None and row(db)["daily_reset_at"] is None


def test_a_report_of_the_old_day_does_not_park_the_new_one(db: Database) -> None:
    # A worker parked on its share still holds a report of the old day (a response that came back
    # after the park); it is delivered with the worker's first lease of the new day. Taken as the
    # new day's first report, it said the share was used and parked the account for the whole new
    # day (a sandbox day of 4 s spent 35 of its 600 tokens, test_budget_sandbox).
    budget = Budget(db, "pipedrive", "acct", burst_limit=80, chunk=8, lease_ttl=0.2, latency_margin=0.0,
                    daily_share=0.5, max_cost=10, daily_reset=lambda now: 0.5)
    budget.acquire()
    budget.observe(RateObservation(daily_limit=1000, daily_remaining=800))
    with pytest.raises(RateLimitParked):
        for _ in range(200):
            budget.acquire()
    budget.observe(RateObservation(daily_limit=1000, daily_remaining=505))
    time.sleep(0.6)  # the day resets
    for _ in range(20):
        budget.acquire()  # the old day's report is not taken: no park
    assert row(db)["daily_reset_at"] is None
    # a report of the new day is taken
    budget.observe(RateObservation(daily_limit=1000, daily_remaining=990))
    for _ in range(10):
        budget.acquire()  # past the chunk: the next lease delivers the report
    assert row(db)["daily_remaining"] == 990


def test_the_client_reads_pipedrives_rate_headers_into_numbers() -> None:
    seen = rate_observation(httpx.Headers({"X-RateLimit-Limit": "80", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1.5",
                                           "x-daily-ratelimit-token-limit": "300000", "x-daily-ratelimit-token-remaining": "12.0",
                                           "x-daily-ratelimit-reset": "-3"}))
    assert seen == RateObservation(limit=80, remaining=0, reset=1.5, daily_limit=300000, daily_remaining=12, daily_reset=None)
    assert rate_observation({"x-ratelimit-limit": "many", "x-ratelimit-reset": "inf"}) == RateObservation()
