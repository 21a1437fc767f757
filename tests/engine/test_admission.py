"""Behaviour 2: one live run per (tenant, source); 50 concurrent starts admit exactly one;
retry and resume pass the same check."""
from __future__ import annotations

import threading

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.errors import AdmissionRefused
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST


def test_second_start_is_refused_naming_the_live_run(db) -> None:
    p = provider_for("example")
    first = runs.start_run(db, p, "acme", settings=FAST)
    with pytest.raises(AdmissionRefused) as e:
        runs.start_run(db, p, "acme", settings=FAST)
    assert f"run #{first.id}" in str(e.value)
    assert e.value.live_run_id == first.id
    # another tenant is not affected
    runs.start_run(db, p, "other", settings=FAST)


def test_fifty_concurrent_starts_admit_exactly_one(db_url) -> None:
    database = dbmod.Database(db_url, max_size=50)
    p = provider_for("example")
    admitted, refused, errors = [], [], []
    gate = threading.Barrier(50)

    def start() -> None:
        gate.wait()
        try:
            admitted.append(runs.start_run(database, p, "acme", settings=FAST).id)
        except AdmissionRefused as e:
            refused.append(e.live_run_id)
        except Exception as e:  # pragma: no cover - surfaced by the assert
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    database.close()
    assert not errors
    assert len(admitted) == 1 and len(refused) == 49
    with dbmod.Database(db_url) as d:
        assert d.sql("SELECT count(*) AS n FROM migrations")[0]["n"] == 1


def test_retry_and_resume_pass_the_same_check(db) -> None:
    p = provider_for("example")
    old = runs.start_run(db, p, "acme", settings=FAST)
    runs.stop(db, old.id)
    assert runs.get_run(db, old.id).status == "stopped"
    live = runs.start_run(db, p, "acme", settings=FAST)  # a stopped run is not live
    with pytest.raises(AdmissionRefused, match=f"run #{live.id}"):
        runs.resume(db, old.id, p, settings=FAST)
    db.sql("UPDATE migration_tasks SET status = 'failed' WHERE migration_id = %(r)s", {"r": old.id})
    db.sql("UPDATE migrations SET status = 'failed' WHERE id = %(r)s", {"r": old.id})
    with pytest.raises(AdmissionRefused, match=f"run #{live.id}"):
        runs.retry(db, old.id, p, settings=FAST)
    assert runs.get_run(db, old.id).status == "failed"
