"""The Pipedrive provider's plan, as data: ordered kind groups, one per phase.

Parents come before the rows that point at them: owners, field definitions and pipelines, then
organizations and the pipelines' stages, persons (in organizations), deals and leads (on persons/organizations; archived ones come from
their own endpoints), then activities and notes (on any of those), then each deal's email; then the catch-up (issue 9): what changed at the source since the run's
snapshot - created, changed, deleted rows of every kind - found by one inventory walk per kind.
Activities and notes are separate phases so a "notes and activities only" run has two.
"""
from __future__ import annotations

PHASES: list[list[str]] = [
    ["fields", "users", "pipelines"],
    ["organizations", "stages"],
    ["persons"],
    ["deals", "deals_archived", "leads", "leads_archived"],
    ["activities"],
    ["notes"],
    ["emails"],
]
# The catch-up phase (issue 9, `inventory.py`): what changed at the source while the run walked,
# and what was deleted, under the other kinds' ledger identities. Always the provider's last phase
# (`PipedriveProvider.phases()` = PHASES + [[CATCHUP]]); PHASES are the data phases.
CATCHUP = "catchup"

# The kinds whose rows a kind's rows must link to (or be skipped as "not linked"). Owners, a deal's
# pipeline and stage, people on mail and custom-field references are soft links and not listed. A retry revisits the later
# tasks of kinds that depend, directly or not, on a kind that failed.
_DEALS = ("deals", "deals_archived")
_LEADS = ("leads", "leads_archived")
DEPENDS_ON: dict[str, tuple[str, ...]] = {
    "fields": (),
    "users": (),
    "pipelines": (),
    "stages": ("pipelines",),
    "organizations": (),
    "persons": ("organizations",),
    "deals": ("persons", "organizations"),
    "deals_archived": ("persons", "organizations"),
    "leads": ("persons", "organizations"),
    "leads_archived": ("persons", "organizations"),
    "activities": (*_DEALS, *_LEADS, "persons", "organizations"),
    "notes": (*_DEALS, *_LEADS, "persons", "organizations"),
    "emails": _DEALS,
    "catchup": ("users", "pipelines", "stages", "organizations", "persons", *_DEALS, *_LEADS, "activities", "notes"),
}
