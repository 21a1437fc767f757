"""The kinds the generator makes, their ids (with the gaps deleted rows leave) and their references."""
from __future__ import annotations

GAP_PERIOD = 21  # ids divisible by this were "deleted": they never appear, dangling refs point at them

KINDS: tuple[str, ...] = (
    "users",
    "organizations",
    "persons",
    "deals",
    "leads",
    "activities",
    "notes",
    "mail_messages",
    "pipelines",
    "stages",
    "products",
    "deal_products",
    "files",
    "participants",
    "followers",
    "deal_history",
)
KIND_CODE: dict[str, int] = {k: i + 11 for i, k in enumerate(KINDS)}
GAPPED_KINDS = frozenset({"organizations", "persons", "deals", "activities", "notes", "products"})
MALFORMABLE_KINDS: tuple[str, ...] = ("organizations", "persons", "deals", "leads", "activities", "notes", "mail_messages")
DANGLING_KINDS: tuple[str, ...] = ("persons", "deals", "leads", "activities", "notes")
# The reference fields of each kind that can dangle: (field, parent kind).
REF_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "persons": (("org_id", "organizations"),),
    "deals": (("person_id", "persons"), ("org_id", "organizations")),
    "leads": (("person_id", "persons"), ("organization_id", "organizations")),
    "activities": (("deal_id", "deals"), ("lead_id", "leads"), ("person_id", "persons"), ("org_id", "organizations")),
    "notes": (("deal_id", "deals"), ("lead_id", "leads"), ("person_id", "persons"), ("org_id", "organizations")),
}


def index_to_id(kind: str, index: int) -> int:
    """The id of the row at `index` (0-based) of `kind`: index + 1, skipping every multiple of
    GAP_PERIOD for the gapped kinds (the ids of rows deleted before the export)."""
    if kind in GAPPED_KINDS:
        return index + 1 + index // (GAP_PERIOD - 1)
    return index + 1


def id_to_index(kind: str, ident: int) -> int | None:
    """The row index of id `ident` of `kind`, or None for ids below 1 or in a gap (a deleted row)."""
    if ident < 1:
        return None
    if kind in GAPPED_KINDS:
        if ident % GAP_PERIOD == 0:
            return None
        return ident - 1 - ident // GAP_PERIOD
    return ident - 1
