"""The run page as queries: the rollup, the duration-by-payload diagnosis, and one row's story."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from engine_core.db import Database
from engine_core.errors import RunNotFound
from engine_core.models import Run

COUNTERS = ("imported", "matched", "already_here", "skipped", "failed")


@dataclass
class KindRollup:
    kind: str
    phase: int
    tasks: dict[str, int] = field(default_factory=dict)
    seen: int = 0
    imported: int = 0
    matched: int = 0
    already_here: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass
class RunRollup:
    run_id: int
    name: str
    tenant_id: str
    source: str
    status: str
    dry_run: bool
    current_phase: int
    phases: list[list[str]]
    tasks: dict[str, int]
    kinds: list[KindRollup]
    reasons: list[dict[str, Any]]
    started_at: datetime | None
    finished_at: datetime | None
    seconds: float | None

    def phase_kinds(self, phase: int) -> list[KindRollup]:
        return [k for k in self.kinds if k.phase == phase]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("started_at", "finished_at"):
            d[key] = d[key].isoformat() if d[key] else None
        return d


def rollup(db: Database, run_id: int) -> RunRollup:
    row = db.fetch_one("get_run", {"run_id": run_id})
    if row is None:
        raise RunNotFound(f"no migration run #{run_id}")
    run = Run.from_row(row)
    kinds: dict[str, KindRollup] = {}
    for i, group in enumerate(run.plan):
        for k in group:
            kinds[k] = KindRollup(kind=k, phase=i)
    tasks: dict[str, int] = defaultdict(int)
    for r in db.fetch_all("rollup_tasks", {"run_id": run_id}):
        kr = kinds.setdefault(r["kind"], KindRollup(kind=r["kind"], phase=r["phase"]))
        kr.tasks[r["status"]] = kr.tasks.get(r["status"], 0) + r["n"]
        tasks[r["status"]] += r["n"]
        kr.seen += int(r["seen"])
        for c in COUNTERS:
            setattr(kr, c, getattr(kr, c) + int(r[c]))
    end = row["finished_at"] or datetime.now(row["started_at"].tzinfo)
    return RunRollup(
        run_id=run.id,
        name=run.name,
        tenant_id=run.tenant_id,
        source=run.source,
        status=run.status,
        dry_run=run.dry_run,
        current_phase=run.current_phase,
        phases=[list(g) for g in run.plan],
        tasks=dict(tasks),
        kinds=list(kinds.values()),
        reasons=grouped_reasons(db, run_id, row["log"]),
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        seconds=(end - row["started_at"]).total_seconds() if row["started_at"] else None,
    )


def grouped_reasons(db: Database, run_id: int, log_entries: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Failure reasons grouped by kind and reason: the log's sample plus failed tasks' errors."""
    if log_entries is None:
        row = db.fetch_one("get_run", {"run_id": run_id})
        log_entries = row["log"] if row else []
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for e in log_entries or []:
        key = (e.get("kind", ""), e.get("reason", ""))
        g = groups.setdefault(key, {"kind": key[0], "reason": key[1], "count": 0, "samples": []})
        g["count"] += int(e.get("count", 1))
        for s in e.get("samples", []):
            if len(g["samples"]) < 5 and s not in g["samples"]:
                g["samples"].append(s)
    return sorted(groups.values(), key=lambda g: -g["count"])


def duration_by_payload(db: Database, run_id: int, *, kind: str | None = None, stat: str = "imported", top: int = 3) -> list[dict[str, Any]]:
    """Task duration grouped by the task's own payload (the seed's first diagnostic query)."""
    return db.fetch_all("duration_by_payload", {"run_id": run_id, "kind": kind, "stat": stat, "top": top})


def explain(db: Database, tenant_id: str, kind: str, source_id: str, source: str | None = None) -> dict[str, Any] | None:
    """What happened to one source row, from the ledger."""
    row = db.fetch_one("explain_record", {"tenant_id": tenant_id, "kind": kind, "source_id": str(source_id), "source": source})
    if row is None:
        return None
    return {
        "tenant_id": row["tenant_id"],
        "source": row["source"],
        "kind": row["kind"],
        "source_id": row["source_id"],
        "action": row["action"],
        "reason": row["reason"],
        "record_type": row["record_type"],
        "record_id": row["record_id"],
        "run_id": row["migration_id"],
        "run_status": row["run_status"],
        "at": row["created_at"].isoformat(),
    }
