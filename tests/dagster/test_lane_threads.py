"""Issue 11: the lane counts slots (threads), not Dagster runs.

A launch's phase op records the lane threads it drains with on its run (`lane.fair.LANE_SLOTS_TAG`,
and the most it may grow to in `LANE_THREADS_TAG`); a drainer holds one slot. So:
* the lane poller requests drainers only for the slots of a tenant's share that its launch's threads
  neither hold nor will take (a launch holding its whole share gets none);
* a drainer gives way by the slots ranked before it, not the runs: behind a launch holding three
  slots of a share of three it gives way to a waiting tenant, and while the lane is over its width
  it gives way even when nobody waits;
* a launch takes at most its share and never a slot another run holds (0: it waits); until its
  phase op has recorded its threads, its tenant gets no drainer;
* with the default (MIGRATE_LAUNCH_THREADS unset: the lane width; a lone launch in
  tests/dagster/test_overhead_lanes.py), a tenant launched while another holds the whole lane with
  its own threads (real threads, real Dagster runs of one instance, one process each) gets slots
  only as the other's threads give them back; the lane never holds more than its width in slots or
  running tasks at any sample, and the two hold two slots each (their fair shares) before the
  phase the first's four threads drain closes: it gives two back at a task boundary, it does not
  wait for its next phase op.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter, build_sensor_context
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import create_run_for_test

from engine_core import runs
from engine_core.config import Settings
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.lane.threads import LAUNCH_THREADS_ENV
from migration_pipeline.definitions import build_definitions
from migration_pipeline.lane.fair import IN_PROGRESS, LANE_SEEN_TAG, LANE_SLOTS_TAG, LANE_THREADS_TAG, lane_picture
from migration_pipeline.jobs import DRAINER_JOB
from tests.dagster.support import materialize_tenant, resources, tmpfs_instance

DEFS = build_definitions("example")
BIG = {"page_size": 20, "counts": {"companies": 400, "contacts": 400, "deals": 40, "activities": 20, "notes": 20}}
WIDTH4 = Settings(lane_width=4)


@pytest.fixture(scope="module")
def _module_instance() -> Iterator[DagsterInstance]:
    with tmpfs_instance() as inst:
        yield inst


@pytest.fixture
def instance(_module_instance: DagsterInstance) -> Iterator[DagsterInstance]:
    """One test instance for the module (making one costs about a second), wiped before each test:
    its runs, events and dynamic partitions are gone, so each test sees only what it makes."""
    _module_instance.wipe()
    yield _module_instance


def _lane_poller():
    return DEFS.get_repository_def().get_sensor_def("lane_poller")


def _tick(instance, res):
    with partition_loading_context(dynamic_partitions_store=instance):
        with build_sensor_context(instance=instance, resources=res, definitions=DEFS) as context:
            return _lane_poller().evaluate_tick(context)


def _launch_run(instance, run, slots: int | None = None, threads: int | None = None, status=DagsterRunStatus.STARTED) -> str:
    """A launch of the tenant (a phase asset's run) attached to `run`, holding `slots` lane threads."""
    run_tags = {tags.PARTITION: run.tenant_id, tags.ENGINE_RUN: str(run.id)}
    if slots is not None:
        run_tags[LANE_SLOTS_TAG] = str(slots)
    if threads is not None:
        run_tags[LANE_THREADS_TAG] = str(threads)
    return create_run_for_test(instance, job_name="migrate_tenant", status=status, tags=run_tags).run_id


def _drainer(instance, run, status=DagsterRunStatus.STARTED) -> str:
    return create_run_for_test(instance, job_name=DRAINER_JOB, status=status, tags={
        tags.PARTITION: run.tenant_id, tags.ENGINE_RUN: str(run.id), tags.ROLE: tags.DRAINER,
        tags.PRIORITY: tags.DRAINER_PRIORITY}).run_id


def test_the_poller_requests_drainers_only_for_slots_no_launch_thread_holds(instance, engine_url, db):
    run, _ = runs.start_or_join(db, provider_for("example"), "acme", options=BIG)
    instance.add_dynamic_partitions("tenants", ["acme"])
    res = resources(engine_url)
    # a launch draining with 2 threads, which may not grow: 2 slots of the share of 4 are free
    launch = _launch_run(instance, run, slots=2, threads=2)
    assert [rr.partition_key for rr in _tick(instance, res).run_requests] == ["acme"] * 2
    # the launch holds the whole lane with its own threads: no drainer
    instance.add_run_tags(launch, {LANE_SLOTS_TAG: "4", LANE_THREADS_TAG: "4"})
    assert _tick(instance, res).run_requests == []
    # holding 1 but allowed 4 (its next refresh takes them): no drainer either
    instance.add_run_tags(launch, {LANE_SLOTS_TAG: "1"})
    assert _tick(instance, res).run_requests == []


def test_no_drainer_before_a_starting_launch_said_how_many_threads_it_takes(instance, engine_url, db):
    """Between attaching to its engine run and taking its slots, a launch's phase op holds one slot
    by default: a poller tick there requested three drainers for a lone launch about to take the
    whole lane with its own threads."""
    run, _ = runs.start_or_join(db, provider_for("example"), "starting", options=BIG)
    instance.add_dynamic_partitions("tenants", ["starting"])
    launch = _launch_run(instance, run)  # in progress, attached, no lane tags yet
    res = resources(engine_url)
    assert _tick(instance, res).run_requests == []
    instance.add_run_tags(launch, {LANE_SLOTS_TAG: "1", LANE_THREADS_TAG: "1"})  # it drains in one thread
    assert [rr.partition_key for rr in _tick(instance, res).run_requests] == ["starting"] * 3


def test_a_drainer_gives_way_by_slots_not_runs(instance, engine_url, db):
    provider = provider_for("example")
    first, _ = runs.start_or_join(db, provider, "first", options=BIG)
    own = _launch_run(instance, first, slots=3, threads=3)
    helper = _drainer(instance, first)
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.busy == 4 and picture.shares == {"first": 4}
    assert not picture.should_give_way("first", helper), "no one waits, the lane is not over its width"

    # another tenant's launch waits in the run queue: first's share is 3, all held by its launch
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("migration_pipeline"),
                                                    "__repository__"), "migrate_tenant")
    create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.QUEUED,
                        tags={tags.PARTITION: "second"}, remote_job_origin=origin)
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.shares == {"first": 3, "second": 1} and picture.waiting() == ["second"]
    assert [picture.should_give_way("first", r) for r in (own, helper)] == [False, True]


def test_a_drainer_gives_way_while_the_lane_is_over_its_width(instance, engine_url, db):
    run, _ = runs.start_or_join(db, provider_for("example"), "alone", options=BIG)
    own = _launch_run(instance, run, slots=4, threads=4)  # the launch grew while a drainer was on its way
    helper = _drainer(instance, run)
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.busy == 5 and picture.waiting() == []
    assert [picture.should_give_way("alone", r) for r in (own, helper)] == [False, True]


def test_a_dead_launchs_slots_go_back_once_its_stamp_is_stale(instance, engine_url, db):
    # The local run launcher never sees a dead run worker: a launch SIGKILLed while its threads held
    # the whole lane stays STARTED with its tag saying 4. Its lane_seen stamp stops; once older than
    # stale_lock_seconds the launch counts as 1 slot (as a run between steps), and drainers take the rest.
    run, _ = runs.start_or_join(db, provider_for("example"), "acme", options=BIG)
    instance.add_dynamic_partitions("tenants", ["acme"])
    res = resources(engine_url)
    launch = _launch_run(instance, run, slots=4, threads=4)
    instance.add_run_tags(launch, {LANE_SEEN_TAG: f"{time.time():.0f}"})
    assert lane_picture(instance, db, WIDTH4).tenants["acme"].held[launch] == 4
    assert _tick(instance, res).run_requests == [], "a live launch holding the lane: no drainer"
    instance.add_run_tags(launch, {LANE_SEEN_TAG: f"{time.time() - WIDTH4.stale_lock_seconds - 60:.0f}"})
    assert lane_picture(instance, db, WIDTH4).tenants["acme"].held[launch] == 1
    assert [rr.partition_key for rr in _tick(instance, res).run_requests] == ["acme"] * 3


def test_a_launch_takes_its_share_and_never_a_held_slot(instance, engine_url, db):
    provider = provider_for("example")
    first, _ = runs.start_or_join(db, provider, "first", options=BIG)
    second, _ = runs.start_or_join(db, provider, "second", options=BIG)
    holder = _launch_run(instance, first, slots=4, threads=4)
    newcomer = _launch_run(instance, second)  # in progress, before its phase op took anything
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.shares == {"first": 2, "second": 2}
    # the lane is full of first's threads: second gets nothing yet (it would be a fifth thread)
    assert picture.slots_for("second", newcomer, 4) == 0
    # second waits (tag 0): it is waiting, first's share is 2 and its third and fourth thread go
    instance.add_run_tags(newcomer, {LANE_SLOTS_TAG: "0", LANE_THREADS_TAG: "4"})
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.waiting() == ["second"] and picture.slots_for("first", holder, 4) == 2
    assert picture.slots_for("second", newcomer, 4) == 0
    # first's threads gave their slots back: second takes its share, not more, and one thread if asked one
    instance.add_run_tags(holder, {LANE_SLOTS_TAG: "2"})
    picture = lane_picture(instance, db, WIDTH4)
    assert picture.slots_for("second", newcomer, 4) == 2 and picture.slots_for("second", newcomer, 1) == 1
    assert _tick(instance, resources(engine_url)).run_requests == [], "both launches take their shares themselves"


# -- real threads, real Dagster runs ---------------------------------------------------------------

COUNTS = {"companies": 60, "contacts": 60, "deals": 30, "activities": 20, "notes": 20}
OPTIONS = {"page_size": 10, "row_delay": 0.01, "counts": COUNTS}


def _slots_by_tenant(instance) -> dict[str, int]:
    held: dict[str, int] = {}
    for r in instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS)):
        tenant = r.tags.get(tags.PARTITION)
        if tenant:
            held[tenant] = held.get(tenant, 0) + int(r.tags.get(LANE_SLOTS_TAG, "1"))
    return held


def _running_by_tenant(db) -> dict[str, int]:
    return {r["tenant_id"]: int(r["n"]) for r in db.sql(
        "SELECT m.tenant_id, count(*) AS n FROM migration_tasks t JOIN migrations m ON m.id = t.migration_id "
        "WHERE t.status = 'running' GROUP BY m.tenant_id")}


def _reconciled(db, tenant: str, counts: dict[str, int]) -> None:
    created = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = %(t)s AND action = 'created' "
        "GROUP BY kind", {"t": tenant})}
    target = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM example_items WHERE tenant_id = %(t)s GROUP BY kind", {"t": tenant})}
    assert created == target == counts, tenant
    assert db.sql("SELECT status FROM migrations WHERE tenant_id = %(t)s", {"t": tenant})[0]["status"] == "succeeded"


def _materialize_in_child(ref: str, engine_url: str, tenant: str, options: dict, go) -> None:
    """A launch in a process of its own, on the same Dagster instance (two `materialize` calls in
    threads of one process deadlock in Python's logging: Dagster's log manager runs dictConfig),
    started once `go` is set (the process has imported Dagster by then)."""
    import os
    import sys

    from dagster import DagsterInstance
    from dagster._serdes import deserialize_value

    os.environ.pop(LAUNCH_THREADS_ENV, None)  # the default: the lane width
    with DagsterInstance.from_ref(deserialize_value(ref)) as instance:
        go.wait(120)
        result = materialize_tenant(instance, tenant, resources(engine_url, options=options))
    sys.exit(0 if result.success else 1)


@dataclass(frozen=True)
class _Sample:
    """One look at the lane during the two-tenant test: `phase` is left's engine phase, read before
    and after the other reads and the same both times (None: it moved in between, or no run yet)."""

    at: float  # seconds since left was let go
    phase: int | None
    held: dict[str, int]  # tenant -> slots its runs in progress hold (the lane picture's)
    running: dict[str, int]  # tenant -> tasks running
    waiting: bool  # right's launch recorded 0 slots: it waits for one


def _phase_of(db, tenant: str) -> int | None:
    found = db.sql("SELECT current_phase FROM migrations WHERE tenant_id = %(t)s ORDER BY id DESC LIMIT 1",
                   {"t": tenant})
    return found[0]["current_phase"] if found else None


def _sample(instance, db, started: float) -> _Sample:
    before = _phase_of(db, "left")
    picture = lane_picture(instance, db, WIDTH4)
    running = _running_by_tenant(db)
    after = _phase_of(db, "left")
    right = picture.tenants.get("right")
    return _Sample(time.monotonic() - started, before if before == after else None,
                   {t: s.busy for t, s in picture.tenants.items()}, running,
                   right is not None and right.waiting_launch)


def _story(samples: list[_Sample]) -> str:
    """The samples where what the test looks at changed, for a failure message."""
    lines, last = [], None
    for s in samples:
        now = (s.phase, s.held.get("left"), s.held.get("right"), s.running.get("left"), s.running.get("right"), s.waiting)
        if now != last:
            lines.append(f"{s.at:6.2f}s phase {s.phase}: held {s.held} running {s.running}"
                         + (" right waits" if s.waiting else ""))
            last = now
    return "\n".join(lines if len(lines) <= 80 else lines[:40] + ["..."] + lines[-40:])


def test_two_tenants_launched_together_split_the_lane_in_slots(instance, engine_url, db):
    """"right" is launched while "left" drains a long phase with its own four threads: once right's
    run wants slots (its engine run has work: the shares are two and two), left's third and fourth
    threads give theirs back at a task boundary and right takes them (waiting, tag 0, if it asked
    first), and they drain two and two before that phase of left closes; the lane never holds more
    than four slots or runs more than four tasks at once.

    Without the give-back left's phase op keeps its four threads (and its tag says four) until the
    phase closes; the lane then split at left's next phase op, which takes its share of two, and a
    test asking only for a two-and-two sample passed. So the split must be seen while left's engine
    phase is still one in which it ran four tasks at once (read before and after each sample).
    Left's first phase is long (80 pages of sleeps, about 10 s on four threads) so that right has
    time to start on a loaded machine."""
    import multiprocessing

    from dagster._serdes import serialize_value

    instance.add_dynamic_partitions("tenants", ["left", "right"])
    spawn = multiprocessing.get_context("spawn")
    ref = serialize_value(instance.get_ref())
    # the tasks sleep (0.5 s a page), they hardly use the CPU: the phase stays long under load
    longer = {**OPTIONS, "row_delay": 0.05, "counts": {**COUNTS, "companies": 800}}
    go = {t: spawn.Event() for t in ("left", "right")}
    children = {t: spawn.Process(target=_materialize_in_child, args=(ref, engine_url, t, o, go[t]))
                for t, o in (("left", longer), ("right", OPTIONS))}
    for child in children.values():
        child.start()
    samples: list[_Sample] = []
    go["left"].set()
    started = time.monotonic()
    try:
        while any(c.is_alive() for c in children.values()):
            samples.append(_sample(instance, db, started))
            if not go["right"].is_set() and samples[-1].held.get("left") == 4:
                go["right"].set()  # left holds the whole lane with its own threads
            children["left"].join(0.02)
    finally:
        go["right"].set()
        for child in children.values():
            child.join(120)
    assert [children[t].exitcode for t in ("left", "right")] == [0, 0]
    _reconciled(db, "left", longer["counts"])
    _reconciled(db, "right", COUNTS)
    for s in samples:
        assert sum(s.held.values()) <= 4, s
        assert sum(s.running.values()) <= 4, s
    # four tasks of left running in one phase: its phase op for that phase drains with four threads
    full = [s for s in samples if s.phase is not None and s.running.get("left") == 4]
    assert full, f"left never ran four tasks in one phase:\n{_story(samples)}"
    # ... and in that same phase left holds two and right two: left gave two slots back mid-phase
    # (without the give-back its op's tag says four until the phase closed and its threads ended)
    first: dict[int | None, float] = {}  # phase -> when left first ran four tasks in it
    for s in full:
        first.setdefault(s.phase, s.at)
    split = [s for s in samples if s.phase in first and s.at > first[s.phase]
             and s.held.get("left") == 2 and s.held.get("right") == 2]
    assert split, (f"the lane was not split two and two before left's phase {sorted(first)} closed "
                   f"(left kept its four threads to the phase's end):\n{_story(samples)}")


def _materialize_and_die(ref: str, engine_url: str, tenant: str, options: dict, stale: float) -> None:
    """A launch in a process of its own (see `_materialize_in_child`), its lane's locks stale after
    `stale` seconds; the test SIGKILLs it while its threads hold the lane."""
    import os

    from dagster import DagsterInstance
    from dagster._serdes import deserialize_value

    os.environ.pop(LAUNCH_THREADS_ENV, None)  # the default: the lane width
    with DagsterInstance.from_ref(deserialize_value(ref)) as instance:
        materialize_tenant(instance, tenant, resources(engine_url, options=options, stale_lock_seconds=stale))


def test_a_launch_killed_while_holding_the_lane_gives_its_slots_back_once_stale(instance, engine_url, db):
    """SIGKILL of a launch's run worker while its four threads hold the lane: Dagster's local launcher
    never notices (the run stays STARTED, its tag says 4). Its lane_seen stamp stops, and once older
    than stale_lock_seconds the lane counts it as one slot: other work gets the rest."""
    import multiprocessing
    import os
    import signal

    from dagster._serdes import serialize_value

    stale = 3.0
    settings = Settings(lane_width=4, stale_lock_seconds=stale)
    instance.add_dynamic_partitions("tenants", ["dead"])
    spawn = multiprocessing.get_context("spawn")
    longer = {**OPTIONS, "row_delay": 0.05, "counts": {**COUNTS, "companies": 2000}}
    child = spawn.Process(target=_materialize_and_die,
                          args=(serialize_value(instance.get_ref()), engine_url, "dead", longer, stale))
    child.start()
    try:
        deadline = time.monotonic() + 120
        while lane_picture(instance, db, settings).tenants.get("dead") is None or \
                lane_picture(instance, db, settings).tenants["dead"].busy < 4:
            assert child.is_alive() and time.monotonic() < deadline, "the launch never held the whole lane"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        (run,) = instance.get_runs(filters=RunsFilter(statuses=IN_PROGRESS))
        assert run.tags[LANE_SLOTS_TAG] == "4", "the dead run still says it holds the lane"
        deadline = time.monotonic() + 4 * stale
        while lane_picture(instance, db, settings).tenants["dead"].busy != 1:
            assert time.monotonic() < deadline, "a dead launch kept the whole lane"
            time.sleep(0.2)
    finally:
        if child.is_alive():
            child.kill()
            child.join(10)
