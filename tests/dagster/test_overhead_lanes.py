"""Issue 11, "Dagster costs little": a launch's phase op may drain with more than one lane thread
(MIGRATE_LAUNCH_THREADS, at most its fair share of the lane), instead of one thread waiting for
drainer runs - each a process of its own - to widen it.

* the variable: the lane width by default, capped to it, a bad value is one line naming it;
* materialising a tenant with the default really runs tasks of a phase at once (the running tasks
  are sampled from the engine's table while the Dagster run works), and the result reconciles
  exactly (target rows = ledger claims = the source's counts); while its threads hold the lane the
  tenant is missing no slot (the lane poller requests no drainer run: `LanePicture.missing`); with
  MIGRATE_LAUNCH_THREADS=1, one task runs at a time in that process.
"""
from __future__ import annotations

import threading

import pytest

from engine_core.config import Settings
from engine_core.errors import ConfigError
from migration_pipeline.lane.threads import LAUNCH_THREADS_ENV, launch_threads
from migration_pipeline.lane.fair import lane_picture
from tests.dagster.support import materialize_tenant, resources

COUNTS = {"companies": 60, "contacts": 60, "deals": 30, "activities": 20, "notes": 20}
OPTIONS = {"page_size": 10, "row_delay": 0.01, "counts": COUNTS}


def test_the_variable_defaults_to_one_is_capped_and_a_bad_value_is_one_line():
    four = Settings(lane_width=4)
    assert launch_threads(four, {}) == 4
    assert launch_threads(Settings(lane_width=2), {}) == 2
    assert launch_threads(four, {LAUNCH_THREADS_ENV: "3"}) == 3
    assert launch_threads(four, {LAUNCH_THREADS_ENV: "16"}) == 4
    for bad, needle in (("0", "at least 1"), ("lots", "'lots'")):
        with pytest.raises(ConfigError) as e:
            launch_threads(four, {LAUNCH_THREADS_ENV: bad})
        assert LAUNCH_THREADS_ENV in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)


def _peak_running(db, run_materialize, instance=None, missing=None) -> tuple[int, object]:
    """The most tasks running at once while `run_materialize()` works; with `instance`, `missing`
    receives the drainer runs the lane poller would request (`LanePicture.missing`) at every sample
    where the tenant's launch holds more than one slot."""
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            n = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE status = 'running'")[0]["n"]
            peak[0] = max(peak[0], int(n))
            if instance is not None:
                picture = lane_picture(instance, db, Settings(lane_width=4))
                mine = picture.tenants.get("acme")
                if mine is not None and mine.busy >= 2:
                    missing.append(picture.missing("acme"))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = run_materialize()
    finally:
        stop.set()
        sampler.join(5)
    return peak[0], result


@pytest.mark.parametrize("threads", [None, "1"])
def test_a_launch_drains_its_phases_with_several_threads_and_reconciles(instance, engine_url, db, monkeypatch, threads):
    if threads is None:
        monkeypatch.delenv(LAUNCH_THREADS_ENV, raising=False)
    else:
        monkeypatch.setenv(LAUNCH_THREADS_ENV, threads)
    missing: list[int] = []
    peak, result = _peak_running(db, lambda: materialize_tenant(instance, "acme", resources(engine_url, options=OPTIONS)),
                                 instance, missing)
    assert result.success
    created = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = 'acme' AND action = 'created' GROUP BY kind")}
    target = {r["kind"]: r["n"] for r in db.sql(
        "SELECT kind, count(*) AS n FROM example_items WHERE tenant_id = 'acme' GROUP BY kind")}
    assert created == target == COUNTS
    assert db.sql("SELECT status FROM migrations WHERE tenant_id = 'acme'")[0]["status"] == "succeeded"
    if threads == "1":
        assert peak == 1, peak  # one lane slot per Dagster run (drainer runs widen it)
        assert missing == []
    else:
        assert peak >= 2, peak
        assert missing and set(missing) == {0}, missing  # its own threads hold its share: no drainer


def test_a_launch_alone_in_the_lane_takes_its_slots_once_not_at_every_phase(instance, engine_url, db, monkeypatch):
    """Alone in the lane, a launch reads the lane picture and writes its lane tags once for the
    whole Dagster run (issue 11: a picture read per phase op and every second of its drain, and two
    tag writes per phase op - raised at the start, lowered at the end - were a tenth of a small
    `migrate run`'s steps): its first phase op takes all its threads; the next ones find its tag
    saying so and nobody else in the lane, and keep it."""
    from migration_pipeline.lane import fair

    monkeypatch.delenv(LAUNCH_THREADS_ENV, raising=False)
    pictures: list[int] = []
    picture = fair.lane_picture
    monkeypatch.setattr(fair, "lane_picture", lambda *a, **k: pictures.append(1) or picture(*a, **k))
    writes: list[str] = []
    add = instance.add_run_tags

    def add_run_tags(run_id, new_tags):  # type: ignore[no-untyped-def]
        if fair.LANE_SLOTS_TAG in new_tags:
            writes.append(new_tags[fair.LANE_SLOTS_TAG])
        return add(run_id, new_tags)

    monkeypatch.setattr(instance, "add_run_tags", add_run_tags)
    # stale locks after 10 minutes: the live stamp is due every 150 s, not within this run
    res = resources(engine_url, options=OPTIONS, stale_lock_seconds=600)
    result = materialize_tenant(instance, "solo", res)
    assert result.success
    phases = len([e for e in result.get_asset_materialization_events()])
    assert phases >= 4
    assert len(pictures) == 1, f"{len(pictures)} lane pictures read for {phases} phases"
    assert writes == [str(res["lane"].engine_settings().lane_width)], f"lane tags written {writes} for {phases} phases"
