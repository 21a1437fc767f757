"""The rollup a polling `migrate run` reads every tick finds a run's failed and skipped ledger
entries through the index on (migration_id, action, kind) (migration 0022): its reads of them touch
those entries alone, not every entry of the run. Checked on the plans Postgres chooses for a run of
thousands of written rows and no failed or skipped one, and on the pages their index scans read
(the index's pages, not the rows' timing: no clock in the check)."""
from __future__ import annotations

from typing import Any

import psycopg

from engine_core import db as dbmod
from engine_core import rollup
from engine_core.rows import WAITS_FOR_WALK
from tests.pipedrive.support import failed_tasks, migrate, sandbox

INDEX = "migration_records_run_action"
MAX_PAGES = 12  # index descents and their leaves; (migration_id, kind, action) walks ~56 for 8,000 entries


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan."""
    return [plan] + [n for child in plan.get("Plans", ()) for n in _nodes(child)]


def test_the_rollups_ledger_reads_use_the_run_and_action_index(db, db_url) -> None:
    with sandbox(scale="small", seed=3) as sb:
        run = migrate(db, sb, "acme")
    assert run.status == "succeeded", failed_tasks(db, run.id)
    counts = db.sql("SELECT action, count(*) AS n FROM migration_records WHERE migration_id = %(r)s GROUP BY action",
                    {"r": run.id})
    assert sum(int(r["n"]) for r in counts) > 5000, counts
    index = db.sql("SELECT indexdef FROM pg_indexes WHERE indexname = %(i)s", {"i": INDEX})
    assert index and "(migration_id, action, kind)" in index[0]["indexdef"], index
    # dead index entries of placeholders the run took over (skipped, then written) gone, as
    # autovacuum leaves them, and statistics for the planner: the plans and pages of a settled table
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) migration_records")
    ledger_indexes = {r["indexname"] for r in db.sql("SELECT indexname FROM pg_indexes WHERE tablename = 'migration_records'")}
    reads = {"held": (rollup._LEDGER_HELD, {"run_id": run.id, "waits": WAITS_FOR_WALK}),
             "reasons": (dbmod.query("ledger_reasons"), {"run_id": run.id}),
             "waiting": (dbmod.query("ledger_waiting_counts"), {"run_id": run.id, "waiting": WAITS_FOR_WALK})}
    for name, (statement, params) in reads.items():
        plan = db.sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)[0]["QUERY PLAN"][0]["Plan"]
        nodes = _nodes(plan)
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "migration_records"], \
            (name, plan)
        scans = [n for n in nodes if n.get("Index Name") in ledger_indexes]
        assert scans and all(s["Index Name"] == INDEX for s in scans), (name, plan)
        for s in scans:
            assert "action" in s.get("Index Cond", ""), (name, s)
            pages = int(s.get("Shared Hit Blocks", 0)) + int(s.get("Shared Read Blocks", 0))
            assert pages <= MAX_PAGES, (name, pages, s)
