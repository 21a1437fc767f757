"""What a fresh user read wrong in the CLI's tables and the phase metadata:

* a dry run's phase assets read "materialized" (data written): the launch's per-phase table says
  "dry run: nothing written", and each phase materialisation's metadata opens with `dry_run_note`;
"""
from __future__ import annotations

import pytest

from engine_core import rollup as rollups
from engine_core import runs
from engine_core.providers.registry import for_run, provider_for
from engine_core.worker import drain_threads

pytestmark = pytest.mark.timeout(120)
SMALL = {"page_size": 20, "counts": {"companies": 30, "contacts": 20, "deals": 10, "activities": 10, "notes": 10}}


def _captured(print_fn, *args, width: int = 220) -> str:
    from migration_pipeline.cli.output import console

    saved = console.width
    console.width = width
    try:
        with console.capture() as captured:
            print_fn(*args)
    finally:
        console.width = saved
    return captured.get()


def test_a_dry_runs_phases_say_nothing_was_written(db):
    from migration_pipeline.assets.metadata import phase_metadata
    from migration_pipeline.cli.tables import print_phase_results
    from migration_pipeline.launch.results import PhaseResult

    run = runs.start_run(db, provider_for("example"), "dry", dry_run=True, options=SMALL)
    drain_threads(db, run.id, width=2, providers=for_run)
    md = phase_metadata(db, rollups.rollup(db, run.id), 0)
    first = next(iter(md))
    assert first == "dry_run_note" and "nothing was written" in md[first].value, list(md)
    assert md["dry_run"].value is True and "imported" in md  # what the asset records is kept

    results = [PhaseResult("example/phase_1_companies", "materialized", {"imported": 30}),
               PhaseResult("example/phase_2_contacts", "failed", {}, "boom")]
    text = _captured(print_phase_results, results, True)
    assert "dry run: nothing written" in text and "materialized" not in text, text
    assert "dry run: failed" in text, text
    real = _captured(print_phase_results, results, False)
    assert "materialized" in real and "dry run" not in real, real
