""""Materialize all" (and each partition of a backfill) on a tenant migrated for some kinds takes
only the kinds it lacks, as `migrate run` does (`runs.attach`, `coverage.Coverage`): its engine run
plans those kinds alone, the first phase step logs the line saying so, the phases of the kinds
taken before are not walked again (materialised as not planned), and the materialised phases' `left_out` does not name
them as "not chosen". With nothing left the launch is refused as before (CANCELED)."""
from __future__ import annotations

import pytest
from dagster import DagsterRunStatus

from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads
from tests.dagster.support import materialize_tenant, resources
from tests.engine.support import FAST

pytestmark = pytest.mark.timeout(180)
TINY = {"page_size": 20, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def test_materialize_all_on_a_partly_migrated_tenant_takes_only_the_kinds_it_lacks(instance, engine_url, db):
    provider = provider_for("example")
    first = runs.start_run(db, provider, "part", kinds=["companies", "contacts"], options=TINY, settings=FAST)
    drain_threads(db, first.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, first.id).status == "succeeded"
    result = materialize_tenant(instance, "part", resources(engine_url, options=TINY), raise_on_error=True)
    ids = [r["id"] for r in db.sql("SELECT id FROM migrations WHERE tenant_id = 'part' ORDER BY id")]
    assert len(ids) == 2
    second = runs.get_run(db, ids[1])
    assert second.status == "succeeded" and list(second.kinds) == ["deals", "activities", "notes"], second.kinds
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    line = ("tenant 'part' is migrated for companies, contacts; this run takes the kinds it lacks: deals, activities, "
            "notes; `migrate sync part` brings the migrated ones up to date")
    assert any(line in m for m in logs), [m for m in logs if "migrated" in m]
    md = {e.asset_key.path[-1]: e.materialization.metadata for e in result.get_asset_materialization_events()}
    # a phase of a kind taken before is not walked: materialised as not planned only because a later
    # phase of the Dagster run is (Dagster skips every step after one not materialised)
    assert md["phase_1_companies"]["run_kinds"].value.startswith("no kind of this phase in the run"), md
    assert "phase_5_notes" in md and "run_kinds" not in md["phase_5_notes"], sorted(md)
    assert all("left_out" not in m or "companies" not in m["left_out"].value for m in md.values()), md
    again = materialize_tenant(instance, "part", resources(engine_url, options=TINY))
    assert instance.get_run_by_id(again.run_id).status == DagsterRunStatus.CANCELED
    assert len(db.sql("SELECT id FROM migrations WHERE tenant_id = 'part'")) == 2
