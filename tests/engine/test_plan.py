"""Behaviour 1: the plan is data; a run limited to some kinds has only the phases it needs."""
from __future__ import annotations

import pytest

from engine_core import runs
from engine_core.errors import ConfigError
from engine_core.plan import plan_for
from engine_core.providers.registry import provider_for
from engine_core.providers.pipedrive.plan import PHASES as PIPEDRIVE_PHASES
from tests.engine.support import FAST


def test_plan_for_limits_to_kinds_and_drops_empty_phases() -> None:
    phases = [["a", "b"], ["c"], ["d"], ["e"]]
    assert plan_for(phases) == phases
    assert plan_for(phases, ["d", "b"]) == [["b"], ["d"]]


def test_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="zebras"):
        plan_for([["a"]], ["zebras"])


def test_notes_and_activities_only_run_has_two_phases(db) -> None:
    run = runs.start_run(db, provider_for("example"), "t1", kinds=["notes", "activities"], settings=FAST)
    assert [list(g) for g in run.plan] == [["activities"], ["notes"]]
    assert {r["phase"] for r in db.sql("SELECT DISTINCT phase FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})} == {0}
    assert plan_for(PIPEDRIVE_PHASES, ["notes", "activities"]) == [["activities"], ["notes"]]
