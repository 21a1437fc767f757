"""Every Pipedrive kind, declared once: endpoint, API version, paging, page size, token cost, phase,
target table, ledger identity, parents, custom-field entity and mapping function.

The rest of the provider reads these entries: the plan (`plan.PHASES`, `plan.DEPENDS_ON`), the
listing (`stripes`: offset pages for v1, `update_time` stripes for v2), the parent probe
(`writers`: by id, or many at a time through a v2 list's `ids`), the catch-up (`inventory`:
its walk order, `updated_since`, GET by id) and the cost meter (`TOKEN_COSTS`). Adding a kind is
an entry here, a mapping function in `mappers.py` and a table in `target/`.

Token costs are the published specs' `x-token-cost` (shared/pipedrive-openapi).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from engine_core.providers.pipedrive import files, mappers, mapping, products

V1, V2 = "v1", "v2"
OFFSET, CURSOR, FIELDS, FAN_OUT = "offset", "cursor", "fields", "fan-out"
BATCH = "batch"  # a v2 list asked for many parents at once (`deal_ids`): lines.py
DOWNLOAD = "download"  # one file's bytes per request (contents.py)
PAGE = 500  # the API's largest page: one listing call either way, so never smaller


@dataclass(frozen=True)
class Kind:
    """One kind of the plan.

    `path`: its list endpoint (`/v1/...` or `/api/v2/...`; a fan-out's per-deal path with `{}`);
    `api`: "v1" | "v2"; `paging`: "offset" (v1 `start`/`limit`), "cursor" (v2 `cursor`),
    "fields" (the field definitions task), "fan-out" (one listing per deal), "batch" (one
    listing per 100 deals the ledger holds, `lines.py`) or "download" (a file's bytes a request,
    `contents.py`); `page_size`: rows a list request asks for (the API's cap for the list); `cost`: tokens per
    list request; `phase`: index of its phase in the plan; `table`: the product table its rows go
    to; `ledger`: the ledger kind its rows are kept under (an archived list shares its kind's
    identities); `depends_on`: the kinds its rows must link to (or be skipped as not linked);
    `entity`: whose custom field definitions describe its rows (None: no custom fields);
    `mapper(row, tenant_id, book) -> Mapped`; `striped`: a v2 list walked in `update_time`
    stripes (False: one walker, the list takes no time filter); `since`: the list takes
    `updated_since`; `params`: extra list parameters; `version_field`: the row's version field;
    `by_id`: GET of one record (`{}` is the id), for the probe and the deletion check; `probed`:
    a parent the engine asks the source about when it is missing; `batch_paths`: v2 lists whose
    `ids` answer many parents at once; `summary`: the source's own count of the list (asked only when
    the discovery's first page did not hold the whole list; never a deprecated endpoint: archived
    deals have none); `counted`: the discovery records the source's count (`source_total`: the
    summary's, or the rows of a list its first page held);
    `catchup`: position in the catch-up walk (parents first; None: not walked); `last_level`:
    nothing links to it, so the catch-up walks it in a task of its own; `default`: a run that
    names no kinds takes it (False: opt-in - its cost grows with the account's deals, records or
    file bytes, so a run takes it only when asked, `--kinds +name`; the costs are in the README's
    "Choosing the kinds")."""

    name: str
    path: str
    api: str
    paging: str
    cost: int
    phase: int
    table: str
    ledger: str = ""
    depends_on: tuple[str, ...] = ()
    entity: str | None = None
    mapper: Callable[..., mapping.Mapped] | None = None
    page_size: int = PAGE
    striped: bool = True
    since: bool = False
    params: Mapping[str, str] = field(default_factory=dict)
    version_field: str = "update_time"
    by_id: str | None = None
    probed: bool = False
    batch_paths: tuple[str, ...] = ()
    summary: tuple[str, int] | None = None
    counted: bool = False
    catchup: int | None = None
    last_level: bool = False
    default: bool = True

    def __post_init__(self) -> None:
        if not self.ledger:
            object.__setattr__(self, "ledger", self.name)


_DEALS = ("deals", "deals_archived")
_LEADS = ("leads", "leads_archived")
_MAIL_COUNT = {"include_fields": "email_messages_count"}  # for the mail catch-up and `emails`

KINDS: tuple[Kind, ...] = (
    Kind("fields", "", V2, FIELDS, 0, phase=0, table="custom_field_definitions"),
    Kind("users", "/v1/users", V1, OFFSET, 20, phase=0, table="users", mapper=mappers.map_user,
         version_field="modified", by_id="/v1/users/{}", catchup=0),
    Kind("pipelines", "/api/v2/pipelines", V2, CURSOR, 5, phase=0, table="pipelines", mapper=mappers.map_pipeline,
         striped=False, by_id="/api/v2/pipelines/{}", probed=True, catchup=1),
    Kind("organizations", "/api/v2/organizations", V2, CURSOR, 10, phase=1, table="companies",
         entity="organization", mapper=mappers.map_organization, since=True, by_id="/api/v2/organizations/{}",
         probed=True, batch_paths=("/api/v2/organizations",), catchup=3),
    Kind("products", "/api/v2/products", V2, CURSOR, 10, phase=1, table="products", entity="product",
         mapper=products.map_product, striped=False, by_id="/api/v2/products/{}", probed=True,
         batch_paths=("/api/v2/products",), catchup=11, last_level=True),
    Kind("stages", "/api/v2/stages", V2, CURSOR, 5, phase=1, table="stages", depends_on=("pipelines",),
         mapper=mappers.map_stage, striped=False, by_id="/api/v2/stages/{}", probed=True, catchup=2),
    Kind("persons", "/api/v2/persons", V2, CURSOR, 10, phase=2, table="contacts", depends_on=("organizations",),
         entity="person", mapper=mappers.map_person, since=True, by_id="/api/v2/persons/{}", probed=True,
         batch_paths=("/api/v2/persons",), catchup=4),
    Kind("deals", "/api/v2/deals", V2, CURSOR, 10, phase=3, table="deals", depends_on=("persons", "organizations"),
         entity="deal", mapper=mappers.map_deal, since=True, params=_MAIL_COUNT, by_id="/api/v2/deals/{}",
         probed=True, batch_paths=("/api/v2/deals", "/api/v2/deals/archived"),
         summary=("/v1/deals/summary", 40), counted=True, catchup=5),
    Kind("deals_archived", "/api/v2/deals/archived", V2, CURSOR, 20, phase=3, table="deals", ledger="deals",
         depends_on=("persons", "organizations"), entity="deal",
         mapper=partial(mappers.map_deal, archived_kind=True), since=True, params=_MAIL_COUNT,
         counted=True, catchup=6),
    Kind("leads", "/v1/leads", V1, OFFSET, 20, phase=3, table="leads", depends_on=("persons", "organizations"),
         entity="lead", mapper=mappers.map_lead, since=True, by_id="/v1/leads/{}", probed=True, catchup=7),
    Kind("leads_archived", "/v1/leads/archived", V1, OFFSET, 40, phase=3, table="leads", ledger="leads",
         depends_on=("persons", "organizations"), entity="lead",
         mapper=partial(mappers.map_lead, archived_kind=True), catchup=8),
    Kind("activities", "/api/v2/activities", V2, CURSOR, 10, phase=4, table="activities",
         depends_on=(*_DEALS, *_LEADS, "persons", "organizations"), entity="activity",
         mapper=mappers.map_activity, since=True, by_id="/api/v2/activities/{}", catchup=9, last_level=True),
    Kind("notes", "/v1/notes", V1, OFFSET, 20, phase=5, table="notes",
         depends_on=(*_DEALS, *_LEADS, "persons", "organizations"), entity="note", mapper=mappers.map_note,
         since=True, by_id="/v1/notes/{}", catchup=10, last_level=True),
    Kind("emails", "/v1/deals/{}/mailMessages", V1, FAN_OUT, 20, phase=6, table="emails", depends_on=_DEALS),
    # the further families: a deal's product lines, by the deals the ledger holds (lines.py)
    Kind("deal_products", "/api/v2/deals/products", V2, BATCH, 10, phase=4, table="deal_products",
         depends_on=(*_DEALS, "products"), mapper=products.map_deal_product),
    # files: the metadata (`/v1/files` pages at most 100 rows), then - opt-in - every file's bytes
    Kind("files", "/v1/files", V1, OFFSET, 20, phase=5, table="files", mapper=files.map_file, page_size=100,
         by_id="/v1/files/{}", catchup=12, last_level=True),
    Kind("file_contents", "/v1/files/{}/download", V1, DOWNLOAD, 20, phase=6, table="files", depends_on=("files",),
         default=False),
    # per-record lists (record_lists.py), opt-in: their cost grows with the account's records
    Kind("participants", "/v1/deals/{}/participants", V1, FAN_OUT, 10, phase=7, table="deal_participants",
         depends_on=(*_DEALS, "persons"), default=False),
    Kind("followers", "/api/v2/{}/{}/followers", V2, FAN_OUT, 10, phase=7, table="followers",
         depends_on=(*_DEALS, "persons", "organizations"), default=False),
    Kind("deal_history", "/v1/deals/{}/changelog", V1, FAN_OUT, 20, phase=7, table="deal_history",
         depends_on=_DEALS, default=False),
)
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}

# The field definitions task's lists: v2 (cursor) for the entities that have them, v1 (offset) for the rest.
V2_FIELD_LISTS: dict[str, str] = {
    "deal": "/api/v2/dealFields",
    "person": "/api/v2/personFields",
    "organization": "/api/v2/organizationFields",
    "activity": "/api/v2/activityFields",
    "product": "/api/v2/productFields",
}
V1_FIELD_LISTS: dict[str, str] = {"lead": "/v1/leadFields", "note": "/v1/noteFields"}
FIELD_LIST_COSTS: dict[str, int] = {
    "/api/v2/personFields": 10, "/api/v2/organizationFields": 10, "/api/v2/dealFields": 10,
    "/api/v2/activityFields": 10, "/api/v2/productFields": 10, "/v1/leadFields": 20, "/v1/noteFields": 20,
}

CATCHUP = "catchup"


def kind(name: str) -> Kind:
    """The entry of a kind; raises KeyError naming the kind when the provider has no such kind."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"the pipedrive provider has no kind {name!r}") from None


def ledger_kind(task_kind: str) -> str:
    """The ledger kind a task kind writes: `deals_archived` -> `deals`, `leads_archived` ->
    `leads`, every other kind (and a name that is no kind) itself."""
    entry = BY_NAME.get(task_kind)
    return entry.ledger if entry is not None else task_kind


def phases() -> list[list[str]]:
    """The data phases: kind names grouped by `phase`, in declaration order."""
    groups: dict[int, list[str]] = {}
    for k in KINDS:
        groups.setdefault(k.phase, []).append(k.name)
    return [groups[i] for i in sorted(groups)]


def _listed(api: str) -> dict[str, str]:
    return {k.name: k.path for k in KINDS if k.api == api and k.paging in (OFFSET, CURSOR)}


CATCHUP_ORDER: tuple[str, ...] = tuple(k.name for k in sorted((k for k in KINDS if k.catchup is not None),
                                                            key=lambda k: k.catchup))
DEPENDS_ON: dict[str, tuple[str, ...]] = {**{k.name: k.depends_on for k in KINDS}, CATCHUP: CATCHUP_ORDER}
V1_PATHS: dict[str, str] = _listed(V1)
V2_PATHS: dict[str, str] = _listed(V2)
UNSTRIPED: frozenset[str] = frozenset(k.name for k in KINDS if k.paging == CURSOR and not k.striped)
ENTITY_OF_KIND: dict[str, str] = {k.name: k.entity for k in KINDS if k.entity is not None}
MAPPERS: dict[str, Callable[..., mapping.Mapped]] = {k.name: k.mapper for k in KINDS if k.mapper is not None}
PARAMS: dict[str, Mapping[str, str]] = {k.name: k.params for k in KINDS if k.params}
VERSION_FIELD: dict[str, str] = {k.name: k.version_field for k in KINDS if k.version_field != "update_time"}
SINCE_KINDS: frozenset[str] = frozenset(k.name for k in KINDS if k.since)
# Lists without `updated_since` that sort by update time: a listing of what changed since a moment
# walks them newest first and stops at the first page that reaches an older row (`inventory.list_step`).
NEWEST_FIRST: dict[str, str] = {"files": "update_time DESC", "leads_archived": "update_time DESC"}
LAST_LEVEL: frozenset[str] = frozenset(k.name for k in KINDS if k.last_level)
PARENT_PATHS: dict[str, str] = {k.name: k.by_id for k in KINDS if k.probed and k.by_id}
SINGLE_PATHS: dict[str, str] = {k.name: k.by_id for k in KINDS if k.by_id}
BATCH_PATHS: dict[str, tuple[str, ...]] = {k.name: k.batch_paths for k in KINDS if k.batch_paths}
SUMMARY_PATHS: dict[str, str] = {k.name: k.summary[0] for k in KINDS if k.summary}
COUNTED: frozenset[str] = frozenset(k.name for k in KINDS if k.counted)
OPT_IN: frozenset[str] = frozenset(k.name for k in KINDS if not k.default)
PAGE_SIZES: dict[str, int] = {k.name: k.page_size for k in KINDS if k.page_size != PAGE}


def page_of(kind: str) -> int:
    """Rows a list request of `kind` asks for: its `page_size` (PAGE unless the API caps it lower)."""
    return PAGE_SIZES.get(kind, PAGE)

# Tokens per request of a fan-out's per-record list, by the path's last segment ("/participants").
FAN_OUT_COSTS: dict[str, int] = {k.path.rsplit("}", 1)[1]: k.cost for k in KINDS if k.paging == FAN_OUT}

# Tokens per request: each kind's list, the field lists, the deal summaries, a deal's mail listing,
# and one record by id (v2: 1, v1: 2).
TOKEN_COSTS: dict[str, Any] = {
    **{k.path: k.cost for k in KINDS if k.paging in (OFFSET, CURSOR, BATCH)},
    **FIELD_LIST_COSTS,
    **{path: cost for k in KINDS if k.summary for path, cost in [k.summary]},
    "mailMessages": BY_NAME["emails"].cost, "download": BY_NAME["file_contents"].cost, "v2 single": 1, "v1 single": 2,
}
