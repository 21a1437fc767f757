"""The per-kind skipped and failed figures of `migrate status T` agree with `migrate rows` and the
tenants overview (`ledger_reads.bad_row_counts`): the mail of a deal no listing can serve (a deal without
a readable id, or whose mail the source refuses) is kept as one failed record per deal, which no
email task counted as a row; the rollup counts it into the kind's failed figure (`kept_apart`) and
its seen figure, so every row of the table adds up (seen = the sum of its outcomes). On a sandbox
with malformed rows and private deal mail, reconciled with the sandbox's truth of both.

A sync after the run fails the malformed rows again, in its catch-up: those failures are the
catch-up's, counted in its row and per listing kind in each kind's `caught_up` (`by catch-up`), as
its other outcomes are - not records kept apart under the phase's kind with the most of them (a
sync's kinds, which have no tasks, showed seen 0 and failed N) - and `migrate status T --json`
says so too, and `migrate report T --kind emails` after the sync says the tenant's failed mail
the run before it left (its default is the latest run, the sync, and its title says so)."""
from __future__ import annotations

import json

from engine_core import ledger_reads, rollup
from engine_core.progress import PhaseMeter
from engine_core.providers.pipedrive.kinds import KINDS as PIPEDRIVE_KINDS
from engine_core.rollup import COUNTERS
from migration_pipeline.assets.metadata import phase_metadata
from migration_pipeline.instance import to_url
from tests.dagster.test_cli_errors import _migrate_in_process
from tests.pipedrive.support import failed_tasks, migrate, sandbox, sync

TENANT = "acme"
ACCOUNT = {"seed": 1, "faults": "badrow:0.03", "private_deal_mail": 2}  # seed 1: deal 10 has no readable id


def test_status_rows_and_overview_count_the_same_failed_mail(db, db_url) -> None:
    with sandbox(**ACCOUNT) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    kept = db.sql("SELECT raw_key FROM migration_unreadable WHERE migration_id = %(r)s AND kind = 'emails'"
                  " AND raw_key LIKE 'deal %%'", {"r": run.id})
    private = {f"deal {d['deal_id']}" for d in truth["private_deal_mail"]}
    assert private < {k["raw_key"] for k in kept} and len(kept) > len(private), kept  # both shapes are here
    held = ledger_reads.bad_row_counts(db, TENANT)
    assert not any(v["waiting"] for v in held.values()), held  # the catch-up settled every waiting row
    bad = {k: {"skipped": v["skipped"], "failed": v["failed"]} for k, v in held.items()}
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    # per ledger kind (the catch-up's own row counts rows of the other kinds again, as their carrier)
    figures = {k.kind: {"skipped": k.skipped, "failed": k.failed} for k in r.kinds
               if (k.skipped or k.failed) and not k.handed_over}
    assert figures == bad, (figures, bad)
    emails = next(k for k in r.kinds if k.kind == "emails")
    assert emails.kept_apart == len(kept)
    _phase_says_one_failed(db, r, emails)
    for k in r.kinds:  # the table's rows add up: a kept record is a row seen and failed
        assert k.seen == sum(getattr(k, c) for c in COUNTERS), (k.kind, k)
    # as the commands print them: `status T --json` per kind, `status --json` per tenant, `rows T --json`
    env = {"DATABASE_URL": to_url(db_url), "MIGRATE_SOURCE": "pipedrive"}
    status = json.loads(_migrate_in_process(["status", TENANT, "--json"], env).stdout)
    assert {k["kind"]: {"skipped": k["skipped"], "failed": k["failed"]} for k in status["kinds"]
            if (k["skipped"] or k["failed"]) and not k["handed_over"]} == bad
    (overview,) = [o for o in json.loads(_migrate_in_process(["status", "--json"], env).stdout) if o["tenant"] == TENANT]
    assert overview["failed"] == sum(v["failed"] for v in bad.values())
    with sandbox(**ACCOUNT) as sb:  # the same account again
        synced = sync(db, sb)  # its catch-up lists every kind whole: the malformed rows fail again
    # the sync: per listing kind, the catch-up's failures are credited to their own kind; the kinds'
    # own rows (no tasks of their own in a sync) stay 0 and the catch-up's row counts them
    s = rollup.rollup(db, synced.id)
    assert s.complete, s.incomplete
    rows = {k.kind: k for k in s.kinds}
    for k in s.kinds:
        assert k.seen == sum(getattr(k, c) for c in COUNTERS), (k.kind, k)  # the table's row adds up
    assert all(k.failed == 0 and k.kept_apart == 0 for k in s.kinds if not k.handed_over), s.kinds
    held = {r["kind"]: int(r["n"]) for r in db.sql(
        "SELECT kind, count(*) AS n FROM (SELECT kind FROM migration_records WHERE migration_id = %(r)s AND action = 'failed'"
        " UNION ALL SELECT kind FROM migration_unreadable WHERE migration_id = %(r)s) f GROUP BY kind", {"r": synced.id})}
    assert held.get("deals"), held  # a malformed deal, failed again
    ledger_kind = {"deals_archived": "deals", "leads_archived": "leads"}
    credited: dict[str, int] = {}
    for k in s.kinds:
        credited[ledger_kind.get(k.kind, k.kind)] = credited.get(ledger_kind.get(k.kind, k.kind), 0) + k.caught_up.get("failed", 0)
    assert {k: n for k, n in credited.items() if n} == held
    assert rows["catchup"].failed == sum(held.values())
    status = json.loads(_migrate_in_process(["status", TENANT, "--json"], env).stdout)
    assert status["run_id"] == synced.id
    said = {k["kind"]: k for k in status["kinds"]}
    assert said["deals"]["kept_apart"] == 0 and said["deals"]["failed"] == 0, said["deals"]
    assert said["deals"]["seen"] == 0 and said["deals"]["caught_up"]["failed"] == held["deals"], said["deals"]
    # `migrate report T --kind emails` after the sync: the sync's figures, titled as the latest run's, and
    # the tenant's failed mail now - which the run before it left - not "0 seen" alone
    out = _migrate_in_process(["report", TENANT, "--kind", "emails"], {**env, "COLUMNS": "400"}).stdout.splitlines()
    assert out[1].startswith(f"{synced.name}, the tenant's latest run: "), out
    assert any(line.startswith(f"the tenant's emails rows now (every run, as `migrate status` and `migrate rows` count "
                               f"them): 0 skipped, {len(kept)} failed; left by run #{run.id} ({len(kept)} failed)")
               for line in out), out
    told = json.loads(_migrate_in_process(["report", TENANT, "--kind", "emails", "--json"], env).stdout)
    assert told["latest"] and told["run_mode"] == "sync" and told["tenant_now"]["counts"]["failed"] == len(kept), told
    assert told["caught_up"].get("seen", 0) == rows["emails"].caught_up.get("seen", 0), told
    earlier = _migrate_in_process(["report", TENANT, "--kind", "emails", "--run", str(run.id), "--json"], env).stdout
    assert json.loads(earlier)["tenant_now"] is None  # a run asked for by number is that run's report alone


def _phase_says_one_failed(db, r, emails) -> None:
    """The emails phase's failed figure is one number wherever the phase's figures are said - its
    progress (the terminal's bars and the lines: the tasks' stats), its materialisation - the records
    kept apart in it included; the per-kind table's adds only what the catch-up failed after the
    phase closed (`failed_by_catchup`)."""
    phase = emails.phase
    (closed,) = r.phase_kinds(phase, at_close=True)
    meter = PhaseMeter(db, r.run_id, phase, [k.kind for k in r.phase_kinds(phase)]).snapshot()
    materialised = phase_metadata(db, r, phase)
    assert meter.failed == closed.failed == materialised["failed"].value >= emails.kept_apart > 0, (meter, closed)
    assert emails.failed == closed.failed + emails.failed_by_catchup


def test_kept_apart_is_the_records_kept_and_the_catchups_failures_are_said(db, db_url) -> None:
    """On a small account whose catch-up fails mail of deals it wrote, those failures are not records
    kept apart: `kept_apart` is the deals whose mail was kept as one record, and the per-kind table
    says what its failed figure holds beyond its phase's (the catch-up's), so the progress line, the
    phase's table and the per-kind table can be read against each other."""
    account = {"scale": "small", "faults": "badrow:0.03", "hostile_mail": True, "private_deal_mail": 2,
               "private_mail": 3}
    with sandbox(**account) as sb:
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    emails = next(k for k in r.kinds if k.kind == "emails")
    (kept,) = db.sql("SELECT count(*) AS n FROM migration_unreadable WHERE migration_id = %(r)s AND kind = 'emails'"
                     " AND raw_key LIKE 'deal %%'", {"r": run.id})
    assert emails.kept_apart == kept["n"], (emails, kept)
    assert emails.failed == ledger_reads.bad_row_counts(db, TENANT)["emails"]["failed"]
    assert emails.failed_by_catchup > 0, emails  # this account's catch-up fails mail the phase did not list
    _phase_says_one_failed(db, r, emails)
    env = {"DATABASE_URL": to_url(db_url), "MIGRATE_SOURCE": "pipedrive", "COLUMNS": "200"}
    said = _migrate_in_process(["status", TENANT], env).stdout
    at_close = emails.failed - emails.failed_by_catchup
    assert (f"emails: {emails.failed} failed: {at_close} as its phase counted them ({emails.kept_apart} of them "
            f"records kept apart), {emails.failed_by_catchup} the catch-up failed after the phase closed") in said, said


def test_per_kind_skipped_is_what_rows_lists_and_the_catchups_part_is_said(db, db_url) -> None:
    """With the opt-in kinds, a kind listed under written parents only (deal products, followers,
    mail) has the rows of a skipped parent listed - and skipped - by the catch-up alone: the per-kind
    table's skipped figure is what `migrate rows` lists (the catch-up's part named
    `skipped_by_catchup` and said under the table), while the phase's figures (its progress, its
    materialisation) stay what the phase counted. A tiny account (seed 3, 5% malformed rows) has
    skipped deals with deal products, so deal products are skipped by the catch-up alone."""
    with sandbox(scale="tiny", seed=3, faults="badrow:0.05") as sb:
        run = migrate(db, sb, TENANT, kinds=[k.name for k in PIPEDRIVE_KINDS])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    held = {k: v["skipped"] for k, v in ledger_reads.bad_row_counts(db, TENANT).items() if v["skipped"]}
    ledger_kind = {"deals_archived": "deals", "leads_archived": "leads"}
    figures: dict[str, int] = {}
    for k in r.kinds:
        if k.skipped and not k.handed_over:
            figures[ledger_kind.get(k.kind, k.kind)] = figures.get(ledger_kind.get(k.kind, k.kind), 0) + k.skipped
    assert figures == held, (figures, held)
    later = [k for k in r.kinds if k.skipped_by_catchup]
    assert any(k.kind == "deal_products" for k in later), later  # none skipped by its phase, all by the catch-up
    for k in r.kinds:
        assert k.seen == sum(getattr(k, c) for c in COUNTERS), (k.kind, k)  # the rows still add up
    k = later[0]
    (closed,) = [c for c in r.phase_kinds(k.phase, at_close=True) if c.kind == k.kind]
    assert closed.skipped == k.skipped - k.skipped_by_catchup
    assert phase_metadata(db, r, k.phase)[f"{k.kind}/skipped"].value == closed.skipped
    env = {"DATABASE_URL": to_url(db_url), "MIGRATE_SOURCE": "pipedrive", "COLUMNS": "200"}
    status = json.loads(_migrate_in_process(["status", TENANT, "--json"], env).stdout)
    said = {s["kind"]: s for s in status["kinds"]}
    assert said[k.kind]["skipped"] == k.skipped and said[k.kind]["skipped_by_catchup"] == k.skipped_by_catchup
    assert status["counts_add_up"] is True and "complete" not in status
    text = _migrate_in_process(["status", TENANT], env).stdout
    assert (f"{k.kind}: {k.skipped} skipped: {closed.skipped} as its phase counted them, {k.skipped_by_catchup} "
            f"the catch-up skipped after the phase closed") in text, text
