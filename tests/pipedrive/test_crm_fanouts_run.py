"""The per-record kinds through the engine: a whole (tiny) account migrated with participants,
followers and deal history taken (`--kinds +...`), reconciled with the sandbox's truth row by row
(`/_sandbox/truth?kind=participants|followers|deal_history`), the forbidden records
(`forbidden_fanout`) kept with their reason and told unreachable by verify; a run without them
leaves them out and says so; a sync brings a changed deal's new history."""
from __future__ import annotations

import multiprocessing as mp
import threading
import time
from typing import Any

from engine_core import reaper, rollup, row_story, runs
from engine_core.plan import kinds_left_out
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from engine_core.providers.registry import for_run
from engine_core.worker import drain_threads
from tests.pipedrive.support import (FAST, failed_tasks, kill, kind_counts, ledger, live_op, migrate, sandbox, start,
                                     sync)

TENANT = "acme"
OPT_IN = ["+participants", "+followers", "+deal_history"]
FAMILIES = ("participants", "followers", "deal_history")
WORD = {"deals": "deal", "persons": "person", "organizations": "organization"}


def forbidden_of(truth: dict[str, Any]) -> dict[str, set[str]]:
    return {k: {str(i) for i in v} for k, v in truth["forbidden_fanout"].items()}


def reconcile(db, sb, forbidden: dict[str, set[str]]) -> None:
    """Every live row of the three tables against the sandbox's truth now, row by row."""
    participants = sb.truth("participants")["participants"]
    want = {(d, str(p["id"]), str(p["person_id"])) for d, rows in participants.items() if d not in forbidden["deals"]
            for p in rows}
    got = db.sql("SELECT d.source_id AS deal, p.source_id, p.contact_ref FROM crm.deal_participants p"
                 " JOIN crm.deals d ON d.id = p.deal_id WHERE p.tenant_id = %(t)s AND p.deleted_at_source IS NULL",
                 {"t": TENANT})
    got_p = {(g["deal"], g["source_id"], g["contact_ref"]) for g in got}
    assert want and got_p == want and len(got) == len(want), (sorted(got_p - want), sorted(want - got_p))
    followers = sb.truth("followers")["followers"]
    want_f = {f"{kind}:{sid}:{u}" for kind, by in followers.items() for sid, users in by.items()
              if sid not in forbidden.get(kind, set()) for u in users}
    got_f = [r["source_id"] for r in db.sql("SELECT source_id FROM crm.followers WHERE tenant_id = %(t)s"
                                             " AND deleted_at_source IS NULL", {"t": TENANT})]
    assert want_f and sorted(got_f) == sorted(want_f), sorted(set(got_f) ^ want_f)[:10]
    history = sb.truth("deal_history")["deal_history"]
    want_h = sorted((d, h["field_key"], h["old_value"], h["new_value"]) for d, rows in history.items()
                    if d not in forbidden["deals"] for h in rows)
    got_h = db.sql("SELECT d.source_id AS deal, h.field_key, h.old_value, h.new_value FROM crm.deal_history h"
                   " JOIN crm.deals d ON d.id = h.deal_id WHERE h.tenant_id = %(t)s AND h.deleted_at_source IS NULL",
                   {"t": TENANT})
    assert want_h and sorted((g["deal"], g["field_key"], g["old_value"], g["new_value"]) for g in got_h) == want_h


def test_a_whole_account_with_the_opt_in_kinds_matches_the_truth_row_by_row(db) -> None:
    with sandbox(forbidden_fanout=2) as sb:
        truth = sb.truth()
        forbidden = forbidden_of(truth)
        run = migrate(db, sb, TENANT, kinds=OPT_IN)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert {"participants", "followers", "deal_history"} <= set(run.kinds)
        assert not set(FAMILIES) & set(kinds_left_out(PipedriveProvider(base_url=sb.base_url), run))
        reconcile(db, sb, forbidden)
        # the forbidden records: kept beside the ledger with the reason, per kind, never a failed run
        told = db.sql("SELECT kind, raw_key, reason FROM migration_unreadable WHERE migration_id = %(r)s"
                      " AND kind = ANY(%(k)s)", {"r": run.id, "k": list(FAMILIES)})
        want = {(k, f"deal {d}") for k in FAMILIES for d in forbidden["deals"]}
        want |= {("followers", f"{WORD[of]} {i}") for of in ("persons", "organizations") for i in forbidden[of]}
        assert {(t["kind"], t["raw_key"]) for t in told} == want and all("HTTP 403" in t["reason"] for t in told)
        assert len(forbidden["deals"]) == 2 and forbidden["persons"] and forbidden["organizations"]
        for kind, key in want:  # explained and grouped like any row kept with its reason
            story = row_story.explain(db, TENANT, kind, key)
            assert story is not None and story["action"] == "failed" and "HTTP 403" in story["reason"], story
        groups = {g["kind"]: g["count"] for g in rollup.grouped_reasons(db, run.id) if "HTTP 403" in g["reason"]}
        assert groups == {k: sum(1 for kind, _ in want if kind == k) for k in FAMILIES}, groups
        # frugal: one request per record (every list fits a page), at the spec's token cost - the
        # arithmetic of the README's "Choosing the kinds" - and discovery asks nothing
        written = {lk: int(db.sql("SELECT count(*) AS n FROM migration_records WHERE tenant_id = %(t)s AND kind = %(k)s"
                                  " AND action IN ('created', 'matched')", {"t": TENANT, "k": lk})[0]["n"])
                   for lk in ("deals", "persons", "organizations")}
        # (a record the catch-up's walk wrote - one a phase left waiting for it - has its lists read
        # by the catch-up's recheck task of that kind: `record_lists.catchup_tasks`)
        spent = {r["kind"]: (int(r["requests"]), int(r["tokens"])) for r in db.sql(
            "SELECT COALESCE(cursor->>'fanout', kind) AS kind, sum((stats->>'requests')::int) AS requests,"
            " sum((stats->>'tokens')::int) AS tokens FROM migration_tasks WHERE migration_id = %(r)s"
            " AND COALESCE(cursor->>'fanout', kind) = ANY(%(k)s) GROUP BY 1",
            {"r": run.id, "k": list(FAMILIES)})}
        records = sum(written.values())
        assert spent == {"participants": (written["deals"], 10 * written["deals"]),
                         "followers": (records, 10 * records),
                         "deal_history": (written["deals"], 20 * written["deals"])}, (spent, written)
        # each kind adds up in the engine's own completeness check
        for c in rollup.rollup(db, run.id).completeness:
            assert not c["problems"], c
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=list(FAMILIES))
    assert proof.passed, proof.lines()
    by_kind = {k.kind: k for k in proof.kinds}
    assert set(by_kind["followers"].unreachable) == {k for kind, k in want if kind == "followers"}
    assert set(by_kind["participants"].unreachable) == {f"deal {d}" for d in forbidden["deals"]}
    # time in stage: the view chains each deal's stays from the history
    stays = db.sql("SELECT count(*) AS n, count(*) FILTER (WHERE left_at IS NULL) AS open FROM crm.deal_stage_periods"
                   " WHERE tenant_id = %(t)s", {"t": TENANT})[0]
    assert stays["n"] > stays["open"] > 0


def test_a_run_without_them_leaves_them_out_and_says_so(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
        provider = PipedriveProvider(base_url=sb.base_url)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        asked = sb.stats()["requests"]  # per endpoint template
        proof = verify(db, provider, TENANT, FAST)
        only = verify(db, provider, TENANT, FAST, kinds=list(FAMILIES))  # the phase's matches_source check
    assert only.left_out and only.passed and only.differences == 0, only.lines()
    assert not set(FAMILIES) & set(run.kinds)
    left = kinds_left_out(provider, run)
    assert {k: left.get(k) for k in FAMILIES} == {k: "opt-in" for k in FAMILIES}, left
    for table in ("deal_participants", "followers", "deal_history"):
        assert db.sql(f"SELECT count(*) AS n FROM crm.{table}")[0]["n"] == 0
    assert "/deals/{id}/mailMessages" in " ".join(asked), asked  # the templates are what is counted
    assert not [p for p in asked if any(s in p for s in ("/participants", "/followers", "/changelog"))], asked
    by_kind = {k.kind: k for k in proof.kinds}
    for k in FAMILIES:  # left out, not missing: no listing, no difference
        assert not by_kind[k].checked and by_kind[k].note.startswith("left out (opt-in)"), by_kind[k].as_dict()
        assert any(line.startswith(f"{k}: left out (opt-in)") for line in proof.lines())
    assert proof.passed, proof.lines()


def test_a_sync_reads_a_changed_deals_lists_again(db) -> None:
    with sandbox(forbidden_fanout=1) as sb:
        forbidden = forbidden_of(sb.truth())
        first = migrate(db, sb, TENANT, kinds=OPT_IN)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        changed = [c for c in (live_op(sb, "update") for _ in range(12)) if c["kind"] == "deals"]
        changed += [live_op(sb, "create") for _ in range(3)]
        deleted = [live_op(sb, "delete") for _ in range(8)]
        assert {c["kind"] for c in deleted} >= {"persons", "deals"}, deleted
        assert any("stage_id" in c.get("fields", ()) for c in changed), changed
        done = sync(db, sb, TENANT)
        assert set(FAMILIES) <= set(done.kinds), "a sync keeps the kinds the tenant was migrated with"
        reconcile(db, sb, forbidden)
        marked = db.sql("SELECT kind, count(*) AS n FROM migration_records WHERE tenant_id = %(t)s"
                        " AND deleted_at_source IS NOT NULL AND kind = ANY(%(k)s) GROUP BY kind",
                        {"t": TENANT, "k": list(FAMILIES)})
        assert marked, "rows of deleted records are marked deleted at the source"
        again = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND cursor ? 'fanout'",
                       {"r": done.id})[0]["n"]
        assert again > 0
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=list(FAMILIES))
    assert proof.passed, proof.lines()
    assert runs.get_run(db, done.id).status == "succeeded"


def test_a_dry_run_lists_them_and_writes_nothing(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT, kinds=OPT_IN, dry_run=True)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    seen = {r["kind"]: int(r["n"]) for r in db.sql(
        "SELECT kind, sum((stats->>'seen')::int) AS n FROM migration_tasks WHERE migration_id = %(r)s"
        " AND kind = ANY(%(k)s) GROUP BY kind", {"r": run.id, "k": list(FAMILIES)})}
    assert set(seen) == set(FAMILIES) and all(seen.values()), seen  # the would-be deals were fanned out over
    for table in ("deal_participants", "followers", "deal_history"):
        assert db.sql(f"SELECT count(*) AS n FROM crm.{table}")[0]["n"] == 0
    assert db.sql("SELECT count(*) AS n FROM migration_records WHERE kind = ANY(%(k)s)", {"k": list(FAMILIES)})[0]["n"] == 0


def test_a_stop_mid_phase_keeps_what_was_written_and_resume_lists_no_record_again(db) -> None:
    with sandbox() as sb:
        assert migrate(db, sb, TENANT).status == "succeeded"
        sb.configure(latency="realistic")  # one request a round: a task of 20 records takes seconds, the stop lands in one
        sb.reset_stats()
        run = start(db, sb, TENANT, kinds=["followers"], options={"fetch_threads": 1})
        lane = threading.Thread(target=drain_threads, args=(db, run.id),
                                kwargs={"width": 2, "settings": FAST, "providers": for_run})
        lane.start()
        deadline = time.monotonic() + 60
        while len(ledger(db, TENANT, "followers")) < 30 and time.monotonic() < deadline:
            time.sleep(0.02)
        runs.stop(db, run.id)
        lane.join(60)
        assert runs.get_run(db, run.id).status == "stopped"
        mid = db.sql("SELECT count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s AND status = 'cancelled'"
                     " AND processed_offset > 0", {"r": run.id})[0]["n"]
        assert mid > 0, "a task stopped between its records, its offset kept"
        stopped_at = len(ledger(db, TENANT, "followers"))
        sb.configure(latency="none")  # the latency only made the stop land mid-task; the resume need not pay it
        runs.resume(db, run.id, PipedriveProvider(base_url=sb.base_url), settings=FAST)
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        listings = sb.stats()["listings"]
        reconcile_followers(db, sb)
    assert runs.get_run(db, run.id).status == "succeeded", failed_tasks(db, run.id)
    followed = {k: v for k, v in listings.items() if "/followers" in k}
    assert followed and 30 <= stopped_at < len(ledger(db, TENANT, "followers")), (stopped_at, list(listings)[:5])
    assert set(followed.values()) == {1}, {k: v for k, v in followed.items() if v != 1}  # no record listed twice
    counts = kind_counts(db, run.id)["followers"]
    total = len(ledger(db, TENANT, "followers"))
    assert counts["imported"] == counts["seen"] == total, (counts, total)  # each row counted once


def reconcile_followers(db, sb) -> None:
    followers = sb.truth("followers")["followers"]
    want = {f"{kind}:{sid}:{u}" for kind, by in followers.items() for sid, users in by.items() for u in users}
    got = [r["source_id"] for r in db.sql("SELECT source_id FROM crm.followers WHERE tenant_id = %(t)s", {"t": TENANT})]
    assert sorted(got) == sorted(want)


def lists_worker_that_pauses(url: str, run_id: int, after_commits: int, ready: Any) -> None:
    """Drain a run in this (child) process; once a fan-out task has committed `after_commits`
    runs of records (its offset moved past them), signal `ready` and wait to be SIGKILLed there."""
    from engine_core import db as dbmod
    from engine_core.providers.pipedrive import record_lists
    from engine_core.worker import Worker

    original = record_lists.RecordListTask.commit
    seen = {"commits": 0}

    def commit(self: record_lists.RecordListTask) -> None:
        before = self.offset
        original(self)
        if self.offset > before and 0 < self.offset < len(self.records):
            seen["commits"] += 1
            if seen["commits"] >= after_commits:
                ready.set()
                time.sleep(600)  # the parent SIGKILLs us here

    record_lists.RecordListTask.commit = commit  # type: ignore[method-assign]
    Worker(dbmod.Database(url, max_size=4), settings=FAST, providers=for_run).drain(run_id)


def test_a_worker_killed_mid_task_resumes_at_its_offset_and_loses_or_doubles_nothing(db, db_url) -> None:
    with sandbox(forbidden_fanout=1) as sb:
        forbidden = forbidden_of(sb.truth())
        assert migrate(db, sb, TENANT).status == "succeeded"
        sb.reset_stats()
        run = start(db, sb, TENANT, kinds=["participants"], options={"fetch_threads": 1})
        spawn = mp.get_context("spawn")
        paused = spawn.Event()
        proc = spawn.Process(target=lists_worker_that_pauses, args=(db_url, run.id, 3, paused))
        proc.start()
        assert paused.wait(120), "the worker never committed mid-task"
        kill(proc.pid)
        proc.join()
        (task,) = db.sql("SELECT * FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running'", {"r": run.id})
        assert 0 < task["processed_offset"] < len(task["cursor"]["records"]), "killed between its records"
        assert reaper.release_stale(db, 0) == [task["id"]]
        drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
        listings = {k: v for k, v in sb.stats()["listings"].items() if "/participants" in k}
        participants = sb.truth("participants")["participants"]
        want = {str(p["id"]) for d, rows in participants.items() if d not in forbidden["deals"] for p in rows}
    assert runs.get_run(db, run.id).status == "succeeded", failed_tasks(db, run.id)
    assert listings and set(listings.values()) == {1}, {k: v for k, v in listings.items() if v != 1}
    rows = db.sql("SELECT count(*) AS n, count(DISTINCT source_id) AS d FROM crm.deal_participants"
                  " WHERE tenant_id = %(t)s", {"t": TENANT})[0]
    assert rows["n"] == rows["d"] == len(want) and set(ledger(db, TENANT, "participants")) == want
    counts = kind_counts(db, run.id)["participants"]
    assert counts["imported"] == counts["seen"] == len(want), counts


def test_request_faults_lose_and_double_nothing(db, quick_retries) -> None:
    with sandbox(forbidden_fanout=1, faults="500:0.05,502:0.03,503:0.05,drop:0.03,badjson:0.03", seed=3) as sb:
        forbidden = forbidden_of(sb.truth())
        run = migrate(db, sb, TENANT, kinds=OPT_IN)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        faults, codes = sb.stats()["faults"], sb.stats()["status_codes"]
        sb.configure(faults="")
        reconcile(db, sb, forbidden)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=list(FAMILIES))
    assert sum(faults.values()) > 20, faults
    hit = {t: c for t, c in codes.items() if any(s in t for s in ("/participants", "/followers", "/changelog"))
           and set(c) & {"500", "502", "503"}}
    assert len(hit) >= 3, codes  # the fan-outs' own requests met the faults too
    assert proof.passed, proof.lines()


def test_a_recheck_marks_a_row_the_changed_deals_list_no_longer_serves(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT, kinds=["+participants"])
        assert first.status == "succeeded", failed_tasks(db, first.id)
        change = next(c for c in (live_op(sb, "update") for _ in range(30)) if c["kind"] == "deals")
        deal = str(change["id"])
        # a participant the deal had when it was migrated, removed at the source since (no live op
        # removes one alone): its product row and ledger claim as the first run wrote them
        (local,) = db.sql("SELECT id FROM crm.deals WHERE tenant_id = %(t)s AND source_id = %(d)s", {"t": TENANT, "d": deal})
        row = db.sql("INSERT INTO crm.deal_participants (tenant_id, deal_id, source, source_id)"
                     " VALUES (%(t)s, %(d)s, 'pipedrive', '999999') RETURNING id", {"t": TENANT, "d": local["id"]})[0]
        db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, record_id,"
               " action) VALUES (%(r)s, %(t)s, 'pipedrive', 'participants', '999999', 'crm.deal_participants', %(id)s,"
               " 'created') RETURNING id", {"r": first.id, "t": TENANT, "id": row["id"]})
        done = sync(db, sb, TENANT)
        reconcile_participants = sb.truth("participants")["participants"]
    gone = db.sql("SELECT deleted_at_source FROM crm.deal_participants WHERE id = %(id)s", {"id": row["id"]})[0]
    assert gone["deleted_at_source"] is not None, "the changed deal's list was read again and no longer serves it"
    entry = ledger(db, TENANT, "participants")["999999"]
    assert entry["action"] == "created" and db.sql(
        "SELECT deleted_at_source FROM migration_records WHERE kind = 'participants' AND source_id = '999999'"
    )[0]["deleted_at_source"] is not None
    live = {r["source_id"] for r in db.sql("SELECT source_id FROM crm.deal_participants WHERE tenant_id = %(t)s"
                                            " AND deleted_at_source IS NULL", {"t": TENANT})}
    assert live == {str(p["id"]) for rows in reconcile_participants.values() for p in rows}
    assert done.status == "succeeded"


def test_a_kind_run_alone_later_keeps_every_kind_in_sync_from_its_own_snapshot(db) -> None:
    # the README's way to add an opt-in kind to a migrated tenant: run it alone; a sync after it
    # still takes the defaults, and lists their changes since the defaults' own run, not since the
    # later run's snapshot (a change made between the two runs would be missed for good)
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        changed = [live_op(sb, "update") for _ in range(6)]
        time.sleep(1.1)  # the change's update_time is before the next run's snapshot, at second precision
        alone = migrate(db, sb, TENANT, kinds=["deal_history"])
        assert alone.status == "succeeded" and "deal_history" in alone.kinds and "persons" not in alone.kinds, alone.kinds
        done = sync(db, sb, TENANT)
        assert set(first.kinds) | {"deal_history"} <= set(done.kinds), done.kinds
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST)
    assert proof.passed, (changed, proof.lines())


def test_a_sync_after_a_merge_of_a_participant_keeps_the_participation_under_the_survivor(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT, kinds=OPT_IN)
        assert first.status == "succeeded", failed_tasks(db, first.id)
        held = {str(p["person_id"]) for rows in sb.truth("participants")["participants"].values() for p in rows}
        merges = [c for c in (live_op(sb, "merge") for _ in range(20)) if c["kind"] == "persons"]
        # a merged person who took part in a deal: Pipedrive re-points the participation to the survivor
        assert any(str(c["id"]) in held for c in merges), merges
        done = sync(db, sb, TENANT)
        again = sync(db, sb, TENANT)
        reconcile(db, sb, {"deals": set()})
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=list(FAMILIES))
    assert proof.passed, proof.lines()
    assert done.status == again.status == "succeeded"
