"""Helpers for the Pipedrive provider's tests: a sandbox over a real socket, runs drained by real
threads against a real Postgres database, and the ledger read back for reconciliation."""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from engine_core import db as dbmod
from engine_core import rollup, runs
from engine_core.config import Settings
from engine_core.models import Run
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_BURST_LIMIT, ENV_TOKEN
from engine_core.worker import Worker, drain_threads
from engine_core.providers.registry import for_run
from pipedrive_sandbox.config import SandboxConfig
from pipedrive_sandbox.server import SandboxServer

TOKEN = "sandbox-tok-7f3a9c1e55b2d840"
FAST = Settings(lane_width=4, stale_lock_seconds=1800, heartbeat_seconds=0.0, retry_backoff_seconds=0.0)
UNLIMITED = 100_000  # a burst limit no test reaches: tests measure behaviour, not pacing

# truth name -> ledger kind, and ledger kind -> crm table
LEDGER_KIND = {
    "users": "users",
    "pipelines": "pipelines",
    "stages": "stages",
    "organizations": "organizations",
    "persons": "persons",
    "deals": "deals",
    "deals_archived": "deals_archived",
    "leads": "leads",
    "leads_archived": "leads_archived",
    "activities": "activities",
    "notes": "notes",
    "mail_messages": "emails",
}
# One ledger identity per source record, whichever list served it (active or archived).
IDENTITY = {"deals_archived": "deals", "leads_archived": "leads"}


def ledger_truth(truth: dict[str, Any]) -> dict[str, set[str]]:
    """The source's ids per ledger kind: archived deals and leads fold into deals and leads."""
    out: dict[str, set[str]] = {}
    ids = dict(truth["ids"])
    ids["mail_messages"] = [m for msgs in truth["deals_with_mail"].values() for m in msgs]
    for name, kind in LEDGER_KIND.items():
        out.setdefault(IDENTITY.get(kind, kind), set()).update(str(i).lower() for i in ids[name])
    return out


def ledger_counts(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Task-kind counters (kind_counts) summed per ledger kind."""
    out: dict[str, dict[str, int]] = {}
    for kind, c in counts.items():
        k = out.setdefault(IDENTITY.get(kind, kind), {n: 0 for n in c})
        for n, v in c.items():
            k[n] = k.get(n, 0) + v
    return out


TABLE = {
    "users": "users",
    "pipelines": "pipelines",
    "stages": "stages",
    "organizations": "companies",
    "persons": "contacts",
    "deals": "deals",
    "deals_archived": "deals",
    "leads": "leads",
    "leads_archived": "leads",
    "activities": "activities",
    "notes": "notes",
    "emails": "emails",
}


@contextmanager
def sandbox(**changes: Any) -> Iterator[SandboxServer]:
    """A sandbox in a thread of this process; env points the provider at it, and a provider made
    without a `burst_limit` option (verify's, say) paces its requests at UNLIMITED, as the
    runs of `start` and `sync` do: the 80 per 2 s default spaced a tiny account's verify 25 ms a
    request (6-8 s). A test of pacing passes its `burst_limit` option, which the variable never overrides."""
    options: dict[str, Any] = {"scale": "tiny", "seed": 1, "token": TOKEN, "burst_limit": UNLIMITED}
    options.update(changes)
    with SandboxServer(SandboxConfig(**options)) as sb:
        old = {k: os.environ.get(k) for k in (ENV_BASE_URL, ENV_TOKEN, ENV_BURST_LIMIT)}
        os.environ[ENV_BASE_URL] = sb.base_url
        os.environ[ENV_TOKEN] = options["token"]
        os.environ[ENV_BURST_LIMIT] = str(UNLIMITED)
        try:
            yield sb
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def start(db: dbmod.Database, sb: SandboxServer, tenant: str = "acme", **kwargs: Any) -> Run:
    options = {"base_url": sb.base_url, "burst_limit": UNLIMITED, **kwargs.pop("options", {})}
    return runs.start_run(db, PipedriveProvider(base_url=sb.base_url), tenant, options=options, settings=FAST, **kwargs)


def migrate(db: dbmod.Database, sb: SandboxServer, tenant: str = "acme", *, width: int = 4, **kwargs: Any) -> Run:
    """Start a run and drain it with `width` lane threads until nothing is left."""
    run = start(db, sb, tenant, **kwargs)
    drain_threads(db, run.id, width=width, settings=FAST, providers=for_run)
    return runs.get_run(db, run.id)


def ledger(db: dbmod.Database, tenant: str, kind: str) -> dict[str, dict[str, Any]]:
    rows = db.sql(
        "SELECT source_id, action, reason, record_id, migration_id, dangling FROM migration_records"
        " WHERE tenant_id = %(t)s AND source = 'pipedrive' AND kind = %(k)s",
        {"t": tenant, "k": kind},
    )
    return {r["source_id"]: r for r in rows}


def actions(entries: dict[str, dict[str, Any]], *wanted: str) -> set[str]:
    return {sid for sid, r in entries.items() if r["action"] in wanted}


def kind_counts(db: dbmod.Database, run_id: int) -> dict[str, dict[str, int]]:
    """Per kind: the rollup's counters summed over the run's tasks."""
    out: dict[str, dict[str, int]] = {}
    for r in db.fetch_all("rollup_tasks", {"run_id": run_id}):
        k = out.setdefault(r["kind"], {c: 0 for c in ("imported", "matched", "already_here", "skipped", "waiting", "failed",
                                                      "seen")})
        for c in k:
            k[c] += int(r[c])
    return out


def settled_counts(db: dbmod.Database, run_id: int) -> dict[str, dict[str, int]]:
    """Per kind: its tasks' counters (kind_counts) plus what the run's catch-up counted for the kind
    ("<counter>@<kind>", the rollup's `caught_up`): a row its phase left waiting for the catch-up's
    walk is counted where it was settled, so per ledger kind these add up to the ledger."""
    out = kind_counts(db, run_id)
    for k in rollup.rollup(db, run_id).kinds:
        mine = out.get(k.kind)
        if mine is None:
            continue
        for c in mine:
            mine[c] += int(k.caught_up.get(c, 0))
    return out


def statuses(db: dbmod.Database, run_id: int) -> dict[str, int]:
    rows = db.sql("SELECT status, count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s GROUP BY status", {"r": run_id})
    return {r["status"]: r["n"] for r in rows}


def failed_tasks(db: dbmod.Database, run_id: int) -> list[dict[str, Any]]:
    return db.sql("SELECT kind, cursor_key, error FROM migration_tasks WHERE migration_id = %(r)s AND status = 'failed'", {"r": run_id})


def migrated_rollup(db: dbmod.Database, sb: SandboxServer, tenant: str) -> tuple[Run, Any, dict[str, Any], dict[str, Any]]:
    """A full run of `tenant` (`migrate`) that succeeded with its figures complete: (the run, its
    rollup, the rollup's kinds by name, `ledger_reads.bad_row_counts` of the tenant)."""
    from engine_core import ledger_reads

    run = migrate(db, sb, tenant)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    return run, r, {k.kind: k for k in r.kinds}, ledger_reads.bad_row_counts(db, tenant)



# --- live changes, then a sync: the field reports' shapes ------------------------------------------


def sync(db: dbmod.Database, sb: SandboxServer, tenant: str = "acme") -> Run:
    """A sync of the tenant, drained by four lane threads; asserts it succeeded."""
    opts = {"base_url": sb.base_url, "burst_limit": UNLIMITED}
    started = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), tenant, options=opts, settings=FAST)
    drain_threads(db, started.id, width=4, settings=FAST, providers=for_run)
    done = runs.get_run(db, started.id)
    assert done.status == "succeeded", failed_tasks(db, done.id)
    return done


def live_op(sb: SandboxServer, op: str) -> dict[str, Any]:
    """Apply one live change of this op now (the sandbox's `live_mix` forced to it); the change."""
    sb.configure(live_mix=f"{op}:1")
    (change,) = sb.live_step(1)
    assert change["op"] == op, change
    return change


def product_row(db: dbmod.Database, table: str, source_id: Any, tenant: str = "acme") -> dict[str, Any]:
    """The one crm.<table> row of a source id (asserts there is exactly one)."""
    rows = db.sql(f"SELECT * FROM crm.{table} WHERE tenant_id = %(t)s AND source = 'pipedrive' AND source_id = %(s)s",
                  {"t": tenant, "s": str(source_id)})
    assert len(rows) == 1, (table, source_id, rows)
    return rows[0]


def history(db: dbmod.Database, run_id: int, kind: str, source_id: Any, tenant: str = "acme") -> list[dict[str, Any]]:
    """The ledger history rows a run wrote for one source row."""
    return db.sql("SELECT h.* FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                  " WHERE h.migration_id = %(r)s AND r.tenant_id = %(t)s AND r.kind = %(k)s AND r.source_id = %(s)s",
                  {"r": run_id, "t": tenant, "k": kind, "s": str(source_id)})

# --- a worker process for the crash test ---------------------------------------------------------


def email_worker_that_pauses(url: str, run_id: int, big_deal: int, pause_after_windows: int, ready: Any) -> None:
    """Drain a run in this (child) process; after N full windows of the big deal's messages have
    committed, signal `ready` and wait to be killed - a worker caught mid-deal, between windows."""
    from engine_core.providers.pipedrive import emails

    original = emails.EmailTask.write_window
    seen = {"windows": 0}

    def write_window(self: emails.EmailTask) -> None:
        window = list(self.ready_bodies)[: self.ctx.window]
        full = len(window) == self.ctx.window and all(self.deals[r.deal] == big_deal for r in window)
        original(self)
        if full:
            seen["windows"] += 1
            if seen["windows"] >= pause_after_windows:
                ready.set()
                time.sleep(600)  # the parent SIGKILLs us here

    emails.EmailTask.write_window = write_window  # type: ignore[method-assign]
    database = dbmod.Database(url, max_size=4)
    Worker(database, settings=FAST, providers=for_run).drain(run_id)


def seed_deals_as_imported(db: dbmod.Database, tenant: str, truth: dict[str, Any]) -> None:
    """An earlier run imported every deal: target rows and their ledger claims (bulk, for speed)."""
    prior = db.sql(
        "INSERT INTO migrations (tenant_id, source, source_account, status, plan, finished_at)"
        " VALUES (%(t)s, 'pipedrive', 'earlier', 'succeeded', '[]'::jsonb, now()) RETURNING id",
        {"t": tenant},
    )[0]["id"]
    for kind in ("deals", "deals_archived"):
        ids = [str(i) for i in truth["ids"][kind]]
        db.sql(
            "WITH made AS (INSERT INTO crm.deals (tenant_id, title, archived, source, source_id)"
            "   SELECT %(t)s, 'Deal ' || sid, %(archived)s, 'pipedrive', sid FROM unnest(%(ids)s::text[]) AS sid"
            "   RETURNING id, source_id)"
            " INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action)"
            " SELECT %(run)s, %(t)s, 'pipedrive', %(kind)s, source_id, 'crm.deals', id, 'created' FROM made",
            {"t": tenant, "ids": ids, "kind": kind, "run": prior, "archived": kind == "deals_archived"},
        )


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
