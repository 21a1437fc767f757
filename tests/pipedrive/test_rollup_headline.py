"""`migrate report`'s headline (`tables.outcome_counts`, `rollup_totals.run_totals`) counts each row
once: the rows a phase left waiting for the catch-up's walk, and the rows a phase skipped or
failed that the catch-up's walk writes again, are counted with the catch-up's outcome, not a second
time in `seen` - and a succeeded run shows no row still left to the catch-up that the catch-up
took (it had said 8133 seen and "163 left to catch-up" for the demo's 7970 rows). Reconciled with
the ledger (every row the run served holds one record, or one row without a readable id) and the
sandbox's truth (its counts per kind).

The catch-up counts, per kind, the rows it wrote that the run held as placeholders before
(`catchup_stats.PerKindStats.heard`: "again_waiting@<kind>", ..., "skipped_waiting@<kind>"),
so the waiting rows it skipped move from `waiting` to `skipped` exactly
(`rollup_catchup.skipped_by_catchup`): checked against the waiting placeholders the ledger held
when the catch-up began."""
from __future__ import annotations

from collections import Counter

from click.testing import CliRunner

from engine_core import rollup, runs
from engine_core.rows import WAITS_FOR_WALK
from engine_core.worker import Worker, drain_threads
from engine_core.providers.registry import for_run
from migration_pipeline.cli.tables import outcome_counts
from tests.pipedrive.support import FAST, failed_tasks, sandbox, start

OUTCOMES = ("imported", "matched", "already_here", "updated", "skipped", "waiting", "failed")
# truth name -> the ledger kind its rows are held under
TRUTH = {"organizations": "organizations", "persons": "persons", "deals": "deals", "deals_archived": "deals",
         "leads": "leads", "leads_archived": "leads", "activities": "activities", "notes": "notes",
         "mail_messages": "emails"}
FAULTY = {"scale": "small", "seed": 7, "faults": "badrow:0.05,503:0.05,badjson:0.02,drop:0.01"}


def _ledger_rows(db, tenant: str) -> Counter:
    rows = db.sql("SELECT kind, count(*) AS n FROM (SELECT kind FROM migration_records WHERE tenant_id = %(t)s"
                  " UNION ALL SELECT kind FROM migration_unreadable WHERE tenant_id = %(t)s) x GROUP BY kind",
                  {"t": tenant})
    return Counter({r["kind"]: int(r["n"]) for r in rows})


def _placeholders(db, tenant: str) -> dict[str, set[tuple[str, str]]]:
    """The tenant's placeholders now, by what they are: "waiting", "skipped", "failed"."""
    out: dict[str, set[tuple[str, str]]] = {"waiting": set(), "skipped": set(), "failed": set()}
    for r in db.sql("SELECT kind, source_id, action, reason FROM migration_records WHERE tenant_id = %(t)s"
                    " AND action IN ('skipped', 'failed')", {"t": tenant}):
        what = "waiting" if WAITS_FOR_WALK in (r["reason"] or "") else r["action"]
        out[what].add((r["kind"], r["source_id"]))
    return out


def _migrated(db, sb, tenant: str) -> tuple[object, dict[str, set[tuple[str, str]]]]:
    """A full run drained to the catch-up's phase, the placeholders then, and drained to its end."""
    run = start(db, sb, tenant)
    Worker(db, settings=FAST, providers=for_run).drain(run.id, until_phase_closed=len(run.plan) - 2)
    assert runs.get_run(db, run.id).current_phase == len(run.plan) - 1, failed_tasks(db, run.id)
    before = _placeholders(db, tenant)
    drain_threads(db, run.id, width=4, settings=FAST, providers=for_run)
    done = runs.get_run(db, run.id)
    assert done.status == "succeeded", failed_tasks(db, run.id)
    return done, before


def _assert_headline_counts_each_row_once(db, run, tenant: str, truth: dict[str, int],
                                          mail: bool = True) -> dict[str, int]:
    """The headline's figures add up to the ledger's rows and to the source's counts per kind (of
    mail only with `mail`: on a faulty account a malformed deal's mail is one record kept apart)."""
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    totals = outcome_counts(r)
    ledger = _ledger_rows(db, tenant)
    # every row served once, with one outcome: as the ledger holds them, and as the source counts them
    assert totals["seen"] == sum(ledger.values()) == sum(totals[c] for c in OUTCOMES), (totals, ledger)
    assert totals["waiting"] == 0, totals  # the catch-up took every row left to it
    by_ledger_kind = Counter()
    for name, kind in TRUTH.items():
        if mail or kind != "emails":
            by_ledger_kind[kind] += truth[name]
    for kind, n in by_ledger_kind.items():
        assert ledger[kind] == n, (kind, ledger[kind], n)
    # the headline's skipped and failed are the ledger's, as the per-kind table says them
    kinds = [k for k in r.kinds if k.kind != "catchup"]
    assert totals["skipped"] == sum(k.skipped for k in kinds) and totals["failed"] == sum(k.failed for k in kinds)
    return totals


def test_a_default_run_counts_the_rows_left_to_the_catch_up_once(db, db_url) -> None:
    tenant = "plain"
    with sandbox(scale="small") as sb:
        run, before = _migrated(db, sb, tenant)
        truth = sb.truth()["counts"]
    # the situation: the phases left rows to the catch-up's walk
    assert before["waiting"], before
    totals = _assert_headline_counts_each_row_once(db, run, tenant, truth)
    r = rollup.rollup(db, run.id)
    left = sum(k.waiting for k in r.kinds)
    assert left == len(before["waiting"]) and totals["imported"] == totals["seen"], (left, totals)
    # `migrate report` says it so
    from migration_pipeline.cli.inspect import report
    from migration_pipeline.instance import to_url

    result = CliRunner().invoke(report, [tenant], env={"DATABASE_URL": to_url(db_url), "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    headline = next(line for line in result.output.splitlines() if line.startswith(f"{run.name}, the tenant's latest run: "))
    assert f": {totals['seen']} seen, {totals['seen']} imported," in headline and " 0 left to catch-up," in headline, headline


def test_a_faulty_run_counts_the_waiting_rows_the_catch_up_skipped_exactly(db, quick_retries) -> None:
    tenant = "faulty"
    with sandbox(**FAULTY) as sb:
        run, before = _migrated(db, sb, tenant)
        truth = sb.truth()["counts"]
    after = _placeholders(db, tenant)
    _assert_headline_counts_each_row_once(db, run, tenant, truth, mail=False)
    r = rollup.rollup(db, run.id)
    kinds = {k.kind: k for k in r.kinds}
    # the waiting rows the catch-up skipped, per ledger kind: those the ledger held waiting when it began
    # and holds skipped now
    skipped_waiting = Counter(kind for kind, _ in before["waiting"] & after["skipped"])
    assert sum(skipped_waiting.values()) > 0, before["waiting"]  # the situation
    for ledger_kind, n in skipped_waiting.items():
        members = [k for k in kinds.values() if k.kind.removesuffix("_archived") == ledger_kind]
        assert sum(k.caught_up.get("skipped_waiting", 0) for k in members) == n, (ledger_kind, n)
        assert sum(k.waiting_skipped for k in members) == n, (ledger_kind, n, members)
    # the rows it met again, as the run held them when it began: every waiting one, and the skipped
    # and failed ones of the lists it walks
    again = {what: sum(k.caught_up.get(f"again_{what}", 0) for k in kinds.values()) for what in before}
    assert again["waiting"] == len(before["waiting"]), (again, len(before["waiting"]))
    assert 0 < again["failed"] and 0 < again["skipped"] + again["failed"], again
