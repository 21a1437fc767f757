"""The chaos harness shared by tests/chaos and bench/chaos.py: drainer processes over a faulty
sandbox, a seeded chaos thread that SIGKILLs them and terminates database backends, a periodic
reaper, and a reconciliation of every kind of every tenant against the sandbox's truth and a
fault-free run of the same account.

Shapes:
* `ChaosConfig` - everything one chaos run depends on; `seed` makes its schedule reproducible
  (the intervals, the victims among those alive; wall-clock interleavings are not).
* `run_chaos(config, db_url, workdir)` -> `ChaosResult` with `figures` (kills, terminations, lost,
  duplicated, refetched bodies, wall time...) and `problems` (one line per defect found; empty
  when the run is clean). It never raises for a defect of the engine: it reports it.
* `python -m tests.chaos.support drain <db_url> <run_id> <name>` - one drainer process (what a
  Dagster drainer run does): `drain_threads` with the lane width from MIGRATE_LANE_WIDTH until the
  run is terminal. It exits 0 then, non-zero when the engine raised (a terminated backend, say).

Every database connection of the harness's processes carries an `application_name`
(`chaos-drainer-N`, `chaos-reaper`, `chaos-harness`), so the chaos thread terminates only the
backends of the processes under test and never the harness's own.
"""
from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from psycopg import conninfo

from engine_core import db as dbmod
from engine_core import reaper, runs
from engine_core.config import Settings
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.providers.pipedrive.settings import ENV_BASE_URL, ENV_TOKEN
from engine_core.worker import drain_threads
from engine_core.providers.registry import for_run
from pipedrive_sandbox.config import SandboxConfig
from pipedrive_sandbox.server import start_subprocess

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "chaos-tok-" + "5e1d0c4b9a"  # a sandbox token; never a real one
UNLIMITED = 100_000  # a burst limit no run reaches: chaos measures loss, not pacing
BASELINE_TENANT = "calm"
FAULTS = "503:0.03,500:0.02,drop:0.01,badjson:0.01"

# truth name -> ledger kind; kinds of one identity group share one source id space (a deal listed
# active or archived is one source record: it must have one ledger entry across the group)
LEDGER_KIND = {
    "users": "users", "pipelines": "pipelines", "stages": "stages", "organizations": "organizations",
    "persons": "persons", "deals": "deals", "deals_archived": "deals_archived", "leads": "leads",
    "leads_archived": "leads_archived", "activities": "activities", "notes": "notes", "mail_messages": "emails",
}
IDENTITY_GROUPS = {
    "users": ("users",), "pipelines": ("pipelines",), "stages": ("stages",), "organizations": ("organizations",),
    "persons": ("persons",), "deals": ("deals", "deals_archived"), "leads": ("leads", "leads_archived"),
    "activities": ("activities",), "notes": ("notes",), "emails": ("emails",),
}


def with_app(url: str, app: str, dbname: str | None = None) -> str:
    """`url` with its application_name (and optionally its database) replaced."""
    params = conninfo.conninfo_to_dict(url)
    params["application_name"] = app
    if dbname:
        params["dbname"] = dbname
    return conninfo.make_conninfo(**params)


@dataclass(frozen=True)
class ChaosConfig:
    """One chaos run. Seconds are wall-clock seconds; `kill_every`/`terminate_every` are (min, max)
    of the uniform gap between two strikes; chaos stops striking after `chaos_seconds` and the runs
    must then finish within `timeout` seconds of the start (else the result names the stuck tasks)."""

    seed: int
    scale: str = "tiny"
    tenants: int = 2
    drainers: int = 3
    width: int = 2
    faults: str = FAULTS
    latency: str = "realistic:0.1"
    kill_every: tuple[float, float] = (3.0, 6.0)
    terminate_every: tuple[float, float] = (1.0, 3.0)
    terminate_at_most: int = 2
    strike_busy: float = 0.75  # share of terminations aimed at a drainer that holds a task
    chaos_seconds: float = 40.0
    stale_lock_seconds: float = 5.0
    reaper_every: float = 1.0
    timeout: float = 150.0
    baseline_width: int = 4


@dataclass
class ChaosResult:
    seed: int
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    task_states: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.problems

    def summary(self, limit: int = 60) -> str:
        lines = [f"chaos seed {self.seed}: " + ", ".join(f"{k} {v}" for k, v in self.figures.items())]
        lines += [f"  run {name}: {states}" for name, states in self.task_states.items()]
        lines += [f"  PROBLEM {p}" for p in self.problems[:limit]]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more problems")
        return "\n".join(lines)


class Sandbox:
    """The sandbox subprocess over HTTP (its own interpreter, so it shares no GIL with the harness)."""

    def __init__(self, config: SandboxConfig) -> None:
        self.proc, self.base_url = start_subprocess(config)
        self.http = httpx.Client(base_url=self.base_url, timeout=60)

    def stats(self) -> dict[str, Any]:
        return self.http.get("/_sandbox/stats").json()

    def truth(self) -> dict[str, Any]:
        return self.http.get("/_sandbox/truth").json()

    def reset_stats(self) -> None:
        self.http.post("/_sandbox/stats/reset").raise_for_status()

    def configure(self, **changes: Any) -> None:
        self.http.post("/_sandbox/config", json=changes).raise_for_status()

    def close(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def drainer_env(config: ChaosConfig, base_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        ENV_BASE_URL: base_url, ENV_TOKEN: TOKEN,
        "MIGRATE_LANE_WIDTH": str(config.width),
        "MIGRATE_STALE_LOCK_SECONDS": str(config.stale_lock_seconds),
        "MIGRATE_HEARTBEAT_SECONDS": "1",
        "MIGRATE_RETRY_BACKOFF_SECONDS": "0.2",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
    })
    return env


@dataclass
class Drainer:
    name: str
    run_id: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    killed: bool = False

    def tail(self, n: int = 6) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [ln for ln in lines if "retry" not in ln]  # the client's retry chatter is expected
        return " | ".join(keep[-n:])


class Chaos:
    """Drainer processes for the runs, replaced when they die; a seeded thread that kills them and
    terminates backends; a reaper thread. All events are logged with their time since start."""

    def __init__(self, config: ChaosConfig, db_url: str, run_ids: list[int], base_url: str, workdir: Path,
                 harness: dbmod.Database) -> None:
        self.config = config
        self.db_url = db_url
        self.run_ids = run_ids
        self.env = drainer_env(config, base_url)
        self.workdir = workdir
        self.harness = harness
        self.rng = random.Random(config.seed)
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.exits: list[tuple[float, str]] = []  # (seconds since start, "drainer-N of run R: cause")
        self.drainers: list[Drainer] = []
        self.retired: list[Drainer] = []
        self.events: list[str] = []
        self.counts: Counter[str] = Counter()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.serial = 0
        self.dbname = conninfo.conninfo_to_dict(db_url)["dbname"]

    # -- events ----------------------------------------------------------------------------
    def event(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.2f}s] {text}"
        with self.lock:
            self.events.append(line)
        print("chaos " + line, flush=True)

    # -- drainers --------------------------------------------------------------------------
    def spawn(self, run_id: int, why: str) -> Drainer:
        with self.lock:
            self.serial += 1
            name = f"drainer-{self.serial}"
        log_path = self.workdir / f"{name}.log"
        url = with_app(self.db_url, f"chaos-{name}")
        out = open(log_path, "wb")
        proc = subprocess.Popen([sys.executable, "-m", "tests.chaos.support", "drain", url, str(run_id), name],
                                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        d = Drainer(name, run_id, proc, log_path, time.monotonic())
        with self.lock:
            self.drainers.append(d)
        self.event(f"start {name} pid {proc.pid} for run {run_id} ({why})")
        return d

    def start(self) -> None:
        for i in range(self.config.drainers):
            self.spawn(self.run_ids[i % len(self.run_ids)], "initial")
        self.threads = [threading.Thread(target=self._chaos_loop, name="chaos", daemon=True),
                        threading.Thread(target=self._reaper_loop, name="chaos-reaper", daemon=True)]
        for t in self.threads:
            t.start()

    def run_live(self, run_id: int) -> bool:
        row = self.harness.fetch_one("get_run", {"run_id": run_id})
        return bool(row and row["status"] in ("running", "stopping"))

    def supervise(self) -> None:
        """Replace drainers that exited while their run is live (a crash, not the end of the run)."""
        for d in list(self.drainers):
            rc = d.proc.poll()
            if rc is None:
                continue
            with self.lock:
                self.drainers.remove(d)
                self.retired.append(d)
            if d.killed:
                continue  # the chaos thread already replaced it
            live = self.run_live(d.run_id)
            if rc != 0:
                self.counts["drainer_crashes"] += 1
                self.exits.append((time.monotonic() - self.t0, f"{d.name} of run {d.run_id} exited rc={rc}"))
                self.event(f"{d.name} pid {d.proc.pid} exited rc={rc} (run {d.run_id} live={live}): {d.tail(3)}")
            if live:
                self.spawn(d.run_id, f"replaces {d.name}")

    def held_tasks(self, pid: int) -> list[str]:
        rows = self.harness.sql(
            "SELECT id, kind, cursor_key FROM migration_tasks WHERE status = 'running' AND locked_by LIKE %(p)s ORDER BY id",
            {"p": f"%:{pid}:%"},
        )
        return [f"#{r['id']} {r['kind']}:{r['cursor_key']}" for r in rows]

    def kill_one(self) -> None:
        alive = [d for d in self.drainers if d.proc.poll() is None and not d.killed]
        if not alive:
            return
        victim = self.rng.choice(alive)
        held = self.held_tasks(victim.proc.pid)
        victim.killed = True
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        self.counts["kills"] += 1
        self.exits.append((time.monotonic() - self.t0, f"{victim.name} of run {victim.run_id} SIGKILLed holding {held or 'nothing'}"))
        self.event(f"SIGKILL {victim.name} pid {victim.proc.pid} (run {victim.run_id}) holding {held or 'nothing'}")
        if self.run_live(victim.run_id):
            self.spawn(victim.run_id, f"replaces {victim.name}")

    def terminate_some(self) -> None:
        rows = self.harness.sql(
            "SELECT pid, application_name, state, left(query, 60) AS query FROM pg_stat_activity"
            " WHERE datname = %(d)s AND pid <> pg_backend_pid()"
            "   AND application_name LIKE 'chaos-%%' AND application_name <> 'chaos-harness' ORDER BY pid",
            {"d": self.dbname},
        )
        if not rows:
            return
        # Mostly strike a process that holds work: a backend dying under a busy drainer is the case
        # that loses rows (a sibling lane's task), an idle one only costs a restart.
        busy = {f"chaos-{d.name}" for d in list(self.drainers) if d.proc.poll() is None and self.held_tasks(d.proc.pid)}
        pool = [r for r in rows if r["application_name"] in busy]
        if not pool or self.rng.random() >= self.config.strike_busy:
            pool = rows
        k = self.rng.randint(1, min(self.config.terminate_at_most, len(pool)))
        for r in self.rng.sample(pool, k):
            done = self.harness.sql("SELECT pg_terminate_backend(%(p)s) AS ok", {"p": r["pid"]})[0]["ok"]
            if done:
                self.counts["terminations"] += 1
                self.exits.append((time.monotonic() - self.t0, f"backend {r['pid']} of {r['application_name']} terminated"))
                self.event(f"pg_terminate_backend {r['pid']} of {r['application_name']} ({r['state']}: {r['query']!r})")

    def _chaos_loop(self) -> None:
        lo_k, hi_k = self.config.kill_every
        lo_t, hi_t = self.config.terminate_every
        now = time.monotonic()
        next_kill = now + self.rng.uniform(lo_k, hi_k)
        next_term = now + self.rng.uniform(lo_t, hi_t)
        while not self.stop.is_set():
            try:
                self.supervise()
                now = time.monotonic()
                striking = now - self.t0 < self.config.chaos_seconds
                if striking and now >= next_kill:
                    self.kill_one()
                    next_kill = now + self.rng.uniform(lo_k, hi_k)
                if striking and now >= next_term:
                    self.terminate_some()
                    next_term = now + self.rng.uniform(lo_t, hi_t)
            except Exception as e:  # the harness must outlive a hiccup of its own connection
                self.event(f"chaos thread error: {type(e).__name__}: {e}")
            self.stop.wait(0.1)

    def _reaper_loop(self) -> None:
        settings = Settings(lane_width=self.config.width, stale_lock_seconds=self.config.stale_lock_seconds,
                            heartbeat_seconds=1.0, retry_backoff_seconds=0.2)
        db = dbmod.Database(with_app(self.db_url, "chaos-reaper"), max_size=2)
        try:
            while not self.stop.wait(self.config.reaper_every):
                try:
                    report = reaper.sweep(db, settings, providers=for_run)
                except Exception as e:  # a sensor tick that failed; the next one retries
                    self.counts["reaper_errors"] += 1
                    self.event(f"reaper tick failed: {type(e).__name__}: {str(e)[:120]}")
                    continue
                self.counts["released"] += len(report.released)
                if not report.quiet:
                    self.event(f"reaper released {report.released} advanced {report.advanced} finalized {report.finalized}")
        finally:
            db.close()

    def shutdown(self) -> None:
        self.stop.set()
        for t in getattr(self, "threads", []):
            t.join(30)
        for d in self.drainers:
            if d.proc.poll() is None:
                d.proc.terminate()
        for d in self.drainers:
            try:
                d.proc.wait(15)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()


# -- reconciliation --------------------------------------------------------------------------------


def _ledger(db: dbmod.Database, tenant: str) -> dict[tuple[str, str], dict[str, Any]]:
    rows = db.sql(
        "SELECT kind, source_id, action, reason, record_type, record_id FROM migration_records"
        " WHERE tenant_id = %(t)s AND source = 'pipedrive'", {"t": tenant})
    return {(r["kind"], r["source_id"]): r for r in rows}


def _truth_ids(truth: dict[str, Any]) -> dict[str, set[str]]:
    ids = dict(truth["ids"])
    if "mail_messages" not in ids or not ids["mail_messages"]:
        ids["mail_messages"] = [m for msgs in truth.get("deals_with_mail", {}).values() for m in msgs]
    return {LEDGER_KIND[name]: {str(i).lower() for i in values} for name, values in ids.items() if name in LEDGER_KIND}


def reconcile(db: dbmod.Database, truth: dict[str, Any], tenant: str, baseline: str) -> tuple[dict[str, int], list[str]]:
    """Every kind of `tenant` against the truth and the fault-free `baseline` tenant.

    Returns ({"lost": n, "duplicated": n, "mismatched": n}, problems); a problem names the tenant,
    kind, source id and what is wrong. Lost: a source row without a ledger entry, an entry whose
    product row is missing, or a row the baseline wrote that this tenant did not. Duplicated: a
    source id with two entries in its identity group, two product rows for one source id, or a
    product row no ledger entry claims."""
    problems: list[str] = []
    n = Counter({"lost": 0, "duplicated": 0, "mismatched": 0})
    mine, calm = _ledger(db, tenant), _ledger(db, baseline)
    by_kind = _truth_ids(truth)
    for group, kinds in IDENTITY_GROUPS.items():
        source = set().union(*(by_kind.get(k, set()) for k in kinds))
        entries: dict[str, list[str]] = {}
        for (kind, sid), _ in mine.items():
            if kind in kinds:
                entries.setdefault(sid, []).append(kind)
        missing = sorted(source - set(entries))
        if missing:
            n["lost"] += len(missing)
            problems.append(f"{tenant} {group}: {len(missing)} source rows have no ledger entry: {missing[:12]}")
        twice = {sid: ks for sid, ks in entries.items() if len(ks) > 1}
        if twice:
            n["duplicated"] += len(twice)
            problems.append(f"{tenant} {group}: {len(twice)} source ids have several ledger entries: {dict(list(twice.items())[:8])}")
        extra = sorted(set(entries) - source)
        if extra:
            n["duplicated"] += len(extra)
            problems.append(f"{tenant} {group}: {len(extra)} ledger entries for ids the source does not have: {extra[:12]}")
    # per-row outcomes equal the fault-free run's, every kind (custom field definitions included)
    diffs: dict[str, list[str]] = {}
    for key in sorted(set(mine) | set(calm)):
        a, b = calm.get(key), mine.get(key)
        want = (a["action"], a["reason"]) if a else None
        got = (b["action"], b["reason"]) if b else None
        if want == got:
            continue
        if got is None:
            if key[0] not in by_kind:  # kinds the truth lists were counted above
                n["lost"] += 1
        elif want is not None and want[0] in ("created", "matched") and got[0] not in ("created", "matched"):
            n["lost"] += 1
        else:
            n["mismatched"] += 1
        diffs.setdefault(key[0], []).append(f"{key[1]}: fault-free {want} chaos {got}")
    for kind, lines in diffs.items():
        problems.append(f"{tenant} {kind}: {len(lines)} outcomes differ from the fault-free run: {lines[:5]}")
    # product rows: one per source id, each claimed by its ledger entry
    tables = sorted({r["record_type"] for r in mine.values() if r["record_type"]})
    for table in tables:
        schema, _, name = table.rpartition(".")
        has_source = bool(db.sql(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %(s)s AND table_name = %(n)s"
            " AND column_name = 'source_id'", {"s": schema or "public", "n": name}))
        claimed = {r["record_id"]: r["source_id"] for r in mine.values()
                   if r["record_type"] == table and r["action"] in ("created", "matched")}
        source_col = "source_id" if has_source else "NULL::text AS source_id"
        rows = db.sql(f"SELECT id, {source_col} FROM {table} WHERE tenant_id = %(t)s", {"t": tenant})
        have = {r["id"]: r["source_id"] for r in rows}
        gone = sorted(sid for rid, sid in claimed.items() if rid not in have)
        if gone:
            n["lost"] += len(gone)
            problems.append(f"{tenant} {table}: {len(gone)} ledger entries point at no row: {gone[:12]}")
        wrong = sorted(sid for rid, sid in claimed.items() if has_source and rid in have and have[rid] != sid)
        if wrong:
            n["mismatched"] += len(wrong)
            problems.append(f"{tenant} {table}: {len(wrong)} ledger entries point at another source id's row: {wrong[:12]}")
        per_source = Counter(sid for sid in have.values() if sid is not None)
        dup = sorted(sid for sid, c in per_source.items() if c > 1)
        if dup:
            n["duplicated"] += len(dup)
            problems.append(f"{tenant} {table}: {len(dup)} source ids with several rows: {dup[:12]}")
        unclaimed = sorted(f"row {rid} (source id {sid})" for rid, sid in have.items() if rid not in claimed)
        if unclaimed:
            n["duplicated"] += len(unclaimed)
            problems.append(f"{tenant} {table}: {len(unclaimed)} rows no ledger entry claims: {unclaimed[:12]}")
    # every email the fault-free run stored with a body has its body here too
    bodies = db.sql(
        "SELECT e.tenant_id, e.source_id, e.body IS NOT NULL AS has_body FROM crm.emails e"
        " WHERE e.tenant_id IN (%(t)s, %(b)s)", {"t": tenant, "b": baseline})
    calm_body = {r["source_id"] for r in bodies if r["tenant_id"] == baseline and r["has_body"]}
    my_rows = {r["source_id"]: r["has_body"] for r in bodies if r["tenant_id"] == tenant}
    no_body = sorted(sid for sid in calm_body if sid in my_rows and not my_rows[sid])  # missing rows: counted above
    if no_body:
        n["lost"] += len(no_body)
        problems.append(f"{tenant} emails: {len(no_body)} stored without the body the fault-free run has: {no_body[:12]}")
    return dict(n), problems


def task_states(db: dbmod.Database, run_id: int) -> dict[str, int]:
    rows = db.sql("SELECT status, count(*) AS n FROM migration_tasks WHERE migration_id = %(r)s GROUP BY status", {"r": run_id})
    return {r["status"]: r["n"] for r in rows}


def run_problems(db: dbmod.Database, run_id: int, tenant: str, chaos: Chaos | None = None) -> list[str]:
    """No task ended `cancelled` (nothing stopped the run); `succeeded` exactly when every task did.
    With `chaos`, a cancelled task is shown with the strikes of the 1.5 s before it was cancelled."""
    problems = []
    run = runs.get_run(db, run_id)
    states = task_states(db, run_id)
    if states.get("cancelled"):
        rows = db.sql("SELECT id, kind, cursor_key, attempts, error, extract(epoch FROM updated_at)::float8 AS at"
                      " FROM migration_tasks WHERE migration_id = %(r)s AND status = 'cancelled' ORDER BY id", {"r": run_id})
        named = []
        for r in rows:
            text = f"#{r['id']} {r['kind']}:{r['cursor_key']} (attempts {r['attempts']}, error {r['error']!r})"
            if chaos is not None:
                at = r["at"] - chaos.wall0
                before = [f"{t:.2f}s {what}" for t, what in chaos.exits if at - 1.5 <= t <= at + 0.6]
                text += f" cancelled at {at:.2f}s after [{'; '.join(before)}]"
            named.append(text)
        problems.append(f"{tenant} run {run_id} ({run.status}): {len(rows)} tasks cancelled though nobody stopped the run: {named[:8]}")
    all_ok = set(states) == {"succeeded"}
    if (run.status == "succeeded") != all_ok:
        problems.append(f"{tenant} run {run_id} reads {run.status!r} (phase {run.current_phase} of {len(run.plan)}) with tasks {states}")
    if not all_ok or run.status != "succeeded":
        rows = db.sql("SELECT id, phase, kind, cursor_key, status, attempts, error FROM migration_tasks"
                      " WHERE migration_id = %(r)s AND status <> 'succeeded' ORDER BY id LIMIT 10", {"r": run_id})
        problems.append(f"{tenant} run {run_id} ended {run.status!r}; not succeeded: "
                        + "; ".join(f"#{r['id']} phase {r['phase']} {r['kind']}:{r['cursor_key']} {r['status']}"
                                    f" (attempts {r['attempts']}) {r['error']!r}" for r in rows))
    return problems


def refetches(stats: dict[str, Any], tenants: int) -> dict[str, int]:
    """From the sandbox's `bodies_fetched` (200 answers per message id): each chaos tenant fetches
    each body once, so anything above `tenants` per id is a refetch."""
    counts = [int(v) for v in stats.get("bodies_fetched", {}).values()]
    return {
        "bodies_fetched": sum(counts),
        "refetched_bodies": sum(max(0, c - tenants) for c in counts),
        "bodies_fetched_more_than_once": sum(1 for c in counts if c > tenants),
        "max_fetches_of_one_body": max(counts, default=0),
    }


# -- the whole experiment -------------------------------------------------------------------------


def run_chaos(config: ChaosConfig, db_url: str, workdir: Path) -> ChaosResult:
    """A fault-free baseline tenant, then `config.tenants` tenants migrated under chaos; the
    figures and every problem found. `db_url` is a database with the schema applied."""
    result = ChaosResult(seed=config.seed)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    sandbox = Sandbox(SandboxConfig(scale=config.scale, seed=1, token=TOKEN, burst_limit=UNLIMITED))
    harness = dbmod.Database(with_app(db_url, "chaos-harness"), max_size=4)
    old_env = {k: os.environ.get(k) for k in (ENV_BASE_URL, ENV_TOKEN)}
    os.environ[ENV_BASE_URL], os.environ[ENV_TOKEN] = sandbox.base_url, TOKEN
    chaos: Chaos | None = None
    try:
        truth = sandbox.truth()
        settings = Settings(lane_width=config.baseline_width, stale_lock_seconds=1800, heartbeat_seconds=1.0,
                            retry_backoff_seconds=0.2)
        options = {"base_url": sandbox.base_url, "burst_limit": UNLIMITED}
        t = time.monotonic()
        calm = runs.start_run(harness, PipedriveProvider(base_url=sandbox.base_url), BASELINE_TENANT, options=options, settings=settings)
        drain_threads(harness, calm.id, width=config.baseline_width, settings=settings, providers=for_run)
        calm_run = runs.get_run(harness, calm.id)
        result.figures["baseline_seconds"] = round(time.monotonic() - t, 1)
        if calm_run.status != "succeeded":
            result.problems.append(f"the fault-free run ended {calm_run.status!r} with tasks {task_states(harness, calm.id)}")
            return result

        sandbox.configure(faults=config.faults, latency=config.latency)
        sandbox.reset_stats()
        tenants = [f"chaos-{i + 1}" for i in range(config.tenants)]
        chaos_settings = Settings(lane_width=config.width, stale_lock_seconds=config.stale_lock_seconds,
                                  heartbeat_seconds=1.0, retry_backoff_seconds=0.2)
        run_ids = [runs.start_run(harness, PipedriveProvider(base_url=sandbox.base_url), tenant, options=options,
                                  settings=chaos_settings).id for tenant in tenants]
        chaos = Chaos(config, db_url, run_ids, sandbox.base_url, workdir, harness)
        chaos.event(f"seed {config.seed}: {config.tenants} tenants x {config.scale}, {config.drainers} drainers x "
                    f"{config.width} lanes, faults {config.faults}, latency {config.latency}")
        chaos.start()
        deadline = chaos.t0 + config.timeout
        while time.monotonic() < deadline and any(chaos.run_live(r) for r in run_ids):
            time.sleep(0.5)
        chaos_wall = time.monotonic() - chaos.t0
        stuck = [r for r in run_ids if chaos.run_live(r)]
        chaos.shutdown()
        stats = sandbox.stats()
        result.figures.update({
            "kills": chaos.counts["kills"], "terminations": chaos.counts["terminations"],
            "drainer_crashes": chaos.counts["drainer_crashes"], "locks_released": chaos.counts["released"],
        })
        for tenant, run_id in zip(tenants, run_ids):
            result.task_states[f"{tenant}#{run_id} {runs.get_run(harness, run_id).status}"] = task_states(harness, run_id)
        if stuck:
            for run_id in stuck:
                rows = harness.sql("SELECT id, kind, cursor_key, status, locked_by, error FROM migration_tasks"
                                   " WHERE migration_id = %(r)s AND status <> 'succeeded' ORDER BY id LIMIT 12", {"r": run_id})
                run = runs.get_run(harness, run_id)
                result.problems.append(
                    f"run {run_id} still {run.status!r} (phase {run.current_phase}) after the {config.timeout:.0f}s timeout;"
                    f" tasks {task_states(harness, run_id)}; unfinished: "
                    + "; ".join(f"#{r['id']} {r['kind']}:{r['cursor_key']} {r['status']} by {r['locked_by']} {r['error']!r}" for r in rows))
        lost = duplicated = mismatched = 0
        for tenant, run_id in zip(tenants, run_ids):
            if run_id not in stuck:
                result.problems += run_problems(harness, run_id, tenant, chaos)
            counts, found = reconcile(harness, truth, tenant, BASELINE_TENANT)
            lost += counts["lost"]
            duplicated += counts["duplicated"]
            mismatched += counts["mismatched"]
            result.problems += found
        result.figures.update({"lost": lost, "duplicated": duplicated, "outcomes_differing": mismatched})
        result.figures.update(refetches(stats, config.tenants))
        result.figures["faults_served"] = sum(int(v) for v in stats.get("faults", {}).values())
        result.figures["chaos_seconds"] = round(chaos_wall, 1)
        result.figures["wall_seconds"] = round(time.monotonic() - started, 1)
        result.events = chaos.events
        return result
    finally:
        if chaos is not None:
            chaos.shutdown()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        harness.close()
        sandbox.close()


# -- the drainer process ---------------------------------------------------------------------------


def drain_main(url: str, run_id: int, name: str) -> int:
    """One drainer process: lanes of width MIGRATE_LANE_WIDTH over `run_id` until it is terminal.
    Raises (exit code 1) when the engine raises, as a Dagster drainer run would fail."""
    logging.basicConfig(level=logging.WARNING, format=f"{name} %(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    db = dbmod.Database(url, max_size=settings.lane_width * 2 + 4)
    try:
        while True:
            row = db.fetch_one("get_run", {"run_id": run_id})
            if row is None or row["status"] not in ("running", "stopping"):
                return 0
            drain_threads(db, run_id, width=settings.lane_width, settings=settings, providers=for_run)
            time.sleep(0.3)
    finally:
        db.close()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "drain":
        sys.exit(drain_main(sys.argv[2], int(sys.argv[3]), sys.argv[4]))
    print("usage: python -m tests.chaos.support drain <db_url> <run_id> <name>", file=sys.stderr)
    sys.exit(2)
