"""Mail of deals left waiting for the catch-up's walk, over the sandbox on real Postgres.

A full run leaves a deal whose person the ledger does not know yet to its catch-up's walk
(`walk_proof`); the catch-up writes that deal and lists its mail. Pinned here: the emails phase
lists no mail of such a deal (it counts its messages `waiting`), every deal's mail is listed
exactly once in the whole run, and every message of the account lands on its deal with its subject
and body as the source serves them.
"""
from __future__ import annotations

from collections import Counter
from urllib.parse import parse_qs

from engine_core import rollup
from tests.pipedrive.support import TOKEN, failed_tasks, ledger, migrate, sandbox

TENANT = "acme"


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
        served = {mid: sb.client.get(f"/v1/mailbox/mailMessages/{mid}", params={"include_body": 1},
                                 headers={"x-api-token": TOKEN}).json()["data"]
                  for ms in truth["deals_with_mail"].values() for mid in ms}
    assert run.status == "succeeded", failed_tasks(db, run.id)
    # every deal's mail listed exactly once in the whole run
    listed = _mail_listings(stats["listings"])
    assert set(listed) == set(truth["deals_with_mail"]), set(listed) ^ set(truth["deals_with_mail"])
    assert {d: n for d, n in listed.items() if n != 1} == {}
    assert set(stats["bodies_fetched"].values()) == {1}
    tasks = db.sql("SELECT kind, cursor_key, stats FROM migration_tasks WHERE migration_id = %(r)s", {"r": run.id})
    deferred = sum(int(t["stats"].get("deals_left_to_catchup", 0)) for t in tasks if t["kind"] == "emails")
    assert deferred > 0, "the account has deals with mail that wait for the catch-up's walk"
    # the emails phase counts their messages waiting, as any row left to the catch-up
    report = rollup.rollup(db, run.id)
    mail_kind = next(k for k in report.kinds if k.kind == "emails")
    assert mail_kind.waiting > 0 and report.incomplete == [], report.incomplete
    # every message reconciled row by row: on its deal, with its subject and body
    deals = {**ledger(db, TENANT, "deals"), **ledger(db, TENANT, "deals_archived")}
    mail = ledger(db, TENANT, "emails")
    rows = {r["source_id"]: r for r in db.sql("SELECT source_id, deal_id, subject, body FROM crm.emails"
                                               " WHERE tenant_id = %(t)s", {"t": TENANT})}
    expected = {str(m): d for d, ms in truth["deals_with_mail"].items() for m in ms}
    assert set(rows) == set(expected) and len(rows) == sum(len(ms) for ms in truth["deals_with_mail"].values())
    for sid, deal in expected.items():
        assert mail[sid]["action"] == "created", (sid, mail[sid])
        row, source = rows[sid], served[int(sid)]
        assert row["deal_id"] == deals[deal]["record_id"], sid
        assert row["subject"] == source["subject"] and row["body"] == source["body"], sid
    assert not db.sql("SELECT 1 FROM migration_records WHERE tenant_id = %(t)s AND reason LIKE '%%waits for%%'", {"t": TENANT})
