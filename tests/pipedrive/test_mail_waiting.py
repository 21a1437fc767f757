"""Mail of deals left waiting for the catch-up's walk, over the sandbox on real Postgres.

A full run leaves a deal whose person the ledger does not know yet to its catch-up's walk
(`walk_proof`); the catch-up writes that deal and lists its mail. Pinned here: the emails phase
lists no mail of such a deal (it counts the deal `left_to_catchup:deals`; its messages, never
listed, are no rows of the phase: not seen, not waiting), every deal's mail is listed exactly once
in the whole run, and every message of the account lands on its deal with its subject and body as
the source serves them - also when the catch-up's task dies between writing such a deal and
committing its mail task (a page of the walk, or a deal it asked by id), and is retried. A run
stopped in the emails phase counts the same waiting rows per kind, per tenant and in
`migrate rows --action waiting` (each a ledger row), and says the mail of those deals was left to
the catch-up; once resumed and succeeded, nothing of it reads as waiting.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

import pytest
from click.testing import CliRunner

from engine_core import rollup, runs
from engine_core.errors import TransientError
from engine_core.providers.pipedrive import catchup, emails, writers
from engine_core.providers.pipedrive.inventory import row_id
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.registry import for_run
from engine_core.verify import verify
from engine_core.worker import drain_threads
from migration_pipeline.assets.metadata import phase_metadata
from migration_pipeline.cli.main import main
from migration_pipeline.instance import to_url
from tests.pipedrive.support import FAST, TOKEN, failed_tasks, ledger, migrate, sandbox, start

TENANT = "acme"
KINDS = ["users", "pipelines", "stages", "organizations", "persons", "deals", "deals_archived", "emails"]


def _mail_listings(listings: dict[str, int]) -> Counter:
    """deal id -> how many times its mail listing's first page was asked."""
    out: Counter = Counter()
    for key, n in listings.items():
        path, _, query = key.partition("?")
        parts = path.strip("/").split("/")
        if parts[-1] == "mailMessages" and parts[-3] == "deals" and parse_qs(query).get("start", ["0"]) == ["0"]:
            out[parts[-2]] += n
    return out


def test_mail_of_waiting_deals_is_listed_once_by_the_catch_up_and_all_mail_lands(db) -> None:
    with sandbox(seed=9) as sb:  # seed 9: deals on deleted people wait for the catch-up's walk
        truth = sb.truth()
        run = migrate(db, sb, TENANT, kinds=["users", "pipelines", "stages", "organizations", "persons", "deals",
                                              "deals_archived", "emails"])
        stats = sb.stats()
        served = _served(sb, truth)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    # every deal's mail listed exactly once in the whole run
    listed = _mail_listings(stats["listings"])
    assert set(listed) == set(truth["deals_with_mail"]), set(listed) ^ set(truth["deals_with_mail"])
    assert {d: n for d, n in listed.items() if n != 1} == {}
    assert set(stats["bodies_fetched"].values()) == {1}
    tasks = db.sql("SELECT kind, cursor_key, stats FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})
    deferred = sum(int(t["stats"].get("left_to_catchup:deals", 0)) for t in tasks if t["kind"] == "emails")
    assert deferred > 0, "the account has deals with mail that wait for the catch-up's walk"
    # their messages were never listed by the emails phase: no rows of it; the deals are what it counts
    report = rollup.rollup(db, run.id)
    mail_kind = next(k for k in report.kinds if k.kind == "emails")
    assert mail_kind.waiting == 0 and mail_kind.left == {"deals": deferred}, mail_kind
    assert report.incomplete == [], report.incomplete
    _every_message_on_its_deal(db, truth, served)
    assert not db.sql("SELECT 1 FROM migration_records WHERE tenant_id = %(t)s AND reason LIKE '%%waits for%%'", {"t": TENANT})


def _served(sb: Any, truth: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Every message of the account as the sandbox serves it (subject, body), by message id."""
    return {mid: sb.client.get(f"/v1/mailbox/mailMessages/{mid}", params={"include_body": 1},
                               headers={"x-api-token": TOKEN}).json()["data"]
            for ms in truth["deals_with_mail"].values() for mid in ms}


def _every_message_on_its_deal(db, truth: dict[str, Any], served: dict[int, dict[str, Any]]) -> None:
    """Every message of the account reconciled row by row: created, on its deal, with its subject
    and body as served; no other mail in the product."""
    deals = {**ledger(db, TENANT, "deals"), **ledger(db, TENANT, "deals_archived")}
    mail = ledger(db, TENANT, "emails")
    rows = {r["source_id"]: r for r in db.sql("SELECT source_id, deal_id, subject, body FROM crm.emails"
                                               " WHERE tenant_id = %(t)s", {"t": TENANT})}
    expected = {str(m): d for d, ms in truth["deals_with_mail"].items() for m in ms}
    assert set(expected) - set(rows) == set(), "messages lost"
    assert set(rows) == set(expected) and len(rows) == sum(len(ms) for ms in truth["deals_with_mail"].values())
    for sid, deal in expected.items():
        assert mail[sid]["action"] == "created", (sid, mail[sid])
        row, source = rows[sid], served[int(sid)]
        assert row["deal_id"] == deals[deal]["record_id"], sid
        assert row["subject"] == source["subject"] and row["body"] == source["body"], sid


@pytest.mark.parametrize("path", ["page", "by_id", "by_id_unwritten"])
def test_a_catch_up_task_dying_between_a_waiting_deals_write_and_its_mail_task_lists_that_mail_on_retry(
        db, monkeypatch, path: str) -> None:
    """The task fails (as a killed worker's task is retried) right after `write_changed` committed
    waiting deals with mail and before their mail tasks were committed: a page of the walk (its
    next-page move or finish), or the deals task asking by id a waiting deal the walk did not serve
    (hidden from the deals list here, as a deal moving between lists while the walk passed). The
    retry finds those deals written at their version; their mail must be listed all the same.
    `by_id_unwritten`: that task dies after comparing the deal (the run has seen it) and before
    writing it; the retry must still write the deal and list its mail."""
    real_write, real_step, real_page = catchup.write_changed, catchup.list_step, writers.write_page
    died: list[set[str]] = []
    hidden: set[str] = set()

    def list_step(meter, kind, at, since=None):  # by_id: the waiting deals with mail left unlisted
        step = real_step(meter, kind, at, since)
        if path.startswith("by_id") and kind == "deals":
            if not hidden:
                waiting = {sid for sid, r in ledger(db, TENANT, "deals").items() if "waits for" in (r["reason"] or "")}
                hidden.update(waiting & set(with_mail))
            step = replace(step, rows=tuple(r for r in step.rows if row_id(r) not in hidden))
        return step

    def write_changed(ctx, client, mapper_of, kind, lk, rows, **kw):  # the real write, then the death
        written = real_write(ctx, client, mapper_of, kind, lk, rows, **kw)
        mailed = {row_id(r) for r in written} & set(with_mail)
        if lk == "deals" and mailed and not died and ("deletes" in ctx.task.cursor) == (path == "by_id"):
            died.append(mailed)
            raise TransientError("the worker died after writing deals, before their mail tasks were committed")
        return written

    def write_page(ctx, rows, *args, **kw):  # by_id_unwritten: the rows compared, the death before their write
        mailed = {row_id(r) for r in rows} & set(with_mail)
        if path == "by_id_unwritten" and "deletes" in ctx.task.cursor and mailed and not died:
            died.append(mailed)
            raise TransientError("the worker died after comparing deals, before writing them")
        return real_page(ctx, rows, *args, **kw)

    monkeypatch.setattr(catchup, "list_step", list_step)
    monkeypatch.setattr(writers, "write_page", write_page)
    monkeypatch.setattr(catchup, "write_changed", write_changed)
    with sandbox(seed=9) as sb:
        truth = sb.truth()
        with_mail = truth["deals_with_mail"]
        run = migrate(db, sb, TENANT, kinds=["users", "pipelines", "stages", "organizations", "persons", "deals",
                                              "deals_archived", "emails"])
        served = _served(sb, truth)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert died, "the catch-up wrote waiting deals with mail there"
    assert path == "page" or hidden & died[0], (hidden, died)
    assert rollup.rollup(db, run.id).incomplete == [], "nothing left waiting"
    _every_message_on_its_deal(db, truth, served)


def _cli(*args: str) -> Any:
    out = CliRunner().invoke(main, list(args))
    assert out.exit_code == 0, out.output
    return out


def _counts(tenant: str) -> tuple[int, int, list[dict[str, Any]], dict[str, Any]]:
    """(the per-kind waiting of `migrate status TENANT` summed, the tenant's waiting in `migrate status`,
    the rows `migrate rows TENANT --action waiting` lists, the status as JSON)."""
    status = json.loads(_cli("status", tenant, "--json").stdout)
    (tenant_row,) = [o for o in json.loads(_cli("status", "--json").stdout) if o["tenant"] == tenant]
    listed = [json.loads(line) for line in _cli("rows", tenant, "--action", "waiting", "--json").stdout.splitlines()
              if line.startswith("{")]
    return sum(k["waiting"] for k in status["kinds"]), tenant_row["waiting"], listed, status


def test_a_run_stopped_in_the_mail_phase_counts_each_waiting_row_once_and_says_whose_mail_it_left(
        db, db_url, monkeypatch) -> None:
    """Stopped in the emails phase once the walk has left waiting deals' mail to the catch-up: the
    waiting rows per kind, per tenant and as listed agree (a message never listed is none of
    them: it has no ledger row); status, report and verify say the mail of those deals was left to
    the catch-up and which rows wait. Resumed to success: nothing reads as waiting."""
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))
    real_window = emails.EmailTask.write_window
    stopped: list[int] = []

    def write_window_then_stop(self: emails.EmailTask) -> None:  # a stop once waiting deals' mail was left
        real_window(self)
        left = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'emails'"
                      " AND (stats->>'left_to_catchup:deals')::int > 0", {"r": self.ctx.run.id})[0]["n"]
        if left and not stopped:
            stopped.append(self.ctx.run.id)
            runs.stop(db, self.ctx.run.id)

    monkeypatch.setattr(emails.EmailTask, "write_window", write_window_then_stop)
    with sandbox(seed=9) as sb:
        run = start(db, sb, TENANT, kinds=KINDS)
        drain_threads(db, run.id, width=1, settings=FAST, providers=for_run)
        assert stopped and runs.get_run(db, run.id).status == "stopped", failed_tasks(db, run.id)
        per_kind, tenant_waiting, listed, status = _counts(TENANT)
        assert per_kind == tenant_waiting == len(listed) > 0, (per_kind, tenant_waiting, len(listed))
        mail = next(k for k in status["kinds"] if k["kind"] == "emails")
        assert mail["waiting"] == 0 and mail["left"]["deals"] > 0, mail
        assert not [r for r in listed if r["kind"] == "emails"]
        assert status["incomplete"] == [], status["incomplete"]
        (line,) = status["left_to_catchup"]
        deals = f"{mail['left']['deals']} deal{'' if mail['left']['deals'] == 1 else 's'}"
        assert line.startswith(f"emails of {deals} left to the catch-up") and "it lists them" in line, line
        assert "emails of" in " ".join(_cli("status", TENANT).stdout.split())
        note = phase_metadata(db, rollup.rollup(db, run.id), mail["phase"] - 1)["waiting_note"].value
        assert f"emails of {deals} left to the catch-up" in note, note
        report = " ".join(_cli("report", TENANT, "--kind", "emails").stdout.split())
        assert "0 left to catch-up" in report and f"emails of {deals} left" in report, report
        # verify: the rows that wait are said to wait, not to be skipped or failed
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST)
        waits = {k.kind: k.waiting for k in proof.kinds if k.waiting}
        assert sum(waits.values()) == len(listed), (waits, len(listed))
        said = {x.partition(":")[0]: x for x in proof.lines()}
        for k in proof.kinds:
            if k.waiting:
                assert f"{k.waiting} waiting for the catch-up's walk" in said[k.kind], said[k.kind]
                assert k.unwritten > k.waiting or "skipped/failed" not in said[k.kind], said[k.kind]
        runs.resume(db, run.id, PipedriveProvider(base_url=sb.base_url), settings=FAST)
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    assert runs.get_run(db, run.id).status == "succeeded", failed_tasks(db, run.id)
    per_kind_after, tenant_after, listed_after, status = _counts(TENANT)
    assert tenant_after == len(listed_after) == 0 and status["incomplete"] == [], status["incomplete"]
    mail = next(k for k in status["kinds"] if k["kind"] == "emails")
    assert mail["waiting"] == 0 and mail["caught_up"].get("imported", 0) > 0, mail
    (line,) = status["left_to_catchup"]
    assert "it wrote them and listed their emails" in line and "lists them once" not in line, line
    report = _cli("report", TENANT, "--kind", "emails")
    assert "waiting" not in report.stdout, report.stdout
    assert json.loads(_cli("report", TENANT, "--kind", "emails", "--json").stdout)["counts"]["waiting"] == 0
