"""One identity per source record, whichever list served it (issue 8, item 6), on real Postgres.

A deal listed by `/api/v2/deals`, archived, then listed again by `/api/v2/deals/archived` is one
ledger entry (kind `deals`) and one crm.deals row, archived, with its emails on it; the same for
leads and `/v1/leads/archived`. The later sighting, a newer version at the source, updates that
row in place (issue 9: archived flag, title and all); a stale active sighting of a deal archived
since does not un-archive it, a newer one (a restore) does. Ledger entries older code wrote under
`deals_archived` are folded by migration 0008: twins merge into one row, children moved onto it.

The sighting through the other list is driven through the provider's own page writer with a task
of the other kind (the sandbox's `archive_flip` shape drives the same path inside a whole run when
it is available: `test_a_deal_archived_between_the_listings_is_one_row_in_a_whole_run`).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any

import pytest

from engine_core.context import TaskContext
from engine_core.models import Run, Task
from engine_core.providers.pipedrive import fields, kinds, writers
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.runlog import RunLog
from pipedrive_sandbox.config import SandboxConfig
from tests.pipedrive.support import FAST, TOKEN, failed_tasks, migrate, sandbox

TENANT = "acme"
WORKER = "sighting-test"


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sight(db, run: Run, task_kind: str, rows: list[dict[str, Any]], client: PipedriveClient) -> TaskContext:
    """List `rows` as a page of a `task_kind` task of `run`, through the provider's page writer."""
    phase = next(i for i, group in enumerate(run.plan) if task_kind in group)
    row = db.sql(
        "INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
        " VALUES (%(r)s, %(p)s, %(k)s, %(key)s, '{}'::jsonb, 'running', %(w)s, now()) RETURNING *",
        {"r": run.id, "p": phase, "k": task_kind, "key": f"{task_kind}:sighting:{rows[0]['id']}:{rows[0]['update_time']}", "w": WORKER},
    )[0]
    task = Task.from_row(row)
    ctx = TaskContext(db=db, run=run, task=task, worker=WORKER, settings=FAST, log=RunLog(run.id, task.id))
    mapper = kinds.MAPPERS[task_kind]
    writers.write_listed_page(ctx, rows, lambda r: mapper(r, TENANT, fields.FieldBook()), client)
    return ctx


def _deal_rows(db, sid: str) -> list[dict[str, Any]]:
    return db.sql("SELECT * FROM crm.deals WHERE tenant_id = %(t)s AND source_id = %(s)s", {"t": TENANT, "s": sid})


def _entries(db, sid: str) -> list[dict[str, Any]]:
    return db.sql("SELECT kind, action, record_id FROM migration_records WHERE tenant_id = %(t)s AND source_id = %(s)s"
                  " AND kind IN ('deals', 'deals_archived', 'leads', 'leads_archived')", {"t": TENANT, "s": sid})


def test_a_deal_seen_in_both_lists_is_one_row_archived_with_its_emails(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        client = PipedriveClient(sb.base_url, TOKEN)
        active = {str(i) for i in truth["ids"]["deals"]}
        sid = next(d for d in truth["deals_with_mail"] if d in active)
        source = client.get(f"/api/v2/deals/{sid}")["data"]
        before = _deal_rows(db, sid)
        assert len(before) == 1 and before[0]["archived"] is False
        # archived since the active list served it: the archived list shows it, updated later
        moved = datetime.now(timezone.utc).replace(microsecond=0)
        archived = {**source, "is_archived": True, "archive_time": _rfc3339(moved), "update_time": _rfc3339(moved),
                    "title": "a title changed with the archiving"}
        ctx = _sight(db, run, "deals_archived", [archived], client)
        lead_sid = next(str(i) for i in truth["ids"]["leads"])
        lead = client.get(f"/v1/leads/{lead_sid}")["data"]
        lead_ctx = _sight(db, run, "leads_archived", [{**lead, "is_archived": True, "update_time": _rfc3339(moved)}], client)
    rows = _deal_rows(db, sid)
    assert len(rows) == 1, "one product row per source deal"
    assert rows[0]["id"] == before[0]["id"] and rows[0]["archived"] is True and rows[0]["archived_at"] == moved
    # a newer version at the source (issue 9): the same row updated in place, title and all
    assert rows[0]["title"] == "a title changed with the archiving"
    assert _entries(db, sid) == [{"kind": "deals", "action": "created", "record_id": rows[0]["id"]}]
    assert (ctx.stats.get("updated"), ctx.stats.get("archived_updated"), ctx.stats.get("imported")) == (1, 1, 0)
    mails = db.sql("SELECT DISTINCT deal_id FROM crm.emails WHERE tenant_id = %(t)s AND source_id = ANY(%(m)s)",
                   {"t": TENANT, "m": [str(m) for m in truth["deals_with_mail"][sid]]})
    assert [m["deal_id"] for m in mails] == [rows[0]["id"]], "its emails are on the one row"
    leads = db.sql("SELECT archived FROM crm.leads WHERE tenant_id = %(t)s AND source_id = %(s)s", {"t": TENANT, "s": lead_sid})
    assert leads == [{"archived": True}] and lead_ctx.stats.get("archived_updated") == 1
    assert [e["kind"] for e in _entries(db, lead_sid)] == ["leads"]
    # nothing of the account lives under the archived lists' own kinds
    assert db.sql("SELECT count(*) AS n FROM migration_records WHERE kind IN ('deals_archived', 'leads_archived')")[0]["n"] == 0


def test_a_stale_active_sighting_does_not_unarchive_and_a_newer_one_restores(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        client = PipedriveClient(sb.base_url, TOKEN)
        sid = str(truth["ids"]["deals_archived"][0])
        source = client.get(f"/api/v2/deals/{sid}")["data"]
        assert _deal_rows(db, sid)[0]["archived"] is True
        updated = datetime.fromisoformat(source["update_time"].replace("Z", "+00:00"))
        stale = {**source, "is_archived": False, "archive_time": None, "update_time": _rfc3339(updated - timedelta(days=3))}
        ctx = _sight(db, run, "deals", [stale], client)
        assert [r["archived"] for r in _deal_rows(db, sid)] == [True]
        assert (ctx.stats.get("already_here"), ctx.stats.get("archived_updated")) == (1, 0)
        restored = {**source, "is_archived": False, "archive_time": None, "update_time": _rfc3339(updated + timedelta(days=1))}
        _sight(db, run, "deals", [restored], client)
    rows = _deal_rows(db, sid)
    assert [(r["archived"], r["archived_at"]) for r in rows] == [(False, None)]


def test_legacy_twins_under_deals_archived_are_folded_into_one_row(db) -> None:
    # what older code left: a deal written from both lists (two rows, mail on the stale copy), a
    # deal only in the archived list, and a placeholder twin beside a written entry
    prior = db.sql("INSERT INTO migrations (tenant_id, source, source_account, status, plan, finished_at)"
                   " VALUES (%(t)s, 'pipedrive', 'earlier', 'succeeded', '[]'::jsonb, now()) RETURNING id", {"t": TENANT})[0]["id"]
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def deal(sid: str, kind: str, archived: bool, updated: datetime) -> int:
        rid = db.sql("INSERT INTO crm.deals (tenant_id, title, archived, source, source_id, source_updated_at)"
                     " VALUES (%(t)s, %(title)s, %(a)s, 'pipedrive', %(s)s, %(u)s) RETURNING id",
                     {"t": TENANT, "title": f"Deal {sid}", "a": archived, "s": sid, "u": updated})[0]["id"]
        db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action)"
               " VALUES (%(r)s, %(t)s, 'pipedrive', %(k)s, %(s)s, 'crm.deals', %(id)s, 'created')",
               {"r": prior, "t": TENANT, "k": kind, "s": sid, "id": rid})
        return rid

    keep, copy = deal("10", "deals", False, t0), deal("10", "deals_archived", True, t0 + timedelta(hours=1))
    db.sql("INSERT INTO crm.emails (tenant_id, deal_id, subject, source, source_id) VALUES (%(t)s, %(d)s, 's', 'pipedrive', '900')",
           {"t": TENANT, "d": copy})
    only = deal("11", "deals_archived", True, t0)
    written = deal("12", "deals_archived", True, t0)
    db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, action, reason)"
           " VALUES (%(r)s, %(t)s, 'pipedrive', 'deals', '12', 'skipped', 'not linked to any record')", {"r": prior, "t": TENANT})
    fold = resources.files("engine_core").joinpath("sql/migrations/0008_dangling_and_one_identity.sql").read_text()
    with db.transaction() as tx:
        tx.raw.execute(fold[fold.index("CREATE TEMP TABLE fold_twins"):])
    entries = db.sql("SELECT kind, source_id, action, record_id FROM migration_records WHERE tenant_id = %(t)s ORDER BY source_id",
                     {"t": TENANT})
    assert entries == [{"kind": "deals", "source_id": "10", "action": "created", "record_id": keep},
                       {"kind": "deals", "source_id": "11", "action": "created", "record_id": only},
                       {"kind": "deals", "source_id": "12", "action": "created", "record_id": written}]
    rows = db.sql("SELECT id, archived FROM crm.deals WHERE tenant_id = %(t)s AND source_id = '10'", {"t": TENANT})
    assert rows == [{"id": keep, "archived": True}], "the newer copy's archived flag, on the kept row"
    assert db.sql("SELECT deal_id FROM crm.emails WHERE source_id = '900'") == [{"deal_id": keep}]


@pytest.mark.skipif("archive_flip" not in getattr(SandboxConfig, "__dataclass_fields__", {}),
                    reason="the sandbox's archive_flip shape has not landed")
def test_a_deal_archived_between_the_listings_is_one_row_in_a_whole_run(db) -> None:
    with sandbox(archive_flip=2) as sb:
        run = migrate(db, sb, TENANT)
        truth = sb.truth()
    assert run.status == "succeeded", failed_tasks(db, run.id)
    flipped = truth["archive_flipped"]
    assert flipped["deals"] and flipped["leads"]
    for kind, table in (("deals", "deals"), ("leads", "leads")):
        for sid in (str(i).lower() for i in flipped[kind]):
            rows = db.sql(f"SELECT id, archived FROM crm.{table} WHERE tenant_id = %(t)s AND source_id = %(s)s",
                          {"t": TENANT, "s": sid})
            assert len(rows) == 1 and rows[0]["archived"] is True, (kind, sid, rows)
            assert [e["kind"] for e in _entries(db, sid)] == [kind]
            if kind == "deals" and sid in truth["deals_with_mail"]:
                on = db.sql("SELECT DISTINCT deal_id FROM crm.emails WHERE tenant_id = %(t)s AND source_id = ANY(%(m)s)",
                            {"t": TENANT, "m": [str(m) for m in truth["deals_with_mail"][sid]]})
                assert [m["deal_id"] for m in on] == [rows[0]["id"]]
    for table in ("deals", "leads"):
        twice = db.sql(f"SELECT source_id FROM crm.{table} WHERE tenant_id = %(t)s GROUP BY source_id HAVING count(*) > 1",
                       {"t": TENANT})
        assert twice == []
