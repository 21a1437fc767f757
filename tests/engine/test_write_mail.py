"""The email phase's optimistic windows: a window of messages is claimed and inserted in
set-based statements (`write.write_mapped_page` -> `write.window_batch`), and gives the ledger, the
product rows and the counts the per-row path gives - with a message the database refuses, one the
mapping refused, a placeholder taken over and a written message seen again at a newer version in
the same window. Real Postgres; the phase's own window writer (`EmailTask.write_window`), its
rows in hand (no source: nothing here is fetched)."""
from __future__ import annotations

from typing import Any

import pytest

from engine_core import db as dbmod
from engine_core import ledger, write
from engine_core.models import Run, Task
from engine_core.providers.pipedrive.emails import EmailTask, MailRow
from engine_core.providers.pipedrive.mail import map_email, with_body
from engine_core.providers.pipedrive.mapping import MalformedRow
from engine_core.runlog import RunLog
from engine_core.context import TaskContext
from engine_core.write import Prepared
from tests.engine.support import FAST

WORKER = "test-write-mail"
DEAL = "77"


def _task(db: dbmod.Database, tenant: str) -> EmailTask:
    run = Run.from_row(db.sql(
        "INSERT INTO migrations (tenant_id, source, source_account, plan) VALUES (%(t)s, 'pipedrive', 'acct',"
        " '[[\"emails\"]]'::jsonb) RETURNING *", {"t": tenant})[0])
    row = db.sql(
        "INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
        " VALUES (%(r)s, 0, 'emails', 'emails:a', %(c)s, 'running', %(w)s, now()) RETURNING *",
        {"r": run.id, "c": {"deals": [int(DEAL)]}, "w": WORKER})[0]
    ctx = TaskContext(db=db, run=run, task=Task.from_row(row), worker=WORKER, settings=FAST, log=RunLog(run.id, row["id"]))
    deal = db.sql("INSERT INTO crm.deals (tenant_id, title, source, source_id) VALUES (%(t)s, 'Deal', 'pipedrive', %(d)s)"
                  " RETURNING id", {"t": tenant, "d": DEAL})[0]["id"]
    task = EmailTask(ctx, None, None, None)  # type: ignore[arg-type] - nothing is fetched here
    task.refs.found[("deals", DEAL)] = deal
    return task


def _message(i: int, version: str = "2024-01-01 10:00:00") -> dict[str, Any]:
    return {"id": i, "subject": f"Message {i}", "snippet": "hello", "from": [{"email_address": "a@x.test", "name": "A"}],
            "to": [{"email_address": f"b{i}@x.test", "name": None}], "cc": [], "bcc": [],
            "message_time": "2024-01-01 09:00:00", "sent_flag": 1, "mail_thread_id": 5, "has_attachments_flag": 0,
            "add_time": "2024-01-01 09:00:00", "update_time": version}


def _window(task: EmailTask, tenant: str, messages: list[dict[str, Any]], *, bad: set[int] = frozenset(),
            refused: set[int] = frozenset()) -> None:
    for m in messages:
        if m["id"] in bad:
            row = MailRow(0, Prepared(id=str(m["id"]), mapped=None, error=MalformedRow("from has the wrong shape: 'x'")))
        else:
            mapped = with_body(map_email(m, tenant, DEAL), {"body": f"<p>{m['id']}</p>"})
            if m["id"] in refused:
                mapped.values["subject"] = None  # only the database knows: crm.emails.subject is NOT NULL
            row = MailRow(0, Prepared(id=mapped.source_id, mapped=mapped, error=None))
        row.fetched = True
        task.outstanding[0] += 1
        task.ready_bodies.append(row)
    task.write_window()


def _scenario(db: dbmod.Database, tenant: str) -> tuple[Any, ...]:
    task = _task(db, tenant)
    # a first window: message 1 written at its first version, 2 failed (a placeholder)
    _window(task, tenant, [_message(1)], bad=set())
    _window(task, tenant, [_message(2)], bad={2})
    first = dict(task.ctx.stats.values)
    # a mixed window: 1 at a newer version (its sighting updates it, per row), 2 taken over, 3..24
    # new, 7 malformed
    task.refs.held["1"] = ledger.Held("created", "2024-01-01 10:00:00", None)
    _window(task, tenant, [_message(1, "2024-02-01 10:00:00")] + [_message(i) for i in range(2, 25)], bad={7})
    # a window whose set-based statement the database refuses (30): per row, 30 fails alone
    _window(task, tenant, [_message(i) for i in range(25, 50)], refused={30})
    entries = db.sql("SELECT source_id, action, left(reason, 40) AS reason, source_version, record_type,"
                     "       (SELECT to_jsonb(e) - 'id' - 'tenant_id' - 'created_at' - 'deal_id' FROM crm.emails e"
                     "         WHERE e.id = r.record_id) AS email"
                     "  FROM migration_records r WHERE tenant_id = %(t)s ORDER BY source_id", {"t": tenant})
    history = db.sql("SELECT h.action, h.version_before, h.version_after FROM migration_record_history h"
                     " JOIN migration_records r ON r.id = h.record_id WHERE r.tenant_id = %(t)s", {"t": tenant})
    emails_n = db.sql("SELECT count(*) AS n FROM crm.emails WHERE tenant_id = %(t)s", {"t": tenant})[0]["n"]
    return first, dict(task.ctx.stats.values), (task.tally.attempted, task.tally.failed), entries, history, emails_n


@pytest.fixture
def claims(monkeypatch) -> list[tuple[str, int, Any]]:
    """The window claims made, as (kind, rows claimed, the table their new rows went to)."""
    seen: list[tuple[str, int, Any]] = []
    real = ledger.claim_window

    def counting(tx, run, kind, claims, new_rows=None):
        won = real(tx, run, kind, claims, new_rows)
        seen.append((kind, len(won), new_rows.table if new_rows else None))
        return won

    monkeypatch.setattr(ledger, "claim_window", counting)
    return seen


def test_a_mail_window_goes_set_based_and_writes_what_the_per_row_path_writes(db, monkeypatch, claims) -> None:
    real_batch = write.window_batch
    monkeypatch.setattr(write, "window_batch", lambda *a, **k: None)  # every message per row: the oracle
    per_row = _scenario(db, "per-row")
    assert claims == []
    monkeypatch.setattr(write, "window_batch", real_batch)
    optimistic = _scenario(db, "optimistic")
    # the mixed window's set-based part: 2 (taken over) and 3..24 but 7; the refused window's
    # statement was rolled back (nothing claimed)
    assert claims == [("emails", 1, ("crm", "emails")), ("emails", 22, ("crm", "emails"))], "mail windows went set-based"
    stats = per_row[1]
    assert (stats.get("updated"), stats.get("failed"), stats.get("imported")) == (1, 3, 47)  # failed: 2, 7, 30
    assert len(per_row[3]) == 49 and per_row[5] == 47  # 7 and 30 have none
    for name, a, b in zip(("first stats", "stats", "tally", "ledger", "history", "emails"), per_row, optimistic):
        assert a == b, f"{name} differ"


def test_a_clean_mail_window_is_one_claim_that_inserts_its_messages(db, claims) -> None:
    task = _task(db, "clean")
    _window(task, "clean", [_message(i) for i in range(1, 26)])
    assert claims == [("emails", 25, ("crm", "emails"))]
    assert task.ctx.stats.get("imported") == 25
    linked = db.sql("SELECT count(*) AS n FROM migration_records r JOIN crm.emails e ON e.id = r.record_id"
                    " WHERE r.tenant_id = 'clean' AND r.action = 'created' AND e.source_id = r.source_id")[0]["n"]
    assert linked == 25
