"""Cursors and stripes: where each task of a kind starts, and the task it hands on to.

Offset-paginated (v1) kinds - users, leads, leads_archived, notes - are striped by page arithmetic,
as in the seeds: four tasks start at pages 0, 500, 1000 and 1500, and a task whose page was full
creates the next page of its own stripe, start + 4 x 500. The cursor is `{"start": n}` and the
cursor key `kind:n`, so a retried page finds its successor already there.

Cursor-paginated (v2) kinds - organizations, persons, deals, deals_archived, activities - have no
page arithmetic: a v2 cursor is opaque and only reachable by walking. They are striped by ranges of
`update_time`, the one range filter every v2 list accepts (`updated_since` inclusive,
`updated_until` exclusive). A discovery task per kind (`kind:discover`, two one-row listings:
oldest and newest `update_time`) cuts [oldest, newest] into four equal spans and seeds one walker
per span (`kind:s<stripe>:p0`); each walker lists its span page by page in id order, carrying the
v2 cursor, and creates its own next page (`kind:s<stripe>:p<n+1>`). The first span is open below
and the last open above, so a row outside [oldest, newest] - one updated while the run walks, say -
still falls into exactly one stripe: a row updated mid-walk moves to the open-ended last stripe,
which is walked in id order and picks it up unless it has already passed that id (a later run
catches it; the ledger makes that rerun cheap). Ids were the alternative, but v2 lists take no id
range (only `ids=` lists of 100), and time spans need no knowledge of the id space. Equal spans
are equal work when records arrive evenly; an account that grew fast recently has a heavier last
stripe, which still walks alongside the other three rather than after them.

Pipelines and stages are v2 lists without time filters, and short: each has one walker over the
whole list (`kind:s0:p0`, the shape of a stripe with neither bound).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from engine_core.models import Successor

STRIPES = 4
PAGE = 500  # the API's largest page: one listing call either way, so never smaller

V1_PATHS: dict[str, str] = {
    "users": "/v1/users",
    "leads": "/v1/leads",
    "leads_archived": "/v1/leads/archived",
    "notes": "/v1/notes",
}
V2_PATHS: dict[str, str] = {
    "organizations": "/api/v2/organizations",
    "persons": "/api/v2/persons",
    "deals": "/api/v2/deals",
    "deals_archived": "/api/v2/deals/archived",
    "activities": "/api/v2/activities",
    "pipelines": "/api/v2/pipelines",
    "stages": "/api/v2/stages",
}
# v2 lists that take no time filter (and are a page or two long): one walker from the start.
UNSTRIPED: frozenset[str] = frozenset({"pipelines", "stages"})


# --- v1: page arithmetic ---------------------------------------------------------------------


def v1_seeds(kind: str, stripes: int = STRIPES, page: int = PAGE) -> list[Successor]:
    return [Successor(f"{kind}:{i * page}", {"start": i * page}) for i in range(stripes)]


def v1_next(kind: str, start: int, stripes: int = STRIPES, page: int = PAGE) -> Successor:
    nxt = start + stripes * page
    return Successor(f"{kind}:{nxt}", {"start": nxt})


# --- v2: update_time spans -------------------------------------------------------------------


def v2_seeds(kind: str) -> list[Successor]:
    if kind in UNSTRIPED:
        return v2_stripe_seeds(kind, [(None, None)])
    return [Successor(f"{kind}:discover", {"discover": True})]


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def time_spans(oldest: datetime | None, newest: datetime | None, stripes: int = STRIPES) -> list[tuple[str | None, str | None]]:
    """[since, until) spans covering everything: the first open below, the last open above.

    Boundaries are whole seconds (the filters' resolution); spans never repeat a boundary, so a
    short history yields fewer stripes rather than empty ones.
    """
    if oldest is None or newest is None or newest <= oldest:
        return [(None, None)]
    start = oldest.replace(microsecond=0)
    width = (newest - start).total_seconds() + 1
    cuts: list[datetime] = []
    for i in range(1, stripes):
        cut = start + timedelta(seconds=int(width * i / stripes))
        if cut > start and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
    bounds: list[str | None] = [None, *(rfc3339(c) for c in cuts), None]
    return list(zip(bounds[:-1], bounds[1:]))


def v2_stripe_seeds(kind: str, spans: list[tuple[str | None, str | None]]) -> list[Successor]:
    return [
        Successor(f"{kind}:s{i}:p0", {"stripe": i, "since": since, "until": until, "cursor": None, "page": 0})
        for i, (since, until) in enumerate(spans)
    ]


def v2_next(kind: str, cursor: dict[str, Any], next_cursor: str) -> Successor:
    page = int(cursor.get("page", 0)) + 1
    return Successor(
        f"{kind}:s{cursor['stripe']}:p{page}",
        {"stripe": cursor["stripe"], "since": cursor.get("since"), "until": cursor.get("until"), "cursor": next_cursor, "page": page},
    )


def v2_params(cursor: dict[str, Any]) -> dict[str, str]:
    params: dict[str, str] = {}
    if cursor.get("since"):
        params["updated_since"] = cursor["since"]
    if cursor.get("until"):
        params["updated_until"] = cursor["until"]
    return params


# --- emails: discovery pages and tasks of ten deals --------------------------------------------

DEALS_PER_TASK = 10
MAIL_SOURCES: dict[str, str] = {"deals": "/api/v2/deals", "deals_archived": "/api/v2/deals/archived"}


def email_seeds() -> list[Successor]:
    """One discovery walker per deal list (active and archived deals carry mail alike)."""
    return [
        Successor(f"emails:discover:{source}:p0", {"discover": source, "cursor": None, "page": 0})
        for source in MAIL_SOURCES
    ]


def email_discovery_next(cursor: dict[str, Any], next_cursor: str) -> Successor:
    page = int(cursor.get("page", 0)) + 1
    source = cursor["discover"]
    return Successor(f"emails:discover:{source}:p{page}", {"discover": source, "cursor": next_cursor, "page": page})


def email_tasks(cursor: dict[str, Any], deal_ids: list[int], per_task: int = DEALS_PER_TASK) -> list[Successor]:
    """Tasks of ten deals; the key names the discovery page and the chunk, so a retried discovery
    page finds its tasks already there."""
    source, page = cursor["discover"], int(cursor.get("page", 0))
    return [
        Successor(f"emails:{source}:p{page}:c{j // per_task}", {"deals": deal_ids[j : j + per_task]})
        for j in range(0, len(deal_ids), per_task)
    ]
