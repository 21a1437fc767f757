"""A tenant named on the command line, looked up once: an unknown one is the same line from every
command (`status`, `report`, `explain`, `rows`, `stop`, `retry`, `resume`, `verify`, `sync`),
naming the tenants there are."""
from __future__ import annotations

from typing import Any

from engine_core import db as dbmod
from engine_core import runs, runs_reads
from engine_core.errors import EngineError, RunNotFound
from migration_pipeline.cli.output import fail

SHOWN = 20  # tenants named in the line; more are counted


def known_tenant(db: dbmod.Database, tenant: str) -> None:
    """One line and exit 2 when no run (of any source, any mode) was ever started for `tenant`:
    "no tenant 'nosuch' (tenants: acme, demo)", the first SHOWN of them, or "none: no run has been
    started"."""
    tenants = runs_reads.tenants(db)
    if tenant not in tenants:
        shown = ", ".join(tenants[:SHOWN]) + (f", ... ({len(tenants)} in all)" if len(tenants) > SHOWN else "")
        fail(f"no tenant {tenant!r} (tenants: {shown or 'none: no run has been started'})")


def tenant_run(db: dbmod.Database, tenant: str, source: str | None) -> Any:
    """TENANT's latest engine run (of `source`, when given): one read when it has one (its run
    proves the tenant known). One line and exit 2 when it has none: an unknown tenant, `known_tenant`'s
    line naming the tenants there are; a tenant with runs of other sources only, `runs.latest_run`'s."""
    try:
        return runs.latest_run(db, tenant, source)
    except RunNotFound as e:
        known_tenant(db, tenant)
        fail(e)
    except EngineError as e:
        fail(e)
