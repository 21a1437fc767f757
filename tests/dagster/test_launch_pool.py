"""Dagster's storage keeps its Postgres connection (issue 11, `migrate run` within 1.5x of the engine).

dagster-postgres opens and closes a connection per storage call (NullPool): a `migrate run` of a
small account made ~600 of them in its run worker (every event, every run-tag read and write of the
lane bookkeeping), ~3 s of its wall time. The instance the commands render (`dagster.yaml`, through
`migration_pipeline.storage`) keeps one per process, and gives it back on dispose.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml
from sqlalchemy import event

from migration_pipeline.instance import STORAGE_URL_ENV, instance_config, to_url


def _instance(tmp_path: Path, engine_url: str, monkeypatch):
    from dagster import DagsterInstance

    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance_config(lane_width=4)))
    monkeypatch.setenv(STORAGE_URL_ENV, to_url(engine_url, scheme="postgresql+psycopg2"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    return DagsterInstance.from_config(str(tmp_path))


def test_storage_calls_reuse_one_connection_and_dispose_gives_it_back(tmp_path, engine_url, monkeypatch):
    from dagster import DagsterRun

    instance = _instance(tmp_path, engine_url, monkeypatch)
    try:
        engines = {id(s._engine): s._engine for s in (instance.run_storage, instance.event_log_storage,
                                                       instance.schedule_storage)}
        connects: list[int] = []
        for engine in engines.values():
            event.listen(engine, "connect", lambda *a: connects.append(1))
        run = instance.add_run(DagsterRun(job_name="pool_probe", run_id="0" * 8 + "-pool-probe"))
        for i in range(20):  # what a phase op's lane bookkeeping does between its events
            instance.add_run_tags(run.run_id, {"migration/lane_seen": str(i)})
            assert instance.get_run_by_id(run.run_id).tags["migration/lane_seen"] == str(i)
            instance.get_daemon_heartbeats()
            instance.get_records_for_run(run.run_id)
        assert len(connects) <= 2, f"{len(connects)} connections opened for 80 storage calls (one per call: NullPool)"
        assert len(engines) == 1, "the three storages of one instance share one engine (one kept connection)"
        engine = next(iter(engines.values()))
        assert engine.pool.checkedin() == 1
    finally:
        instance.dispose()
    assert engine.pool.checkedin() == 0, "dispose() closes the kept connection (a DROP DATABASE is not blocked)"
    assert os.environ[STORAGE_URL_ENV]  # the storage URL came from the environment, never the file
