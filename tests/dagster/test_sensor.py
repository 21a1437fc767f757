"""The reaper sensor on a real instance and a real engine database: one tick releases a dead
worker's stale lock, advances a phase that closed without a winner and requests drainer runs (and
the tenant partitions they need); once those runs exist, the next tick requests nothing more. The
lane poller requests drainers up to the tenant's fair share of the lane, counting its runs already
queued, and none for engine runs no Dagster run ever attached to. A tenant that waits while another
holds the whole lane gets its share: the other's extra drainers give way at their next task."""
from __future__ import annotations

from dagster import DagsterRunStatus, build_sensor_context
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.test_utils import create_run_for_test

from engine_core import runs
from engine_core.config import Settings
from engine_core.providers.registry import provider_for
from migration_pipeline import tags
from migration_pipeline.definitions import build_definitions
from migration_pipeline.lane.fair import LANE_SLOTS_TAG, LANE_THREADS_TAG, lane_picture
from migration_pipeline.jobs import DRAINER_JOB
from tests.dagster.support import SMALL, resources


DEFS = build_definitions("example")
ONE_THREAD = {LANE_SLOTS_TAG: "1", LANE_THREADS_TAG: "1"}  # a launch's phase op draining in one thread


def _sensors():
    repo = DEFS.get_repository_def()
    return repo.get_sensor_def("reaper"), repo.get_sensor_def("lane_poller")


def _tick(sensor, instance, res):
    # resources must be passed explicitly to a sensor called directly (DAGSTER_NOTES.md trap 9)
    # the daemon evaluates ticks inside a partition-loading context; so does the test
    with partition_loading_context(dynamic_partitions_store=instance):
        with build_sensor_context(instance=instance, resources=res, definitions=DEFS) as context:
            return sensor.evaluate_tick(context)


def _launch_like_the_daemon(instance, data) -> None:
    """What the daemon does with a tick's run requests: runs with the requests' tags, launching."""
    for rr in data.run_requests:
        create_run_for_test(instance, job_name=DRAINER_JOB, status=DagsterRunStatus.STARTING,
                            tags={**rr.tags, tags.PARTITION: rr.partition_key})


def _launched_through_dagster(instance, run, status=DagsterRunStatus.FAILURE) -> None:
    """A Dagster run of the tenant that attached to the engine run (as a phase asset tags it), its
    phase op draining in one lane thread (MIGRATE_LAUNCH_THREADS=1: drainers widen the lane)."""
    create_run_for_test(instance, job_name="migrate_tenant", status=status,
                        tags={tags.PARTITION: run.tenant_id, tags.ENGINE_RUN: str(run.id), **ONE_THREAD})


def test_one_tick_releases_advances_and_requests_drainers_and_the_next_asks_for_nothing(instance, engine_url, db):
    provider = provider_for("example")
    dead, _ = runs.start_or_join(db, provider, "dead-worker", options=SMALL)
    stuck, _ = runs.start_or_join(db, provider, "no-winner", options=SMALL)
    # the Dagster runs that drove them are gone (their process died)
    _launched_through_dagster(instance, dead)
    _launched_through_dagster(instance, stuck)

    # a worker claimed a task and died: its lock is an hour old
    task = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s ORDER BY id LIMIT 1", {"r": dead.id})[0]["id"]
    assert db.fetch_one("claim_task", {"task_id": task, "worker": "gone:1"})
    db.sql("UPDATE migration_tasks SET locked_at = now() - interval '1 hour' WHERE id = %(t)s", {"t": task})
    # every task of phase 1 finished, but the winner died before advancing the barrier
    db.sql("UPDATE migration_tasks SET status = 'succeeded', finished_at = now() WHERE migration_id = %(r)s", {"r": stuck.id})

    reaper, _ = _sensors()
    res = resources(engine_url, stale_lock_seconds=600.0)
    first = _tick(reaper, instance, res)

    assert db.sql("SELECT status, locked_by FROM migration_tasks WHERE id = %(t)s", {"t": task}) == [
        {"status": "pending", "locked_by": None}]
    assert runs.get_run(db, stuck.id).current_phase == 1
    assert db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND phase = 1",
                  {"r": stuck.id})[0]["n"] > 0, "the advance seeded phase 2"

    by_tenant: dict[str, int] = {}
    for rr in first.run_requests:
        by_tenant[rr.partition_key] = by_tenant.get(rr.partition_key, 0) + 1
        assert rr.tags[tags.ROLE] == tags.DRAINER
        assert rr.tags[tags.PRIORITY] == tags.DRAINER_PRIORITY
    assert by_tenant == {"dead-worker": 2, "no-winner": 2}, "lane width 4 shared by two tenants, nothing in flight yet"
    assert {rr.tags[tags.ENGINE_RUN] for rr in first.run_requests} == {str(dead.id), str(stuck.id)}
    assert set(instance.get_dynamic_partitions("tenants")) == {"dead-worker", "no-winner"}

    _launch_like_the_daemon(instance, first)
    second = _tick(reaper, instance, res)
    assert second.run_requests == []
    assert second.skip_message and "nothing to repair" in second.skip_message


def test_the_lane_poller_counts_the_tenants_runs_already_in_flight(instance, engine_url, db):
    run, _ = runs.start_or_join(db, provider_for("example"), "acme", options=SMALL)
    instance.add_dynamic_partitions("tenants", ["acme"])
    # the tenant's own launch is already running: one worker of the four
    _launched_through_dagster(instance, run, status=DagsterRunStatus.STARTED)
    _, lane = _sensors()
    res = resources(engine_url)
    data = _tick(lane, instance, res)
    assert [rr.partition_key for rr in data.run_requests] == ["acme"] * 3
    _launch_like_the_daemon(instance, data)
    assert _tick(lane, instance, res).run_requests == []

    # a stopped run gets no drainers
    runs.stop(db, run.id)
    for r in instance.get_runs():
        instance.report_run_canceled(r)
    assert _tick(lane, instance, res).run_requests == []


def test_runs_started_outside_dagster_get_no_drainers(instance, engine_url, db):
    """A run the engine's CLI or a benchmark drives has source settings only its own process has."""
    runs.start_or_join(db, provider_for("example"), "outsider", options=SMALL)
    _, lane = _sensors()
    assert _tick(lane, instance, resources(engine_url)).run_requests == []
    assert instance.get_dynamic_partitions("tenants") == []


def test_the_reaper_skips_when_there_is_nothing_to_do(instance, engine_url):
    reaper, _ = _sensors()
    data = _tick(reaper, instance, resources(engine_url))
    assert data.run_requests == []
    assert data.skip_message == "nothing to repair; idle: no engine run in progress"


def test_the_lane_poller_says_why_it_requests_nothing(instance, engine_url, db):
    """The poller says why it requests nothing as it is: idle, a run whose running tasks fill the
    lane's width (which run, how many), a run its own workers drain and a tenant at its fair share."""
    _, lane = _sensors()
    res = resources(engine_url, lane_width=2)
    assert _tick(lane, instance, res).skip_message == "idle: no engine run in progress"

    outsider, _ = runs.start_or_join(db, provider_for("example"), "outsider", options=SMALL)
    message = _tick(lane, instance, res).skip_message
    assert message.startswith("no drainer needed: ") and "not launched through Dagster" in message, message

    tasks = db.sql("SELECT id FROM migration_tasks WHERE migration_id = %(r)s ORDER BY id LIMIT 2", {"r": outsider.id})
    for i, t in enumerate(tasks):
        assert db.fetch_one("claim_task", {"task_id": t["id"], "worker": f"busy:{i}"})
    assert _tick(lane, instance, res).skip_message == (f"no slot to fill: every run in progress has as many tasks "
                                                       f"running as the lane's width 2 (run #{outsider.id} 2 running)")

    runs.stop(db, outsider.id)
    run, _ = runs.start_or_join(db, provider_for("example"), "acme", options=SMALL)
    instance.add_dynamic_partitions("tenants", ["acme"])
    _launched_through_dagster(instance, run, status=DagsterRunStatus.STARTED)
    _launched_through_dagster(instance, run, status=DagsterRunStatus.STARTED)
    message = _tick(lane, instance, res).skip_message
    assert "tenant 'acme' has its fair share of the lane (2 slot(s) of 2 held or queued)" in message, message


BIG = {"page_size": 20, "counts": {"companies": 400, "contacts": 400, "deals": 40, "activities": 20, "notes": 20}}


def _origin(job_name: str) -> RemoteJobOrigin:
    """Queued runs must say where they come from (the daemon would launch them from there)."""
    location = RegisteredCodeLocationOrigin("migration_pipeline")
    return RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)


def _run(instance, tenant, status, engine_run=None, drainer=False):
    run_tags = {tags.PARTITION: tenant}
    if engine_run is not None:
        run_tags[tags.ENGINE_RUN] = str(engine_run.id)
    if drainer:
        run_tags.update({tags.ROLE: tags.DRAINER, tags.PRIORITY: tags.DRAINER_PRIORITY})
    else:
        run_tags.update(ONE_THREAD)
    job_name = DRAINER_JOB if drainer else "migrate_tenant"
    return create_run_for_test(instance, job_name=job_name, status=status, tags=run_tags,
                               remote_job_origin=_origin(job_name)).run_id


def test_a_waiting_tenant_gets_its_share_and_the_other_tenants_extra_drainers_give_way(instance, engine_url, db):
    provider = provider_for("example")
    width4 = Settings(lane_width=4)
    first, _ = runs.start_or_join(db, provider, "first", options=BIG)
    instance.add_dynamic_partitions("tenants", ["first", "second"])
    # "first" holds the whole lane: its own launch and three drainers
    own = _run(instance, "first", DagsterRunStatus.STARTED, first)
    helpers = [_run(instance, "first", DagsterRunStatus.STARTED, first, drainer=True) for _ in range(3)]
    # "second" was launched and waits in the run queue (its engine run starts when its launch does)
    queued = _run(instance, "second", DagsterRunStatus.QUEUED)

    picture = lane_picture(instance, db, width4)
    assert picture.shares == {"first": 3, "second": 1}
    assert picture.waiting() == ["second"]
    # the youngest drainer of "first" gives its slot at its next task boundary; the rest keep theirs
    assert [picture.should_give_way("first", r) for r in [own, *helpers]] == [False, False, False, True]
    _, lane = _sensors()
    res = resources(engine_url)
    assert _tick(lane, instance, res).run_requests == [], "nothing more for first; second has no engine run yet"

    # the drainer gave way; second's launch took the slot and started its engine run
    instance.report_run_canceled(instance.get_run_by_id(helpers[-1]))
    instance.report_run_canceled(instance.get_run_by_id(queued))
    second, _ = runs.start_or_join(db, provider, "second", options=BIG)
    _run(instance, "second", DagsterRunStatus.STARTED, second)
    picture = lane_picture(instance, db, width4)
    assert picture.shares == {"first": 2, "second": 2}
    assert not any(picture.should_give_way("first", r) for r in [own, *helpers[:2]]), "no one waits yet"

    data = _tick(lane, instance, res)
    assert [rr.partition_key for rr in data.run_requests] == ["second"], "second's share is two"
    for rr in data.run_requests:  # the lane is full: the drainer waits in the queue
        create_run_for_test(instance, job_name=DRAINER_JOB, status=DagsterRunStatus.QUEUED,
                            tags={**rr.tags, tags.PARTITION: rr.partition_key}, remote_job_origin=_origin(DRAINER_JOB))
    picture = lane_picture(instance, db, width4)
    assert picture.waiting() == ["second"]
    assert [picture.should_give_way("first", r) for r in [own, *helpers[:2]]] == [False, False, True]
    assert _tick(lane, instance, res).run_requests == []


def test_the_give_way_check_ends_a_drainers_turn_at_a_task_boundary(engine_url, db):
    from migration_pipeline.lane.slot import drain_in_slot

    run, _ = runs.start_or_join(db, provider_for("example"), "polite", options=BIG)
    asked = []

    def give_way() -> bool:
        asked.append(1)
        return len(asked) > 2  # two tasks, then someone is waiting

    result = drain_in_slot(db, run.id, settings=Settings(lane_width=4, heartbeat_seconds=0.0),
                           providers=lambda r: provider_for(r.source, r), give_way=give_way)
    assert result.reason == "gave_way"
    assert sum(result.executed.values()) == 2
    assert db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'",
                  {"r": run.id})[0]["n"] == 0


def test_a_run_on_another_source_gets_no_drainers(instance, engine_url, db):
    """Launched with other source settings (a launchpad override reaching another company): the
    deployment's drainers would read another source, so none is requested; its own launch drains it.
    A run whose source is not known yet gets drainers (they decide for themselves)."""
    run, _ = runs.start_or_join(db, provider_for("example"), "elsewhere", options=BIG)
    instance.add_dynamic_partitions("tenants", ["elsewhere"])
    _launched_through_dagster(instance, run, status=DagsterRunStatus.STARTED)
    _, lane = _sensors()
    res = resources(engine_url)
    db.sql("UPDATE migrations SET source_identity = 'another company' WHERE id = %(r)s", {"r": run.id})
    assert _tick(lane, instance, res).run_requests == []
    db.sql("UPDATE migrations SET source_identity = NULL WHERE id = %(r)s", {"r": run.id})
    assert [rr.partition_key for rr in _tick(lane, instance, res).run_requests] == ["elsewhere"] * 3
