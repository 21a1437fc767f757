"""Progress while a phase runs: figures both faces show every few seconds.

* `SourceMetrics` / `source_metrics`: a tiny process-local recorder the source client feeds from its
  retry path (requests, failed requests, 429s, retries waiting now with their cause). Process-local
  on purpose: a Dagster phase op and its worker threads share one process, so the op reports what
  its own lane asked of the source; other processes report theirs.
* `PhaseMeter`: successive snapshots of one phase of one run, from the task stats the workers
  checkpoint with every window (rows seen / imported / matched / already here / updated / skipped /
  waiting for the catch-up / failed, tasks done / total) plus the recorder's counters, with rates
  between two snapshots and an ETA where a total is known (the source's own count, else the phase's
  tasks: those that exist and those its discoveries not yet run expect to seed, `expected_tasks` in
  their cursors).
* `run_progress`: percent and ETA of a whole run for `migrate status` (no rates: one look), its
  phases weighed by what they cost (the provider's `progress_weights`).
* `ProgressBoard`: one `rich` progress bar per phase for `migrate run`, drawn from snapshots.

Units: seconds, rows, requests; rates per second over the last interval. No Dagster here.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from engine_core import config
from engine_core.db import Database
from engine_core.runs_reads import active_seconds

DONE = ("succeeded", "failed")
SOURCE_DOWN_ENV = "MIGRATE_SOURCE_DOWN_SECONDS"


def source_down_seconds() -> float:
    """MIGRATE_SOURCE_DOWN_SECONDS in seconds (default 180; 0 turns the pause off), as
    `config.number` reads it: every command checks it at start-up (`config.FACE_NUMBERS`); a value
    that is not a number, or is negative, raises ConfigError naming the variable."""
    return config.number(SOURCE_DOWN_ENV)


class SourceMetrics:
    """Counters of one process's source requests. Thread-safe; `snapshot()` is a plain dict.

    `retrying(cause, seconds)` records a retry that waits `seconds` before its next attempt: it
    counts as in progress until then (no end call needed, so a wait cut short by a stop cannot leave
    it counted for ever). Causes are short texts ("HTTP 500", "burst 429", "ReadTimeout")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.failed_requests = 0
        self.rate_limited = 0
        self.retries = 0
        self._waiting: deque[tuple[float, str]] = deque()
        self.last_ok: float | None = None  # monotonic time of the last request that succeeded
        self.first_failure_since_ok: float | None = None

    def request(self, *, ok: bool, rate_limited: bool = False) -> None:
        """Count one request to the source: `ok` (answered), else failed (`rate_limited`: a 429). A
        success ends the current run of failures."""
        now = time.monotonic()
        with self._lock:
            self.requests += 1
            if ok:
                self.last_ok = now
                self.first_failure_since_ok = None
            else:
                self.failed_requests += 1
                if self.first_failure_since_ok is None:
                    self.first_failure_since_ok = now
            if rate_limited:
                self.rate_limited += 1

    def retrying(self, cause: str, seconds: float) -> None:
        """Note a retry after `seconds` because of `cause` (cut to 80 characters): what the
        progress line says the run waits on."""
        with self._lock:
            self.retries += 1
            self.last_cause = cause[:80]
            self._waiting.append((time.monotonic() + max(0.0, seconds), cause[:80]))

    def down_since(self, started: float, threshold: float) -> str | None:
        """Why the source looks down, or None: every request since the last success (and since
        `started`, monotonic) has failed, for at least `threshold` seconds. A reason names the time and
        the last cause ("the source failed every request for 3m00s (last: HTTP 500)")."""
        if threshold <= 0:
            return None
        with self._lock:
            since = self.first_failure_since_ok
            cause = getattr(self, "last_cause", None)
        if since is None:
            return None
        failing = time.monotonic() - max(since, started)  # counted from when this watcher began at the earliest
        if failing < threshold:
            return None
        return (f"the source failed every request for {format_seconds(failing)}"
                + (f" (last: {cause})" if cause else ""))

    def snapshot(self) -> dict[str, Any]:
        """The figures now, as a dict: requests, retries, the causes waited on now with their
        counts, and the last cause."""
        now = time.monotonic()
        with self._lock:
            while self._waiting and self._waiting[0][0] <= now - 600:
                self._waiting.popleft()  # long over: keep the deque small
            causes: dict[str, int] = {}
            for until, cause in self._waiting:
                if until > now:
                    causes[cause] = causes.get(cause, 0) + 1
            failing_for = now - self.first_failure_since_ok if self.first_failure_since_ok is not None else 0.0
            return {
                "requests": self.requests,
                "failed_requests": self.failed_requests,
                "rate_limited": self.rate_limited,
                "retries": self.retries,
                "retrying": causes,
                "failing_for_seconds": round(failing_for, 1),
            }


source_metrics = SourceMetrics()


@dataclass
class PhaseProgress:
    """One snapshot of one phase (0-based `phase`) of a run. Rates are per second since the
    previous snapshot of the same meter (0 on the first); `eta_seconds` is None when no total is
    known or nothing moved; `percent` is 0..100 or None."""

    run_id: int
    phase: int
    kinds: list[str]
    seen: int = 0
    imported: int = 0
    matched: int = 0
    already_here: int = 0
    updated: int = 0  # written over their product row in place (a newer source version)
    skipped: int = 0
    waiting: int = 0  # left to the catch-up's walk (`rows.WAITING`)
    failed: int = 0
    tasks_done: int = 0
    tasks_failed: int = 0
    tasks_total: int = 0
    tasks_expected: int = 0  # tasks the phase's discoveries not yet run expect to seed beyond tasks_total
    source_total: int | None = None
    requests: int = 0
    rate_limited: int = 0
    retries: int = 0
    retrying: dict[str, int] = field(default_factory=dict)
    rows_per_second: float = 0.0
    requests_per_second: float = 0.0
    percent: float | None = None
    eta_seconds: float | None = None
    closed: bool = False
    at: float = 0.0  # monotonic seconds

    def as_dict(self) -> dict[str, Any]:
        """The figures as a plain dict (Dagster metadata, `migrate status --json`)."""
        return asdict(self)

    def line(self, number: int | None = None) -> str:
        """One human line: what the log events and the CLI say. The phase is called `number` when
        given (the phase op passes its asset's: the catch-up of a run without the opt-in phase is
        phase 9 of the provider's plan, its asset phase_9_catchup, but the 8th of the run's), else
        by its place in the run's plan."""
        parts = [f"phase {number or self.phase + 1} ({', '.join(self.kinds)}): {self.seen} seen, {self.imported} imported,"
                 f" {self.matched + self.already_here} matched or already here,"
                 + (f" {self.updated} updated," if self.updated else "")
                 + f" {self.skipped} skipped,"
                 + (f" {self.waiting} waiting for the catch-up," if self.waiting else "")
                 + f" {self.failed} failed; tasks {self.tasks_done}/{self.tasks_total}"
                 + (f" (about {self.tasks_total + self.tasks_expected} expected)" if self.tasks_expected else "")]
        if self.percent is not None:
            parts.append(f"{self.percent:.0f}%")
        parts.append(f"{self.rows_per_second:.1f} rows/s, {self.requests_per_second:.1f} req/s, {self.rate_limited} x 429")
        if self.retrying:
            parts.append("retrying: " + ", ".join(f"{n} x {c}" for c, n in sorted(self.retrying.items())))
        if self.eta_seconds is not None:
            parts.append(f"ETA {format_seconds(self.eta_seconds)}")
        return "; ".join(parts)


def format_seconds(seconds: float) -> str:
    """A duration for people: `42s`, `3m02s`, `1h05m` (rounded to the second)."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def _phase_figures(rows: list[dict[str, Any]], phase: int, kinds: list[str], run_id: int) -> PhaseProgress:
    p = PhaseProgress(run_id=run_id, phase=phase, kinds=list(kinds))
    totals: dict[str, int] = {}
    for r in rows:
        if r["phase"] != phase:
            continue
        for c in ("seen", "imported", "matched", "already_here", "updated", "skipped", "waiting", "failed"):
            setattr(p, c, getattr(p, c) + int(r.get(c) or 0))
        p.tasks_total += int(r["n"])
        if r["status"] in DONE:
            p.tasks_done += int(r["n"])
        else:
            p.tasks_expected += int(r.get("tasks_expected") or 0)
        if r["status"] == "failed":
            p.tasks_failed += int(r["n"])
        if r.get("source_total") is not None:
            totals[r["kind"]] = max(totals.get(r["kind"], 0), int(r["source_total"]))
    # the source's own count covers the phase only when every kind of it has one
    if totals and all(k in totals for k in kinds):
        p.source_total = sum(totals.values())
    return p


def _percent_and_remaining(p: PhaseProgress) -> tuple[float | None, float | None, str]:
    """(percent, remaining units, unit): by rows against the source's count when known, else by tasks:
    those that exist and those the discoveries not yet run expect (`tasks_expected`). Task totals
    grow as pages discover their successors, so without such an estimate the percent is an upper bound."""
    if p.closed:
        return 100.0, 0.0, "rows"
    if p.source_total:
        return min(100.0, 100.0 * p.seen / p.source_total), max(0, p.source_total - p.seen), "rows"
    if p.tasks_total:
        total = p.tasks_total + p.tasks_expected
        return 100.0 * p.tasks_done / total, total - p.tasks_done, "tasks"
    return None, None, "tasks"


class PhaseMeter:
    """Snapshots of one phase with rates between them. Not thread-safe: one caller ticks it."""

    def __init__(self, db: Database, run_id: int, phase: int, kinds: list[str],
                 metrics: SourceMetrics | None = None) -> None:
        self.db = db
        self.run_id = run_id
        self.phase = phase
        self.kinds = list(kinds)
        self.metrics = metrics or source_metrics
        self._prev: PhaseProgress | None = None
        self._prev_tasks_at: tuple[float, int] | None = None
        self._base = self.metrics.snapshot()  # count this phase's requests, not the process's
        self.started = time.monotonic()

    def source_down(self, threshold: float) -> str | None:
        """The recorder's `down_since` for failures that began while this meter watched."""
        return self.metrics.down_since(self.started, threshold)

    def snapshot(self) -> PhaseProgress:
        """The phase's figures now, from its tasks' rows and this process's source metrics: counts,
        rate, percent and time remaining."""
        now = time.monotonic()
        rows = self.db.fetch_all("rollup_tasks", {"run_id": self.run_id})
        run = self.db.fetch_one("get_run", {"run_id": self.run_id})
        p = _phase_figures(rows, self.phase, self.kinds, self.run_id)
        p.at = now
        p.closed = bool(run and (run["current_phase"] > self.phase or run["status"] == "succeeded"))
        m = self.metrics.snapshot()
        p.requests = m["requests"] - self._base["requests"]
        p.rate_limited = m["rate_limited"] - self._base["rate_limited"]
        p.retries = m["retries"] - self._base["retries"]
        p.retrying = m["retrying"]
        prev = self._prev
        if prev is not None and now > prev.at:
            dt = now - prev.at
            p.rows_per_second = round(max(0, p.seen - prev.seen) / dt, 2)
            p.requests_per_second = round(max(0, p.requests - prev.requests) / dt, 2)
        p.percent, remaining, unit = _percent_and_remaining(p)
        if p.percent is not None:
            p.percent = round(p.percent, 1)
        if remaining == 0:
            p.eta_seconds = 0.0
        elif remaining is not None and prev is not None:
            if unit == "rows" and p.rows_per_second > 0:
                p.eta_seconds = round(remaining / p.rows_per_second, 1)
            elif unit == "tasks":
                # tasks finish in steps: the rate since the first snapshot that saw one finish
                if self._prev_tasks_at is None:
                    self._prev_tasks_at = (prev.at, prev.tasks_done)
                t0, done0 = self._prev_tasks_at
                if p.tasks_done > done0 and now > t0:
                    p.eta_seconds = round(remaining / ((p.tasks_done - done0) / (now - t0)), 1)
        self._prev = p
        return p


def _kind_fraction(rows: list[dict[str, Any]], phase: int, kind: str) -> float:
    """How far one kind of an open phase is, 0..1: rows seen against the source's own count where
    its discovery recorded one, else its tasks done of those there are so far and those its
    discoveries not yet run expect to seed (`tasks_expected`)."""
    mine = [r for r in rows if r["phase"] == phase and r["kind"] == kind]
    totals = [int(r["source_total"]) for r in mine if r.get("source_total") is not None]
    if totals and max(totals) > 0:
        return min(1.0, sum(int(r.get("seen") or 0) for r in mine) / max(totals))
    total = sum(int(r["n"]) + (0 if r["status"] in DONE else int(r.get("tasks_expected") or 0)) for r in mine)
    return sum(int(r["n"]) for r in mine if r["status"] in DONE) / total if total else 0.0


def run_progress(db: Database, run_id: int, stale_after: float | None = None,
                 weights: dict[str, float] | None = None) -> dict[str, Any]:
    """Percent and ETA of a whole run, for `migrate status`: {"percent", "eta_seconds",
    "idle_seconds", "unattended", "phases": [{"phase", "kinds", "percent", "weight", "tasks_done",
    "tasks_total", "tasks_expected", "source_total", "seen"}]}.

    Per kind: done once its phase is closed; else by rows against the source's count where its
    discovery recorded one, else by tasks done of those that exist and those its discoveries not yet
    run expect to seed ("tasks_expected": the mail phase's walk estimates the rest of its deal lists,
    so the percent does not step back as its later pages seed tasks). A phase's percent weighs its kinds, and the run's
    weighs its phases, by `weights` ({kind: what it costs a run}, the provider's
    `progress_weights`: requests and written rows at a reference account; a kind without one
    weighs 1; None: every kind weighs 1). So the mail phase, most of a Pipedrive run's requests,
    is most of its percent: the percent does not drop back when a cheap phase closes and a dear
    one begins, and the ETA is not a fraction of the mail's time while the mail runs ("weight" of
    each phase, percent of the run). The ETA extrapolates the pace of the phase the barrier is on
    (its share of the run done since its first task started) once that phase is `PACED_AFTER` done
    and has run `PACED_SECONDS`, never below the run's running time (`runs_reads.active_seconds`:
    its spans stopped left out) over its percent, which it is before then: weights count requests
    and rows, not the time they take (under latency the mail's requests take longer each than the
    listings before it), so the run's pace before the mail said
    too little of the mail's time. None before anything is done or once the run is terminal. "idle_seconds", while the
    run is live (else None): seconds since anything worked on it (its heartbeat, a task's
    checkpoint or finish, a running task's lock renewed: `run_idle_seconds`). "unattended": a live
    run idle for longer than `stale_after` seconds (the stale-lock threshold: a running task's lock
    that old belongs to a dead process); its ETA is None then, as `status_line` gives no ETA for it."""
    run = db.fetch_one("get_run", {"run_id": run_id})
    if run is None:
        return {"percent": None, "eta_seconds": None, "idle_seconds": None, "unattended": False, "phases": []}
    rows = db.fetch_all("rollup_tasks", {"run_id": run_id})
    plan = [list(g) for g in run["plan"]]
    phases: list[dict[str, Any]] = []
    for i, kinds in enumerate(plan):
        p = _phase_figures(rows, i, kinds, run_id)
        closed = run["current_phase"] > i or run["status"] == "succeeded"
        each = {k: max(float((weights or {}).get(k, 1.0)), 1e-9) for k in kinds}
        weight = sum(each.values())
        done = weight if closed else sum(w * _kind_fraction(rows, i, k) for k, w in each.items())
        starts = [r["first_started"] for r in rows if r["phase"] == i and r.get("first_started") is not None]
        phases.append({"phase": i, "kinds": kinds, "percent": round(100.0 * done / weight, 1) if weight else 100.0,
                       "weight": weight, "done": done, "tasks_done": p.tasks_done, "tasks_total": p.tasks_total,
                       "tasks_expected": p.tasks_expected, "source_total": p.source_total, "seen": p.seen,
                       "closed": closed, "started": min(starts) if starts else None})
    whole = sum(ph["weight"] for ph in phases)
    percent = round(100.0 * sum(ph["done"] for ph in phases) / whole, 1) if whole else 100.0
    eta = idle = None
    if run["status"] in ("running", "stopping"):
        idle = round(float(db.fetch_one("run_idle_seconds", {"run_id": run_id})["idle_seconds"]), 1)
        if run["started_at"] is not None and 0 < percent < 100:
            now = time.time()
            ran = active_seconds(run, datetime.fromtimestamp(now, timezone.utc)) or 0.0  # a stop's span is no pace
            eta = round(ran * (100 - percent) / percent, 1)
            paced = _paced_eta(next((ph for ph in phases if not ph["closed"]), None), whole * (100 - percent) / 100,
                               now, ran)
            if paced is not None:
                eta = max(eta, paced)
    for ph in phases:
        ph["weight"] = round(100.0 * ph["weight"] / whole, 1) if whole else 0.0
        del ph["done"], ph["closed"], ph["started"]
    unattended = stale_after is not None and idle is not None and idle > stale_after
    return {"percent": percent, "eta_seconds": None if unattended else eta, "idle_seconds": idle,
            "unattended": unattended, "phases": phases}


PACED_AFTER = 0.05  # share of its phase done before the phase's own pace gives the run's ETA
PACED_SECONDS = 5.0  # seconds the phase has run before its pace gives the run's ETA


def _paced_eta(phase: dict[str, Any] | None, left: float, now: float, run_ran: float) -> float | None:
    """Seconds until `left` (weight of the run not done) is done at the pace of the open `phase`
    (its weight done since its first task started, `now` in epoch seconds); None when there is no
    open phase, or it is under PACED_AFTER done or has run under PACED_SECONDS. The phase ran no
    longer than the run did (`run_ran`, its running time): a stop since the phase began is no pace."""
    if phase is None or phase["started"] is None or phase["weight"] <= 0:
        return None
    ran = min(now - phase["started"].timestamp(), run_ran)
    if phase["done"] / phase["weight"] < PACED_AFTER or ran < PACED_SECONDS:
        return None
    return round(left * ran / phase["done"], 1)


class ProgressBoard:
    """One `rich` progress bar per phase of a run, for `migrate run`: call `update(db)` every few
    seconds (inside `with board:`), it snapshots every phase that has tasks and redraws. A
    `dry_run`'s bars say "would import" / "would update", as its results tables do (they said
    "imported"). `labels`: each phase's number on its bar (default: its place in `plan`)."""

    def __init__(self, run_id: int, plan: list[list[str]], console: Any = None, *, dry_run: bool = False,
                 labels: list[str] | None = None) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.run_id = run_id
        self.plan = [list(g) for g in plan]
        # how each phase is numbered on its bar ("9/9"; default: its place in `plan`, "8")
        self.labels = list(labels) if labels is not None and len(labels) == len(self.plan) else None
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(), TextColumn("{task.fields[figures]}"), console=console, transient=False,
            # sys.stdout and sys.stderr stay what they are: rich's default swaps in proxies that print
            # above the bars, and `migrate run` executing its Dagster run in-process then showed
            # Dagster's console log lines (a logging handler made during the run holds the proxy) on
            # the terminal instead of in-process-runs.log, where descriptors 1 and 2 point
            redirect_stdout=False, redirect_stderr=False,
        )
        self._bars: dict[int, Any] = {}
        self._meters: dict[int, PhaseMeter] = {}
        self._first: dict[int, tuple[float, int]] = {}  # phase -> (monotonic s, rows seen) when first shown open
        self._done: dict[int, str] = {}  # a closed phase's last figures, kept as they were when it closed
        self._words = ("would import", "would update") if dry_run else ("imported", "updated")

    def __enter__(self) -> ProgressBoard:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def update(self, db: Database) -> list[PhaseProgress]:
        """Read the figures of every phase not closed yet and redraw their bars (a closed phase's bar
        keeps what it closed with); returns the figures read."""
        out: list[PhaseProgress] = []
        for i, kinds in enumerate(self.plan):
            if i in self._done:  # closed: its bar keeps the figures it closed with
                continue
            meter = self._meters.setdefault(i, PhaseMeter(db, self.run_id, i, kinds))
            p = meter.snapshot()
            if not p.tasks_total and not p.closed:
                continue
            if i not in self._bars:
                self._bars[i] = self.progress.add_task(f"phase {self.labels[i] if self.labels else i + 1} {', '.join(kinds)}", total=100.0, figures="")
            if not p.closed:
                self._first.setdefault(i, (p.at, p.seen))
            self.progress.update(self._bars[i], completed=p.percent or 0.0, figures=self._figures(i, p))
            if p.closed:
                self._done[i] = self._figures(i, p)
            out.append(p)
        return out

    def _figures(self, i: int, p: PhaseProgress) -> str:
        """Phase `i`'s text beside its bar. An open phase: its counts, its rates now and what its
        source is retrying now (`SourceMetrics.retrying`: the process's, so on the open phases
        only - a closed phase's bar had kept "| retrying 1x ReadTimeout" of the phases after it).
        A closed phase: its counts and its average rows/s over the time this board saw it open, or
        no rate when it was closed already (a resumed run's earlier phases had shown "0 rows/s")."""
        imported, updated = self._words
        figures = (f"{p.seen} seen {p.imported} {imported}" + (f" {p.updated} {updated}" if p.updated else "")
                   + f" {p.skipped} skipped" + (f" {p.waiting} waiting" if p.waiting else "") + f" {p.failed} failed"
                   f" | tasks {p.tasks_done}/{p.tasks_total}")
        if p.closed:
            at, seen = self._first.get(i, (p.at, p.seen))
            return figures + (f" | {(p.seen - seen) / (p.at - at):.0f} rows/s average" if p.at > at else "")
        figures += f" | {p.rows_per_second:.0f} rows/s {p.requests_per_second:.1f} req/s {p.rate_limited}x429"
        if p.retrying:
            figures += " | retrying " + ", ".join(f"{n}x {c}" for c, n in sorted(p.retrying.items()))
        return figures


def status_line(progress: dict[str, Any], stale_after: float | None = None) -> str:
    """`run_progress` as one line for `migrate status`: "62% done, ETA 4m10s; phase 3: 40% (...)".

    With `stale_after` (seconds: the stale-lock threshold, beyond which a running task's lock
    belongs to a dead process) and a live run idle for longer, the ETA gives way to "nothing has
    worked on it for 5m12s: no worker is draining it" (after a `kill -9` of `migrate run` with no
    daemon, status had said "running ... ETA" as if all were well). A phase is numbered by its
    "label" where it has one ("9/9": the phase assets' numbering, as the progress lines give it),
    else by its place in the run's plan."""
    if progress.get("percent") is None:
        return ""
    # whole percents rounded down: a live run at 99.6% had read "100% done, ETA 0s" through its catch-up
    text = f"{math.floor(progress['percent'])}% done"
    idle = progress.get("idle_seconds")
    if stale_after is not None and idle is not None and idle > stale_after:
        text += (f"; nothing has worked on it for {format_seconds(idle)}: no worker is draining it (a stopped "
                 "or killed command, or a daemon that is down)")
    elif progress.get("eta_seconds") is not None:
        text += f", ETA {format_seconds(progress['eta_seconds'])}"
    open_phases = [p for p in progress.get("phases", []) if 0 < p["percent"] < 100 or (p["tasks_total"] and p["percent"] < 100)]
    for p in open_phases[:1]:
        basis = (f"{p['seen']} of the source's {p['source_total']} rows" if p.get("source_total")
                 else f"{p['tasks_done']}/{p['tasks_total']} tasks"
                 + (f", about {p['tasks_total'] + p['tasks_expected']} expected" if p.get("tasks_expected") else ""))
        text += f"; phase {p.get('label') or p['phase'] + 1} ({', '.join(p['kinds'])}): {p['percent']:.0f}% ({basis})"
    return text
