"""Email counts commit with the rows they describe (issue 10, item 4; issue 8's "every row once"):
the email phase stopped after windows and resumed, again and again, ends with the same per-kind
stats (seen, imported, already_here, skipped, failed, messages_listed, bodies, deals) and the same
ledger as the same account migrated without a stop, every mail written once and every body
fetched once. A resumed task re-lists its first unfinished deal and every deal after it: messages
its run already recorded (written, skipped behind a missing deal, already here from an earlier
run) must not be counted twice."""
from __future__ import annotations

from collections import Counter
from typing import Any

from engine_core import runs
from engine_core.db import Database
from engine_core.providers.pipedrive import emails
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.worker import drain_threads
from engine_core.providers.registry import for_run
from tests.pipedrive.support import FAST, failed_tasks, ledger, sandbox, start

MAX_STOPS = 8
COUNTED = ("seen", "imported", "matched", "already_here", "skipped", "failed", "messages_listed", "bodies", "deals",
           "deals_listed", "deals_with_mail")


def seed_earlier_run(db: Database, tenant: str, truth: dict[str, Any]) -> tuple[set[str], set[str]]:
    """An earlier run imported every other deal with mail but the big one (the rest are not here:
    their mail is skipped, not linked) and every third message (already here for this run).
    Returns both sets."""
    prior = db.sql(
        "INSERT INTO migrations (tenant_id, source, source_account, status, plan, finished_at)"
        " VALUES (%(t)s, 'pipedrive', 'earlier', 'succeeded', '[]'::jsonb, now()) RETURNING id",
        {"t": tenant},
    )[0]["id"]
    with_mail = sorted(truth["deals_with_mail"], key=lambda d: (len(truth["deals_with_mail"][d]) > 25, int(d)))
    here = set(with_mail[:-1][::2])  # the big deal is not here: its skipped mail spans windows
    archived = {str(i) for i in truth["ids"]["deals_archived"]}
    for sid in sorted(here, key=int):
        kind = "deals_archived" if sid in archived else "deals"
        deal = db.sql("INSERT INTO crm.deals (tenant_id, title, archived, source, source_id)"
                      " VALUES (%(t)s, %(title)s, %(a)s, 'pipedrive', %(s)s) RETURNING id",
                      {"t": tenant, "title": f"Deal {sid}", "a": kind == "deals_archived", "s": sid})[0]["id"]
        db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action)"
               " VALUES (%(r)s, %(t)s, 'pipedrive', %(k)s, %(s)s, 'crm.deals', %(d)s, 'created')",
               {"r": prior, "t": tenant, "k": kind, "s": sid, "d": deal})
    messages = sorted((str(m) for ms in truth["deals_with_mail"].values() for m in ms), key=int)
    earlier = set(messages[::3])
    db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, action)"
           " SELECT %(r)s, %(t)s, 'pipedrive', 'emails', sid, 'crm.emails', 'created' FROM unnest(%(ids)s::text[]) AS sid",
           {"r": prior, "t": tenant, "ids": sorted(earlier)})
    return here, earlier


def email_stats(db: Database, run_id: int) -> dict[str, int]:
    total: Counter[str] = Counter()
    for row in db.sql("SELECT stats FROM migration_tasks WHERE migration_id = %(r)s AND kind = 'emails'", {"r": run_id}):
        total.update({k: int(v) for k, v in row["stats"].items() if k in COUNTED})
    return {k: total.get(k, 0) for k in COUNTED}


def outcomes(db: Database, tenant: str) -> dict[str, tuple[str, str | None, int]]:
    return {sid: (r["action"], r["reason"], r["migration_id"]) for sid, r in ledger(db, tenant, "emails").items()}


def test_stops_after_windows_and_resumes_count_exactly_what_an_uninterrupted_run_counts(db, monkeypatch) -> None:
    with sandbox(big_deal_messages=60) as sb:
        truth = sb.truth()
        seeded = {t: seed_earlier_run(db, t, truth) for t in ("straight", "stopped")}
        assert seeded["straight"] == seeded["stopped"]
        here, earlier = seeded["straight"]

        straight = start(db, sb, "straight", kinds=["emails"])
        drain_threads(db, straight.id, width=1, settings=FAST, providers=for_run)
        assert runs.get_run(db, straight.id).status == "succeeded", failed_tasks(db, straight.id)
        fetched_straight = Counter(sb.stats()["bodies_fetched"])
        sb.reset_stats()

        stopped = start(db, sb, "stopped", kinds=["emails"])
        original = emails.EmailTask.write_window
        stops = {"n": 0}

        def write_window_then_stop(self: emails.EmailTask) -> None:
            original(self)
            # a stop right after a window commits: the task writes what it has in hand and stops
            # at its next round; earlier deals may be unfinished while later ones are done
            if self.ctx.run.id == stopped.id and not self.ctx._stop_seen and stops["n"] < MAX_STOPS:
                stops["n"] += 1
                runs.stop(db, stopped.id)
                self.ctx._stop_seen = True

        monkeypatch.setattr(emails.EmailTask, "write_window", write_window_then_stop)
        for _ in range(MAX_STOPS + 1):
            drain_threads(db, stopped.id, width=1, settings=FAST, providers=for_run)
            status = runs.get_run(db, stopped.id).status
            if status == "succeeded":
                break
            assert status == "stopped", status
            runs.resume(db, stopped.id, PipedriveProvider(base_url=sb.base_url), settings=FAST)
        assert runs.get_run(db, stopped.id).status == "succeeded", failed_tasks(db, stopped.id)
        fetched_stopped = Counter(sb.stats()["bodies_fetched"])
    assert stops["n"] >= 3, "the run was stopped mid email phase, several times"

    every = {str(m) for ms in truth["deals_with_mail"].values() for m in ms}
    straight_ledger, stopped_ledger = outcomes(db, "straight"), outcomes(db, "stopped")
    assert set(straight_ledger) == every
    assert {s: v[:2] for s, v in stopped_ledger.items()} == {s: v[:2] for s, v in straight_ledger.items()}

    expected = email_stats(db, straight.id)
    assert expected["skipped"] > 0 and expected["already_here"] == len(earlier) and expected["imported"] > 0
    assert expected["seen"] == len(every)
    assert email_stats(db, stopped.id) == expected, "stopped and resumed: each message counted once"

    for tenant in ("straight", "stopped"):
        rows = db.sql("SELECT count(*) AS n, count(DISTINCT source_id) AS d FROM crm.emails WHERE tenant_id = %(t)s", {"t": tenant})[0]
        assert rows["n"] == rows["d"] == expected["imported"], "every mail written once"
    assert fetched_stopped == fetched_straight and set(fetched_straight.values()) == {1}, "no body fetched twice"
    skipped = {sid for sid, (action, _, _) in straight_ledger.items() if action == "skipped"}
    assert skipped and not skipped & set(fetched_straight), "no body for a message whose deal is not here"
    assert not earlier & set(fetched_straight), "no body for a message already here"
