"""A soft link to a kind a run leaves out is recorded as owed and filled when a run takes that kind
(`engine_core.owed_links`), in a column (an owner) or inside JSON (a custom field naming a user):
after a run without users every owner is owed - `migrate explain` and verify say so, per row - and
a run of users alone fills each contact's, deal's and activity's owner as the source has it, with
nothing owed afterwards; that run says how many links it filled, per parent kind and column."""
from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from engine_core import owed_links, rollup, row_story
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from migration_pipeline.assets import metadata

from .support import FAST, failed_tasks, migrate, sandbox

TENANT = "mix1"
WITHOUT_USERS = ["pipelines", "stages", "organizations", "persons", "deals", "deals_archived", "activities"]
OWNED = {"persons": "contacts", "deals": "deals", "activities": "activities"}


def _owners(db: Any, table: str) -> dict[str, str | None]:
    """source id -> the owner's source id, as the product holds it."""
    rows = db.sql(f"SELECT t.source_id, u.source_id AS owner FROM crm.{table} t LEFT JOIN crm.users u ON u.id = t.owner_id"
                  " WHERE t.tenant_id = %(t)s", {"t": TENANT})
    return {str(r["source_id"]): r["owner"] for r in rows}


def _truth_owners(sb: Any, kind: str) -> dict[str, str | None]:
    """source id -> its owner's id, as the sandbox serves the row now (`/_sandbox/truth?rows=1`)."""
    rows = httpx.get(f"{sb.base_url}/_sandbox/truth", params={"kind": kind, "rows": "1"}).json()["rows"]
    out: dict[str, str | None] = {}
    for sid, row in rows.items():
        owner = row.get("owner_id")
        owner = owner.get("value") if isinstance(owner, dict) else owner
        out[sid] = None if owner is None else str(owner)
    return out


def test_owners_left_out_are_owed_then_filled_by_a_run_of_users(db, monkeypatch) -> None:
    monkeypatch.setattr(owed_links, "BATCH", 7)  # the fill reads the owed entries in batches: many of them here
    with sandbox(scale="tiny") as sb:
        first = migrate(db, sb, TENANT, kinds=WITHOUT_USERS)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        truth = {kind: _truth_owners(sb, kind) for kind in OWNED}
        truth["deals"].update(_truth_owners(sb, "deals_archived"))  # one ledger kind, one table
        owned = {kind: {sid for sid, o in t.items() if o is not None} for kind, t in truth.items()}
        assert all(owned.values()), owned
        for kind, table in OWNED.items():
            assert set(_owners(db, table).values()) == {None}, kind
        # every owner is recorded as owed, in words explain shows
        sid = sorted(owned["persons"], key=int)[0]
        story = row_story.explain(db, TENANT, "persons", sid)
        assert story is not None and f"owner_id {truth['persons'][sid]} is owed: users not taken yet" in story["reason"], story
        # verify says precisely which rows owe links to users, a kind no run took (left out, not missing)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["persons", "deals"])
        by_kind = {k.kind: k for k in proof.kinds}
        assert set(by_kind["persons"].owed_to["users"]) == owned["persons"], by_kind["persons"].owed_to
        assert set(by_kind["deals"].owed_to["users"]) == owned["deals"], by_kind["deals"].owed_to
        assert any(line.startswith("  owed to users") and "--kinds users` fills them" in line
                   for line in proof.lines()), proof.lines()
        assert "links owed to users" in proof.lines()[-1], proof.lines()

        # links inside JSON (a custom field naming a user) are owed the same way
        in_json = db.sql("SELECT r.record_type, r.record_id, d->'path' AS path, d->>'parent_id' AS user"
                         " FROM migration_records r, jsonb_array_elements(r.dangling) d WHERE r.tenant_id = %(t)s"
                         " AND d @> '{\"owed\": true}' AND jsonb_array_length(d->'path') > 1", {"t": TENANT})
        assert in_json, "the account must have custom fields naming a user"

        second = migrate(db, sb, TENANT, kinds=["users"])
        assert second.status == "succeeded", failed_tasks(db, second.id)
        # the run says what it filled (it had filled them silently): status's and report's grouped
        # reasons and its last phase's metadata, one note per parent kind counted in links
        owed_before = sum(len(v) for v in owned.values())
        r = rollup.rollup(db, second.id)
        said = [g for g in r.reasons if g["action"] == "info" and "owed link" in g["example"]]
        assert len(said) == 1 and said[0]["kind"] == "users" and said[0]["count"] >= owed_before, r.reasons
        assert said[0]["example"].startswith(f"{said[0]['count']} owed links filled from the ledger (owner_id -> users: "), said
        last = metadata.phase_metadata(db, r, len(r.phases) - 1)
        assert "owed links filled" in last["reasons"].value, last["reasons"].value
        # the run's end notes are its last phase's whatever kind they name (a full run's catch-up
        # tells only the kinds it wrote rows of)
        elsewhere = dataclasses.replace(r, reasons=[{**said[0], "kind": "deals"}])
        assert metadata.phase_summary(db, elsewhere, len(r.phases) - 1)["reasons"], r.phases
        for kind, table in OWNED.items():
            got = _owners(db, table)  # (activities of leads, a kind not taken, are skipped: not here)
            assert got == {sid: truth[kind][sid] for sid in got}, kind  # row by row, against the sandbox
            assert any(got.values()) and (kind == "activities" or got.keys() == truth[kind].keys()), kind
        for r in in_json:
            column, *inner = r["path"]
            got = db.sql(f"SELECT {column} #>> %(p)s AS id FROM {r['record_type']} WHERE id = %(i)s",
                         {"p": inner, "i": r["record_id"]})[0]["id"]
            want = db.sql("SELECT id FROM crm.users WHERE tenant_id = %(t)s AND source_id = %(s)s",
                          {"t": TENANT, "s": r["user"]})[0]["id"]
            assert got == str(want), r
        left = db.sql("SELECT count(*) AS n FROM migration_records WHERE tenant_id = %(t)s"
                      " AND dangling @> '[{\"owed\": true}]'", {"t": TENANT})
        assert left[0]["n"] == 0
        story = row_story.explain(db, TENANT, "persons", sid)
        assert story is not None and not story["reason"], story
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["persons", "deals"])
        assert proof.passed and not any(k.owed_to or k.owed for k in proof.kinds), proof.lines()
        assert "links owed" not in proof.lines()[-1], proof.lines()
