"""A run of the six kinds a plain loader picks (organizations, persons, deals, leads, activities,
notes: no archived lists) skips the activities and notes of archived deals and leads, their person
and organization imported. A `migrate run` of those kinds again is refused (the tenant is
migrated); what brings them is a run of the archived lists alone, then a sync. That remedy is said
where the user looks, with the tenant's commands, and it works, end to end through the command
line on the sandbox:

* each such row's reason names the list the run did not take and the remedy (`skip_reason.UNTAKEN`);
* the run's what-now names the run of the archived lists (and the sync after it);
* `migrate explain` of such a row names both commands; of the archived deal itself (not in the
  ledger) it says its list was part of no run of the tenant, how to take it and the rows waiting;
* the command the what-now printed starts a run (not refused), whose what-now names `migrate sync`;
* the sync imports every one of those rows with its deal or lead linked to the product's row.
"""
from __future__ import annotations

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.skip_reason import untaken_mark
from tests.dagster.test_cli_errors import _migrate_in_process, run_env  # noqa: F401
from tests.pipedrive.support import TOKEN, sandbox

pytestmark = pytest.mark.timeout(600)

T = "loader"
SIX = "organizations,persons,deals,leads,activities,notes"


def _what_now(out) -> list[str]:
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out.stdout[out.stdout.index("what now: "):].splitlines()


def _skipped(db: dbmod.Database) -> dict[tuple[str, str], dict]:
    rows = db.sql("SELECT kind, source_id, reason, parents FROM migration_records WHERE tenant_id = %(t)s"
                  " AND kind IN ('activities', 'notes') AND action = 'skipped'", {"t": T})
    return {(r["kind"], r["source_id"]): r for r in rows}


def _parent(row: dict) -> tuple[str, str]:
    (missing,) = [p for p in row["parents"] if p["missing"]]
    return missing["kinds"][0], missing["id"]


def test_the_archived_lists_then_a_sync_bring_the_rows_skipped_for_archived_parents(db_url, run_env):  # noqa: F811
    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        env = dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN)
        first = _what_now(_migrate_in_process(["run", "--tenant", T, "--kinds", SIX], env))
        skipped = _skipped(db)
        parents = {key: _parent(row) for key, row in skipped.items()}
        assert {k for k, _ in parents.values()} == {"deals", "leads"}, parents  # the sandbox has both
        for key, row in skipped.items():
            lists = f"{parents[key][0]}_archived"
            assert untaken_mark(lists) in row["reason"] and f"`--kinds {lists}`, then `migrate sync`" in row["reason"], row
        take = f"migrate run --tenant {T} --kinds deals_archived,leads_archived"
        (said,) = [ln for ln in first if ln.strip().startswith(take)]
        assert f"{len(skipped)} skipped row(s) wait for" in said and f"then `migrate sync {T}`" in said, first

        (activity, sid), row = next((k, r) for k, r in sorted(skipped.items()) if parents[k][0] == "deals")
        told = _migrate_in_process(["explain", T, activity, sid], env)
        assert told.returncode == 0, told.stderr
        assert (f"to link it: `migrate run --tenant {T} --kinds deals_archived` takes deals_archived" in told.stdout
                and f"then `migrate sync {T}` takes this row" in told.stdout), told.stdout
        deal = parents[(activity, sid)][1]
        waiting = sum(1 for p in parents.values() if p == ("deals", deal))
        absent = _migrate_in_process(["explain", T, "deals", deal], env)
        assert absent.returncode == 1, absent.stderr
        assert (f"deals {deal} of tenant {T!r} is not in the ledger: deals_archived was part of no run of the tenant"
                in absent.stdout and f"`migrate run --tenant {T} --kinds deals_archived` takes it" in absent.stdout
                and f"; {waiting} skipped row(s) wait for it" in absent.stdout), absent.stdout

        refused = _migrate_in_process(["run", "--tenant", T, "--kinds", "activities,notes"], env)
        assert refused.returncode == 2 and "already migrated" in refused.stderr, refused.stderr
        second = _what_now(_migrate_in_process(take.split()[1:], env))
        assert runs.latest_run(db, T).kinds == ("deals_archived", "leads_archived", "catchup")
        (sync_line,) = [ln for ln in second if ln.strip().startswith(f"migrate sync {T}")]
        assert f"takes the {len(skipped)} skipped row(s) whose parents are written now" in sync_line, second
        _what_now(_migrate_in_process(["sync", T], env))

        assert _skipped(db) == {}, _skipped(db)
        for (kind, source_id), (parent_kind, parent_id) in parents.items():
            column = "deal_id" if parent_kind == "deals" else "lead_id"
            linked = db.sql(
                f"SELECT x.{column} AS linked, r.record_id AS parent FROM crm.{kind} x, migration_records r"
                " WHERE x.tenant_id = %(t)s AND x.source_id = %(s)s AND r.tenant_id = %(t)s AND r.kind = %(pk)s"
                " AND r.source_id = %(p)s AND r.action = 'created'",
                {"t": T, "s": source_id, "pk": parent_kind, "p": parent_id})
            assert len(linked) == 1 and linked[0]["linked"] == linked[0]["parent"], (kind, source_id, linked)
