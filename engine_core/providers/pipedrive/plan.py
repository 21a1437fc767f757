"""The Pipedrive provider's plan, as data: ordered kind groups, one per phase.

Parents come before the rows that point at them: owners, field definitions and pipelines, then
organizations and the pipelines' stages, persons (in organizations), deals and leads (on persons/organizations; archived ones come from
their own endpoints), then activities and notes (on any of those), then each deal's email; then the catch-up: what changed at the source since the run's
snapshot - created, changed, deleted rows of every kind - found by one inventory walk per kind.
Activities and notes are separate phases so a "notes and activities only" run has two. Each kind's
phase and parents are declared in `kinds.py`.
"""
from __future__ import annotations

from engine_core.providers.pipedrive.kinds import CATCHUP, DEPENDS_ON, phases  # noqa: F401 - the plan's names

PHASES: list[list[str]] = phases()
