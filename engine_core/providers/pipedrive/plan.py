"""The Pipedrive provider's plan, as data: ordered kind groups, one per phase.

Parents come before the rows that point at them: owners and field definitions, organizations,
persons (in organizations), deals and leads (on persons/organizations; archived ones come from
their own endpoints), then activities and notes (on any of those), then each deal's email.
Activities and notes are separate phases so a "notes and activities only" run has two.
"""
from __future__ import annotations

PHASES: list[list[str]] = [
    ["fields", "users"],
    ["organizations"],
    ["persons"],
    ["deals", "deals_archived", "leads", "leads_archived"],
    ["activities"],
    ["notes"],
    ["emails"],
]
