"""A run's life: admission, start, stop, retry, resume.

Admission is fenced by a partial unique index (one live run per tenant and source), so fifty
concurrent starts admit exactly one, and retry/resume pass the same check when they reopen a run.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from engine_core.config import Settings
from engine_core.db import Database
from engine_core.errors import AdmissionRefused, NothingToDo, RunNotFound
from engine_core.models import Run
from engine_core.plan import plan_for
from engine_core.planner import advance_phase, seed_phase, top_up
from engine_core.providers.base import Provider, dependents, identity_of


def get_run(db: Database, run_id: int) -> Run:
    row = db.fetch_one("get_run", {"run_id": run_id})
    if row is None:
        raise RunNotFound(f"no migration run #{run_id}")
    return Run.from_row(row)


def live_run(db: Database, tenant_id: str, source: str) -> Run | None:
    row = db.fetch_one("live_run_for_tenant", {"tenant_id": tenant_id, "source": source})
    return Run.from_row(row) if row else None


def latest_run(db: Database, tenant_id: str, source: str | None = None) -> Run:
    row = db.fetch_one("latest_run_for_tenant", {"tenant_id": tenant_id, "source": source})
    if row is None:
        raise RunNotFound(f"tenant {tenant_id!r} has no migration run")
    return Run.from_row(row)


def _refuse(db: Database, tenant_id: str, source: str) -> AdmissionRefused:
    other = live_run(db, tenant_id, source)
    if other is None:
        return AdmissionRefused(f"another run of {source} for tenant {tenant_id!r}")
    return AdmissionRefused(other.name, other.id)


def start_run(
    db: Database,
    provider: Provider,
    tenant_id: str,
    *,
    kinds: Iterable[str] | None = None,
    dry_run: bool = False,
    options: dict[str, Any] | None = None,
    settings: Settings | None = None,
) -> Run:
    """Admit a new run, seed its first phase and put it on the lane."""
    settings = settings or Settings.from_env()
    plan = plan_for(provider.phases(), kinds)
    identity = identity_of(provider)  # before the transaction: it may ask the source
    try:
        with db.transaction() as tx:
            row = tx.fetch_one(
                "insert_run",
                {
                    "tenant_id": tenant_id,
                    "source": provider.source,
                    "source_account": provider.account(),
                    "source_identity": identity,
                    "plan": Jsonb(plan),
                    "options": Jsonb(options or {}),
                    "dry_run": dry_run,
                },
            )
            assert row is not None
            run = Run.from_row(row)
            seed_phase(tx, run, 0, provider)
    except pg_errors.UniqueViolation:
        raise _refuse(db, tenant_id, provider.source) from None
    top_up(db, run.id, settings)
    advance_phase(db, run.id, 0, provider, settings)  # a phase that seeded nothing closes at once
    return get_run(db, run.id)


def start_or_join(db: Database, provider: Provider, tenant_id: str, **kwargs: Any) -> tuple[Run, bool]:
    """The live run of the tenant if there is one, else a new one; (run, started)."""
    for _ in range(3):
        current = live_run(db, tenant_id, provider.source)
        if current is not None:
            return current, False
        try:
            return start_run(db, provider, tenant_id, **kwargs), True
        except AdmissionRefused:
            continue  # lost a race to another starter: join theirs
    raise _refuse(db, tenant_id, provider.source)


def stop(db: Database, run_id: int) -> Run:
    """Set the stop flag (checked before every claim) and cancel what has not started."""
    with db.transaction() as tx:
        tx.fetch_one("request_stop", {"run_id": run_id})
        tx.execute("cancel_pending_tasks", {"run_id": run_id})
    db.fetch_one("settle_stop", {"run_id": run_id})
    return get_run(db, run_id)


def _reopen(db: Database, run_id: int, statuses: list[str], provider: Provider, settings: Settings) -> Run:
    run = get_run(db, run_id)
    try:
        with db.transaction() as tx:
            if run.terminal:
                tx.fetch_one("reopen_run", {"run_id": run_id})
            rearmed = tx.fetch_all("rearm_tasks", {"run_id": run_id, "statuses": statuses})
            phases = [r["phase"] for r in rearmed]
            stopped_between_phases = run.status == "stopped" and run.current_phase < len(run.plan)
            if not phases and not stopped_between_phases:
                raise NothingToDo(f"{run.name} has no {' or '.join(statuses)} tasks")
            if phases:
                earliest = min(phases)
                tx.fetch_one("rewind_barrier", {"run_id": run_id, "phase": earliest})
                failed_kinds = {r["kind"] for r in rearmed if r["status"] == "failed"}
                if failed_kinds:
                    # rows skipped behind the failed pages get their parents now: revisit the later
                    # tasks of kinds that depend on them (and skipped something)
                    kinds = dependents(provider, failed_kinds, run.kinds)
                    tx.fetch_all("revisit_tasks", {"run_id": run_id, "phase": earliest, "kinds": sorted(kinds)})
                tx.execute("unqueue_later_phases", {"run_id": run_id, "phase": earliest})
    except pg_errors.UniqueViolation:
        raise _refuse(db, run.tenant_id, run.source) from None
    top_up(db, run_id, settings)
    # a stop that landed as a phase emptied held the barrier; reopened, the phase can close now
    current = get_run(db, run_id)
    advance_phase(db, run_id, current.current_phase, provider, settings)
    return get_run(db, run_id)


def retry(db: Database, run_id: int, provider: Provider, settings: Settings | None = None) -> Run:
    """Re-arm failed (and a stopped run's cancelled) tasks and rewind the barrier to the earliest of
    them; later-phase tasks that skipped rows run again so the skipped rows can link to their parents
    (rows they wrote are recognised through the ledger, not written again)."""
    settings = settings or Settings.from_env()
    run = get_run(db, run_id)
    statuses = ["failed", "cancelled"] if run.status == "stopped" else ["failed"]
    return _reopen(db, run_id, statuses, provider, settings)


def resume(db: Database, run_id: int, provider: Provider, settings: Settings | None = None) -> Run:
    """Re-arm a stopped run's cancelled tasks; checkpoints make them resume where they were."""
    settings = settings or Settings.from_env()
    return _reopen(db, run_id, ["cancelled"], provider, settings)
