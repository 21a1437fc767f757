"""A tenant's latest run of a source it has no run of says which source it has none of, and which
sources it has runs of: "tenant 'acme' has no migration run" read as if the tenant had no run at all."""
from __future__ import annotations

import pytest

from engine_core import runs
from engine_core.errors import RunNotFound
from engine_core.providers.registry import provider_for
from tests.engine.support import FAST

OPTS = {"page_size": 10, "counts": {"companies": 5, "contacts": 5, "deals": 5, "activities": 5, "notes": 5}}


def test_a_tenant_without_a_run_of_the_source_names_the_sources_it_has(db):
    runs.start_run(db, provider_for("example"), "acme", options=OPTS, settings=FAST)
    assert runs.latest_run(db, "acme", "example").tenant_id == "acme"
    with pytest.raises(RunNotFound) as e:
        runs.latest_run(db, "acme", "pipedrive")
    assert str(e.value) == "tenant 'acme' has no run of source 'pipedrive' (its runs are of: example)"
    with pytest.raises(RunNotFound, match="^tenant 'nobody' has no migration run$"):
        runs.latest_run(db, "nobody", "pipedrive")
    with pytest.raises(RunNotFound, match="^tenant 'nobody' has no migration run$"):
        runs.latest_run(db, "nobody")
