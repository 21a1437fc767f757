"""A tenant migrated for some kinds: a plain `migrate run` takes only the kinds it lacks.

After `migrate run --tenant six --kinds organizations,persons,deals,leads,activities,notes`
succeeded, a plain `migrate run --tenant six` (the default kinds) started a whole new run that
walked the six kinds again. Pinned here, through the CLI and Dagster over the sandbox on real
Postgres:
* `migrate plan six` says the tenant is migrated for the six kinds and prices only the others;
* the plain `migrate run` says so in one line, its engine run's kinds are the default kinds but the
  six (and the catch-up), and none of the six kinds is walked again (the sandbox counts requests per
  path): the deals' and leads' lists are read only as the kinds taken need them (the emails'
  discovery, the archived lists' catch-up), the other four lists not at all;
* the tenant's rows then match one plain run of the default kinds over the same account, table by
  table and row by row (links compared as the source ids of the rows they point at), but for the
  first run's activities and notes skipped for an archived deal or lead it did not take: the run's
  what-now names the sync that takes them, and after it every row matches;
* a third plain `migrate run` is refused (nothing left), `--new-run` still starts a whole run, and
  the engine's attach policy (the UI's Materialize and backfills) narrows the same way.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine_core import db as dbmod
from engine_core import ledger_reads, runs
from engine_core.providers.pipedrive.provider import PipedriveProvider
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.pipedrive.support import TOKEN, failed_tasks, ledger_truth, migrate, sandbox, sync

pytestmark = pytest.mark.timeout(600)

SIX = ["organizations", "persons", "deals", "leads", "activities", "notes"]
# the list each of the six kinds walks (exact paths: /api/v2/deals/archived is another list)
SIX_LISTS = {"/api/v2/organizations", "/api/v2/persons", "/api/v2/deals", "/v1/leads", "/api/v2/activities",
             "/v1/notes"}
TABLES = {"users": "users", "pipelines": "pipelines", "stages": "stages", "companies": "organizations",
          "contacts": "persons", "deals": "deals", "leads": "leads", "activities": "activities", "notes": "notes",
          "products": "products", "emails": "emails"}
LINKS = {"company_id": "companies", "contact_id": "contacts", "owner_id": "users", "pipeline_id": "pipelines",
         "stage_id": "stages", "deal_id": "deals", "lead_id": "leads", "user_id": "users", "author_id": "users"}
SURROGATE = {"id", "tenant_id", "created_at", "updated_at", "imported_at"}


def _walked(stats: dict[str, Any]) -> dict[str, int]:
    """Listings of the six kinds' lists that are walks (not an `ids=` question), by path and query."""
    out = {}
    for key, n in stats["listings"].items():
        path, _, query = key.partition("?")
        if path in SIX_LISTS and "ids=" not in query:
            out[key] = n
    return out


def _as_source(ids: dict[str, dict[int, str]], key: str, value: Any) -> Any:
    """`value` with every link (a LINKS column, at any depth: a mail's sender and recipients) as the
    source id of the row it points at - record ids differ between tenants."""
    if isinstance(value, dict):
        return {k: _as_source(ids, k, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_source(ids, key, v) for v in value]
    return ids[LINKS[key]].get(value) if key in LINKS and value is not None else value


def _rows(db: dbmod.Database, tenant: str) -> dict[str, dict[str, Any]]:
    """Per crm table, source id -> the row as data: surrogate columns out, links as the linked row's source id."""
    ids = {t: {r["id"]: r["source_id"] for r in db.sql(f"SELECT id, source_id FROM crm.{t} WHERE tenant_id = %(t)s",
                                                        {"t": tenant})}
           for t in set(LINKS.values())}
    out: dict[str, dict[str, Any]] = {}
    for table in TABLES:
        rows = db.sql(f"SELECT * FROM crm.{table} WHERE tenant_id = %(t)s", {"t": tenant})
        out[table] = {r["source_id"]: {k: _as_source(ids, k, v) for k, v in r.items()
                                       if k not in SURROGATE and k != "custom_fields"} for r in rows}
    return out


def test_a_plain_run_after_six_kinds_takes_only_the_kinds_the_tenant_lacks(db_url, run_env):  # noqa: F811
    with sandbox(scale="small", seed=1) as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        provider = PipedriveProvider(base_url=sb.base_url)
        truth = sb.truth()
        whole = migrate(db, sb, "whole")  # one plain run of the default kinds: what the tenant should end as
        assert whole.status == "succeeded", failed_tasks(db, whole.id)
        first = _migrate_in_process(["run", "--tenant", "six", "--kinds", ",".join(SIX)], env)
        assert first.returncode == 0, (first.stdout[-2000:], first.stderr[-2000:])
        plan = _migrate_in_process(["plan", "six", "--json"], env)
        plan_text = _migrate_in_process(["plan", "six"], env)
        sb.reset_stats()
        second = _migrate_in_process(["run", "--tenant", "six"], env)
        stats = sb.stats()
        assert second.returncode == 0, (second.stdout[-2000:], second.stderr[-3000:])
        done = db.sql("SELECT * FROM migrations WHERE tenant_id = 'six' ORDER BY id")
        third = _migrate_in_process(["run", "--tenant", "six"], env)
        got_rows, want_rows = _rows(db, "six"), _rows(db, "whole")
        skipped = {(r["kind"], r["source_id"]) for r in db.sql(
            "SELECT kind, source_id FROM migration_records WHERE tenant_id = 'six' AND action = 'skipped'")}
        takeable = ledger_reads.takeable(db, "six", "pipedrive", ["activities", "notes"])
        sync(db, sb, "six")  # what the line says brings the migrated kinds up to date
        synced_rows = _rows(db, "six")
        with pytest.raises(runs.AlreadyMigrated):  # the UI's Materialize: the same policy
            runs.attach(db, provider, "six", start_kwargs={})
        narrowed = runs.attach(db, provider, "six", start_kwargs={"kinds": ["persons", "deal_history"]})
        held = {r["kind"]: {x["source_id"] for x in db.sql(
            "SELECT source_id FROM migration_records WHERE tenant_id = 'six' AND kind = %(k)s", {"k": r["kind"]})}
            for r in db.sql("SELECT DISTINCT kind FROM migration_records WHERE tenant_id = 'six'")}
    defaults = [k for group in runs.run_plan(provider) for k in group if k != "catchup"]
    lacking = [k for k in defaults if k not in SIX]
    # the plan: migrated for the six, prices the others only
    assert plan.returncode == 0, plan.stderr[-2000:]
    payload = json.loads(plan.stdout)
    assert payload["covered"] == SIX and payload["kinds_lacking"] == lacking, payload
    priced = [k["kind"] for k in payload["kinds"] if k["kind"] not in ("start", "catchup")]  # a run's start and end
    assert sorted(priced) == sorted(lacking), priced
    line = (f"tenant 'six' is migrated for {', '.join(SIX)}; this run takes the kinds it lacks: {', '.join(lacking)}; "
            "`migrate sync six` brings the migrated ones up to date")
    assert plan_text.stdout.startswith(f"plan for six: {line}\n"), plan_text.stdout[:600]
    # the plain run: said in one line, took only the kinds the tenant lacked, walked no list of the six
    assert line in second.stderr, second.stderr[-3000:]
    assert len(done) == 2 and [d["status"] for d in done] == ["succeeded", "succeeded"], done
    taken = [k for group in done[1]["plan"] for k in group]
    assert taken == [*lacking, "catchup"], taken
    # organizations', persons', activities' and notes' lists: never; the deals' and leads' lists only
    # as the kinds taken read them - the emails' discovery (deals with their mail counts) and the
    # catch-up, which walks the active and archived lists of one ledger kind together (a deal
    # archived between them) - so a page of deals twice at most, of leads once (a run of the
    # default kinds walks them once more, as the deals and leads kinds)
    walked = _walked(stats)
    assert {key.partition("?")[0] for key in walked} <= {"/api/v2/deals", "/v1/leads"}, walked
    assert all(n <= (2 if key.startswith("/api/v2/deals") else 1) for key, n in walked.items()), walked
    # the tenant's rows: as one plain run leaves them, row by row, but the activities and notes of the
    # first run skipped for an archived deal or lead it did not take - written by the second run, so
    # the sync the line names takes them (and the run's what-now says so); after it, every row
    diff = {(t, sid): (got_rows[t].get(sid), row) for t, rows in want_rows.items() for sid, row in rows.items()
            if got_rows[t].get(sid) != row}
    changed = {k: {c for c in want if got[c] != want[c]} for k, (got, want) in diff.items() if got is not None}
    assert {sid for _, sid in diff} and not changed, (len(changed), sorted(set().union(*changed.values())), list(changed.items())[:5])
    assert {(TABLES[t], sid) for t, sid in diff} <= skipped, sorted(diff)[:5]
    assert takeable and "whose parents are written now" in second.stdout + second.stderr, second.stdout[-2000:]
    assert not [sid for t, rows in got_rows.items() for sid in rows if sid not in want_rows[t]]
    assert synced_rows == want_rows, [(t, sid) for t, rows in want_rows.items() for sid, row in rows.items()
                                      if synced_rows[t].get(sid) != row][:5]
    source = ledger_truth(truth)
    for kind in source:
        assert held.get(kind, set()) <= source[kind], kind
    # nothing left: refused; an opt-in kind with a covered one: only the opt-in kind
    assert third.returncode == 2 and "already migrated by" in third.stderr, third.stderr[-2000:]
    assert narrowed.action == "started" and [k for k in narrowed.run.kinds if k != "catchup"] == ["deal_history"]
    assert "tenant 'six' is migrated for persons; this run takes the kinds it lacks: deal_history" in narrowed.message
