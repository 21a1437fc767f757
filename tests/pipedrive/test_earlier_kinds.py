"""A run whose rows point at parents of a kind an earlier run of the tenant imported settles the
missing ones as a run of that kind would (`earlier_kinds`), over the sandbox on real Postgres.

The six kinds first, the archived deals and leads alone later: a row of the later run whose person
or organization is deleted at the source is imported with the link empty, as one run of all eight
kinds imports it, not skipped "person 1239 is not here" for a parent kind the later run does not
take. Pinned here:
* every archived deal and lead of the split runs ends as one run of the eight kinds leaves it,
  row by row: the ledger's action, reason and dangling references, and the product row's values
  with each link as the source id of the row it points at - a custom field's record link too, which
  the one run fills at its end when the person was left to its catch-up's walk as the row was
  written (a person on a deleted organization: `pending_links`), and the split runs as they write
  the row (their first run wrote the person);
* a soft link (a custom field's person) whose parent an earlier run took and did not write is left
  empty, not owed "persons not taken yet" (`taken_before`), as in the one run;
* the later run asks about them through the v2 lists' `ids=` (persons and organizations many at a
  time; one alone by id, fewer tokens), at most a question per kind and page in its walks and in its
  catch-up (small account, seed 1: 17 requests in all, one `ids=` question of three persons;
  seed 8: 18, one of two persons and one organization by id);
* a parent of a kind no run of the tenant took is still not asked (test_references pins the run).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import pytest

from engine_core.skip_reason import NOT_WRITTEN
from tests.pipedrive.support import failed_tasks, migrate, sandbox

SIX = ["organizations", "persons", "deals", "leads", "activities", "notes"]
ARCHIVED = ["deals_archived", "leads_archived"]
# link column -> the product table it points into (compared by that row's source id: record ids
# differ between tenants)
LINKS = {"company_id": "companies", "contact_id": "contacts", "owner_id": "users", "pipeline_id": "pipelines",
         "stage_id": "stages"}
FIELD_LINKS = {"org": "companies", "people": "contacts", "user": "users"}
SURROGATE = {"id", "tenant_id", "created_at", "updated_at", "imported_at"}
TABLE = {"deals": "deals", "leads": "leads"}
PARENT_LISTS = {"/api/v2/persons": "persons", "/api/v2/organizations": "organizations"}
BY_ID = {"/api/v2/persons/{id}": "persons", "/api/v2/organizations/{id}": "organizations"}


def _archived(truth: dict[str, Any]) -> dict[str, set[str]]:
    ids = truth["ids"]
    return {"deals": {str(i) for i in ids["deals_archived"]}, "leads": {str(i).lower() for i in ids["leads_archived"]}}


def _outcomes(db, tenant: str, archived: dict[str, set[str]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    """(kind, source id) -> (action, reason, dangling, the product row as data) of every archived row."""
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for kind, wanted in archived.items():
        entries = db.sql("SELECT source_id, action, reason, dangling, record_id FROM migration_records"
                         " WHERE tenant_id = %(t)s AND kind = %(k)s AND source_id = ANY(%(ids)s)",
                         {"t": tenant, "k": kind, "ids": sorted(wanted)})
        rows = {r["id"]: r for r in db.sql(f"SELECT * FROM crm.{TABLE[kind]} WHERE tenant_id = %(t)s", {"t": tenant})}
        for e in entries:
            row = rows.get(e["record_id"])
            out[(kind, e["source_id"])] = (e["action"], e["reason"], e["dangling"],
                                           None if row is None else _as_data(db, row))
    return out


def _as_data(db, row: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in row.items() if k not in SURROGATE}
    for column, table in LINKS.items():
        if data.get(column) is not None:
            data[column] = _source_id(db, table, data[column])
    fields = {}
    for key, field in (data.get("custom_fields") or {}).items():
        if isinstance(field, dict) and field.get("record_id") is not None:
            field = {**field, "record_id": _source_id(db, FIELD_LINKS[field["type"]], field["record_id"])}
        fields[key] = field
    data["custom_fields"] = fields
    return data


def _soft_links(outcome: tuple[Any, ...]) -> list[tuple[str, str | None]]:
    """(source value, the source id of the row linked) of each custom field record link but users'
    (owed: no run took users)."""
    row = outcome[3] or {"custom_fields": {}}
    return [(str(f["value"]), f["record_id"]) for f in row["custom_fields"].values()
            if isinstance(f, dict) and "record_id" in f and f["type"] != "user"]


def _source_id(db, table: str, record_id: int) -> str:
    return db.sql(f"SELECT source_id FROM crm.{table} WHERE id = %(id)s", {"id": record_id})[0]["source_id"]


def _parent_questions(stats: dict[str, Any]) -> dict[str, list[set[str]]]:
    """Per parent kind, the ids of each `ids=` question of its list, and of each GET by id ({id})."""
    out: dict[str, list[set[str]]] = {"persons": [], "organizations": []}
    for key, n in stats["listings"].items():
        path, _, query = key.partition("?")
        ids = parse_qs(query).get("ids")
        if path in PARENT_LISTS and ids:
            out[PARENT_LISTS[path]].extend([set(ids[0].split(","))] * n)
    for path, kind in BY_ID.items():
        out[kind].extend([{"?"}] * stats["requests"].get(path, 0))
    return out


@pytest.mark.parametrize(("seed", "faults"), [(1, None), (8, None), (1, "badrow:0.1")])
def test_archived_lists_after_the_six_kinds_end_as_one_run_of_the_eight(db, seed: int, faults: str | None) -> None:
    # 1: three archived deals on deleted persons; 8: and a lead's organization; badrow: parents that
    # failed, or were served without a readable id (they exist at the source and are not written)
    with sandbox(scale="small", seed=seed, **({"faults": faults} if faults else {})) as sb:
        truth = sb.truth()
        whole = migrate(db, sb, "whole", kinds=SIX + ARCHIVED)
        first = migrate(db, sb, "split", kinds=SIX)
        sb.reset_stats()
        later = migrate(db, sb, "split", kinds=ARCHIVED)
        stats = sb.stats()
    for run in (whole, first, later):
        assert run.status == "succeeded", failed_tasks(db, run.id)
    archived = _archived(truth)
    ours, theirs = _outcomes(db, "split", archived), _outcomes(db, "whole", archived)
    listed = {(k, sid) for k, ids in archived.items() for sid in ids}
    assert ours.keys() == theirs.keys() and ours.keys() <= listed  # (a row without a readable id: in neither)
    assert len(ours) >= 0.8 * len(listed)
    # a custom field's record link (a soft link) is the same too: one run of the eight kinds fills
    # it at its end when its person was left to the catch-up's walk as the row was written (a
    # person on a deleted organization); the split runs link it as they write the row
    soft = {k: _soft_links(ours[k]) for k in ours}
    assert all(sid is None or sid == value for links in soft.values() for value, sid in links), soft
    assert any(sid is not None for links in soft.values() for _, sid in links), soft
    assert {k: (ours[k], theirs[k]) for k in ours if ours[k] != theirs[k]} == {}
    # the account has what this is about: archived rows on parents deleted at the source, imported
    gone = {k: [r for r in v[2] or () if not r.get("owed")] for k, v in ours.items()}
    gone = {k: refs for k, refs in gone.items() if refs}
    assert gone and all(ours[k][0] == "created" and f"{r['field']} {r['parent_id']} does not exist at the source" in ours[k][1]
                        for k, refs in gone.items() for r in refs), gone
    placeholders = {k: v[1] for k, v in ours.items() if v[0] == "skipped"}
    if faults is None:
        assert placeholders == {}  # nothing left skipped
    else:  # parents that exist and are not written: asked too, and said so (`skip_reason`)
        assert any(NOT_WRITTEN in reason for reason in placeholders.values()), placeholders
    # asked many at a time: at most a question per kind and page, in the walks and in the catch-up
    questions = _parent_questions(stats)
    asked = sum(len(q) for q in questions.values())
    pages = -(-len(archived["deals"]) // 500) + -(-len(archived["leads"]) // 500)
    # (a source serving rows without a readable id has the ids such a list answer leaves asked by
    # id: `writers._request`)
    assert 0 < asked and (faults is not None or asked <= 2 * pages * len(questions)), questions
