"""Behaviour 14: one call returns a run's state (phase, tasks by status, per-kind counts, grouped
reasons); another returns task duration grouped by a payload stat (the seed's diagnostic query);
explain tells one source row's story from the ledger."""
from __future__ import annotations

from engine_core import rollup, runs
from engine_core.providers.base import provider_for
from engine_core.worker import drain_threads
from tests.engine.support import FAST


def test_rollup_duration_by_payload_and_explain(db) -> None:
    opts = {"page_size": 10, "counts": {"companies": 30, "contacts": 25, "deals": 20, "activities": 10, "notes": 10},
            "malformed": {"contacts": [4]}, "dangling": {"deals": [3]}}
    run = runs.start_run(db, provider_for("example"), "acme", options=opts, settings=FAST)
    drain_threads(db, run.id, width=3, settings=FAST)
    r = rollup.rollup(db, run.id)
    assert r.status == "succeeded" and r.current_phase == 5
    by = {k.kind: k for k in r.kinds}
    assert (by["companies"].imported, by["contacts"].imported, by["contacts"].failed) == (30, 24, 1)
    assert by["deals"].skipped >= 1 and by["deals"].imported + by["deals"].skipped == 20
    assert r.tasks["succeeded"] == sum(sum(k.tasks.values()) for k in r.kinds)
    assert r.reasons[0]["kind"] == "contacts" and r.reasons[0]["samples"] == ["4"]
    assert r.as_dict()["kinds"][0]["kind"] == "companies"

    rows = rollup.duration_by_payload(db, run.id, kind="companies", stat="imported", top=10)
    assert sum(x["tasks"] for x in rows) == by["companies"].tasks["succeeded"]
    assert {x["payload"] for x in rows} == {"10+", "0"}  # full pages and the empty tail pages

    assert rollup.explain(db, "acme", "contacts", "4")["action"] == "failed"
    deal = rollup.explain(db, "acme", "deals", "3")
    assert deal["action"] == "skipped" and deal["reason"] == "not linked to any record"
    assert rollup.explain(db, "acme", "companies", "1")["record_type"] == "example_items"
    assert rollup.explain(db, "acme", "companies", "999") is None
