"""A run read after the fact, for the face: `migrate status`, `report` and `explain`, the tenants
overview, the sensors' and lanes' progress, the schedules.

Read-only queries over the run and task tables (`migrations`, `migration_tasks`); a run's life
(admission, start, stop, retry, resume, attach) is in `runs.py`.
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from engine_core.db import Database


def tenants(db: Database) -> list[str]:
    """Every tenant some run (of any source, any mode) was started for, sorted."""
    return [r["tenant_id"] for r in db.sql("SELECT DISTINCT tenant_id FROM migrations ORDER BY 1")]


def tenant_sources(db: Database, tenant: str) -> list[str]:
    """The sources `tenant`'s runs were started from, sorted."""
    return [r["source"] for r in db.sql("SELECT DISTINCT source FROM migrations WHERE tenant_id = %(t)s ORDER BY 1",
                                        {"t": tenant})]


def active_seconds(row: Mapping[str, Any], now: datetime | None = None) -> float | None:
    """Seconds a run was running, from its `migrations` row: start to end (`finished_at`, else `now`)
    less `stopped_seconds`, the spans it spent stopped, failed or ended before it was reopened
    (`reopen_run`). A run stopped for a day then resumed has not run for a day. None before it started."""
    started = row.get("started_at")
    if started is None:
        return None
    end = row.get("finished_at") or now or datetime.now(started.tzinfo)
    return max(0.0, (end - started).total_seconds() - float(row.get("stopped_seconds") or 0))


def task_stat_keys(db: Database, run_id: int, kind: str | None = None) -> list[str]:
    """The stats `migrate report --stat` can group run `run_id`'s succeeded tasks (of `kind`) by:
    the keys of their `stats` whose every value is a whole number, sorted ("imported", "requests",
    "seen", ...; the catch-up's "imported@deals" too)."""
    return [r["key"] for r in db.sql(
        "SELECT s.key FROM migration_tasks t, jsonb_each(t.stats) s"
        " WHERE t.migration_id = %(r)s AND (%(k)s::text IS NULL OR t.kind = %(k)s) AND t.status = 'succeeded'"
        " GROUP BY s.key HAVING bool_and(jsonb_typeof(s.value) = 'number' AND s.value::text ~ '^-?[0-9]+$')"
        " ORDER BY 1", {"r": run_id, "k": kind})]


def task_groups(db: Database, run_id: int) -> list[dict[str, Any]]:
    """Run `run_id`'s tasks grouped by (phase, kind, status), in that order: {"phase", "kind",
    "status", "n", the summed row outcomes "imported", "matched", "already_here", "updated",
    "skipped", "waiting", "failed", "seen", "source_total" (the largest a task recorded), "first_started",
    "last_finished"} (named query `rollup_tasks`)."""
    return db.fetch_all("rollup_tasks", {"run_id": run_id})


def open_task_counts(db: Database, run_id: int) -> dict[str, int]:
    """Run `run_id`'s open tasks: {"running", "enqueued" (pending and enqueued: claimable now),
    "pending" (enqueued or not)}; zeros when it has none."""
    row = db.fetch_one("inflight_count", {"run_id": run_id}) or {}
    return {k: int(row.get(k) or 0) for k in ("running", "enqueued", "pending")}


def idle_seconds(db: Database, run_id: int) -> float:
    """Seconds since anything worked on run `run_id`: its heartbeat, its tasks' checkpoints and
    finishes, the lock keeper's renewals (named query `run_idle_seconds`)."""
    return float(db.fetch_one("run_idle_seconds", {"run_id": run_id})["idle_seconds"])


def run_cost(db: Database, run_id: int) -> dict[str, int]:
    """What run `run_id` spent at the source, as its tasks counted it: {"requests", "tokens"}."""
    row = db.fetch_one("run_cost", {"run_id": run_id}) or {}
    return {"requests": int(row.get("requests") or 0), "tokens": int(row.get("tokens") or 0)}


def latest_statuses(db: Database, source: str, tenants: list[str]) -> dict[str, str]:
    """Each of `tenants`' latest run of `source` that is not a dry run: {tenant: its status}; a
    tenant without one is absent."""
    return {r["tenant_id"]: r["status"] for r in db.fetch_all("latest_status_per_tenant",
                                                              {"source": source, "tenants": tenants})}


def only_dry_runs(db: Database, tenant: str) -> bool:
    """Whether every run started for `tenant` (of any source) is a dry run, which writes nothing to
    the ledger: `explain` and `rows` then have nothing to tell and say why. False for a tenant
    without runs."""
    rows = db.sql("SELECT bool_and(dry_run) AS dry FROM migrations WHERE tenant_id = %(t)s", {"t": tenant})
    return bool(rows and rows[0]["dry"])


def kinds_taken(db: Database, tenant: str, source: str, *, succeeded_only: bool = False) -> set[str]:
    """The kinds in the plan of any run of `source` started for `tenant`, dry runs aside (with
    `succeeded_only`, of its succeeded runs and syncs alone); the catch-up kind included. What the
    tenant holds is what its runs took together: a kind run alone later (`--kinds deal_history`)
    adds to the earlier runs' kinds, it does not replace them."""
    rows = db.sql("SELECT DISTINCT k.kind FROM migrations m, jsonb_array_elements(m.plan) g,"
                  " jsonb_array_elements_text(g) AS k(kind)"
                  " WHERE m.tenant_id = %(t)s AND m.source = %(s)s AND NOT m.dry_run"
                  " AND (NOT %(ok)s OR m.status = 'succeeded')",
                  {"t": tenant, "s": source, "ok": succeeded_only})
    return {r["kind"] for r in rows}


def kind_count(db: Database, run_id: int, kind: str) -> dict[str, int | None]:
    """One kind's count as run `run_id` knows it so far: {"source_total": the source's own count its
    discovery recorded (None when none did), "seen": the rows its tasks saw}."""
    row = db.fetch_one("kind_count", {"run_id": run_id, "kind": kind}) or {}
    total = row.get("source_total")
    return {"source_total": None if total is None else int(total), "seen": int(row.get("seen") or 0)}
