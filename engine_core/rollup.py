"""The run page as queries: the rollup and the duration-by-payload diagnosis (one row's story is
`row_story`).

The rollup also checks completeness ("checked, not assumed"): for every kind of a closed
phase, rows seen = rows accounted for (imported + matched + already here + updated + skipped +
waiting + failed in the task stats); rows claimed in the ledger by this run = imported + matched (per phase,
so a task kind whose rows keep another kind's ledger identity - Pipedrive's archived deals under
`deals` - is compared with its phase); and rows seen = the source's own count where a discovery
task recorded one (`source_total` in its stats); and no row counted twice across the phase and the
catch-up (`rollup_catchup.beyond_listing`: a row the phase left waiting is not the catch-up's skip too). For the whole run: rows updated in place
in the task stats = the ledger history's `updated` and `restored` rows of this run (a sighting that
changed a row writes one, in the window that counts it, so this holds at any moment; run-wide
because a catch-up task writes rows of many ledger kinds). What does not add up is listed in
`completeness` (per phase), `problems` (run-wide) and `incomplete`, and `verdict` says so beside
the engine's status.

The catch-up (a run on an account that changes while it walks) writes rows of many kinds
in tasks of its own kind, and counts them per kind too ("<counter>@<kind>" task stats: e.g.
`imported@deals`). The rollup credits them to their kinds (`KindRollup.caught_up`; the carrier's
`handed_over`): a phase's ledger claims = its tasks' imported + matched + the catch-up's of its
kinds, and a kind's source count (taken when its phase began) is met by its phase's rows plus the
catch-up's, or by the catch-up's whole listing of the kind with every row given an outcome
(`KindRollup.source_count_met`). Until a run with a snapshot has closed its last phase (the
catch-up), a source count not yet met is no verdict; a run stopped short of it - the stop cancelled
its phase's walk, or came before the catch-up - is no verdict either: the count goes to
`unfinished` with why and how the run resumes (`cut_short`), not to `incomplete`.

A row a phase's walk left to the catch-up's walk (`rows.WAITING`: a parent not known yet, not
asked) is `waiting` in its phase and neither skipped nor written; the catch-up's outcome for it is
counted per kind (`caught_up`): so per kind, phase + catch-up = the ledger. Once the run succeeded,
no placeholder of the run may still wait (`run_problems`): one that does was left unsettled.

Rows deleted at the source are not rows seen (no listing serves them): `deleted_at_source` and
`restored` per kind come from the ledger history of the run (`ledger_reads.history_counts`), beside the
counters, outside the sum.
"""
from __future__ import annotations

import socket
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from engine_core import ledger_reads, rollup_catchup, runs_reads
from engine_core.db import Database
from engine_core.errors import RunNotFound
from engine_core.models import Run
from engine_core.reaper import process_alive
from engine_core.rows import WAITING, WAITS_FOR_WALK
from engine_core.runlog import reason_shape

# A row's outcomes, each seen row has exactly one (their sum is `accounted`).
COUNTERS = ("imported", "matched", "already_here", "updated", "skipped", "waiting", "failed")


@dataclass
class KindRollup:
    """One kind's figures over its tasks: tasks by status, rows seen, and rows by outcome
    (imported, matched, already here, updated, skipped, waiting, failed), with the source's total
    where a task recorded one."""
    kind: str
    phase: int
    tasks: dict[str, int] = field(default_factory=dict)
    seen: int = 0
    imported: int = 0
    matched: int = 0
    already_here: int = 0
    updated: int = 0  # written over their product row in place: a newer source version
    skipped: int = 0
    waiting: int = 0  # left to the catch-up's walk (`rows.WAITING`): it says what became of them
    failed: int = 0
    source_total: int | None = None  # the source's own count, where a discovery task recorded one
    # from the ledger's history of this run, per ledger kind (not rows seen; outside `accounted`)
    deleted_at_source: int = 0
    restored: int = 0
    # rows of this kind another task kind wrote (the catch-up: its "<counter>@<kind>" stats), and,
    # for that task kind, what it credited to other kinds; e.g. {"seen": 3, "imported": 2,
    # "updated": 1, "listed": 45, "unchanged": 42} ("listed"/"unchanged": a full listing of the kind)
    caught_up: dict[str, int] = field(default_factory=dict)
    handed_over: dict[str, int] = field(default_factory=dict)
    # records its tasks kept apart (the mail of a deal no listing can serve, kept as one failed
    # record: `marks.KEPT_APART`), counted by those tasks as rows seen and failed: part of both
    kept_apart: int = 0
    # failed records the run holds under this kind beyond what its phase counted: the rows (and
    # kept mail) the catch-up failed after the phase closed that the phase had not; part of `failed`
    # and `seen` (so they agree with `migrate rows`), not of the phase's figures (`at_close`)
    failed_by_catchup: int = 0
    # skipped rows the run holds under this kind beyond its phase's count: the catch-up's, after the
    # phase closed; part of `skipped` and `seen` (as `migrate rows`), not of `at_close`'s figures
    skipped_by_catchup: int = 0
    # of the rows the phase left to the catch-up (`waiting`), those the catch-up skipped: counted in
    # `skipped` (the ledger's), no longer in `waiting`, and not again in `seen` (`rollup_catchup`)
    waiting_skipped: int = 0
    # {parent kind: records waiting for the catch-up whose rows of this kind were left to it unlisted}
    left: dict[str, int] = field(default_factory=dict)

    @property
    def accounted(self) -> int:
        """Rows seen with an outcome: imported + matched + already here + updated + skipped + waiting
        + failed."""
        return (self.imported + self.matched + self.already_here + self.updated + self.skipped + self.waiting
                + self.failed)

    @property
    def written(self) -> int:
        """Rows this kind's own tasks claimed (imported + matched) for this kind: what they credited
        to other kinds (`handed_over`) is those kinds', and the rows others wrote for it
        (`caught_up`) are added."""
        return (self.imported + self.matched - _n(self.handed_over, "imported") - _n(self.handed_over, "matched")
                + _n(self.caught_up, "imported") + _n(self.caught_up, "matched"))

    @property
    def added_by_catchup(self) -> int:
        """Rows in `seen` its phase did not count: what the catch-up failed or skipped after the phase
        closed (`failed_by_catchup`, `skipped_by_catchup`) but the phase's own rows it left waiting
        and the catch-up skipped (`waiting_skipped`: already seen). Per ledger kind: an archived
        kind whose waiting rows the catch-up skipped under `deals` has a negative share."""
        return self.failed_by_catchup + self.skipped_by_catchup - self.waiting_skipped

    def at_close(self) -> KindRollup:
        """The kind's figures as its phase counted them - what its progress lines and its phase's
        materialisation say - without the rows the catch-up failed or skipped after it
        (`failed_by_catchup`, `skipped_by_catchup`), its skipped waiting rows back in `waiting`."""
        return replace(self, failed=self.failed - self.failed_by_catchup, skipped=self.skipped - self.skipped_by_catchup,
                       waiting=self.waiting + self.waiting_skipped, seen=self.seen - self.added_by_catchup,
                       failed_by_catchup=0, skipped_by_catchup=0, waiting_skipped=0)

    def source_count_met(self) -> bool | None:
        """Whether the source's own count (`source_total`, taken when the kind's phase began) is met;
        None without one. Met when the phase saw exactly that many rows, or - on an account that
        changed while the run walked - when the rows seen by the phase, the rows of this
        kind the catch-up wrote and the rows marked deleted at the source reach it, or when the
        catch-up listed the kind whole and gave every row listed an outcome (each row the source
        lists at the end is held at its version or was written now)."""
        if self.source_total is None:
            return None
        if self.seen == self.source_total:
            return True
        if not self.caught_up:
            return False
        if self.seen + _n(self.caught_up, "seen") + self.deleted_at_source >= self.source_total:
            return True
        listed = self.caught_up.get("listed")
        return listed is not None and listed == _n(self.caught_up, "unchanged") + _n(self.caught_up, "seen")


def _n(counts: dict[str, int], key: str) -> int:
    return int(counts.get(key, 0))


@dataclass
class RunRollup:
    """A run's figures and verdict: per kind (`KindRollup`), completeness per closed phase, what
    does not add up (`incomplete`), the reasons rows were not written, and the run's history
    counts."""
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
    seconds: float | None  # running time (`runs_reads.active_seconds`): the spans stopped are not in it
    stopped_seconds: float = 0.0  # the spans it spent stopped, failed or ended before it was reopened
    # per closed phase: {"phase", "kinds", "complete", "problems": [str], per-kind figures}
    completeness: list[dict[str, Any]] = field(default_factory=list)
    # run-wide checks that are not one phase's (updates against the ledger's history), one line each
    problems: list[str] = field(default_factory=list)

    @property
    def incomplete(self) -> list[str]:
        """Every problem of every closed phase, then the run-wide ones, one line each
        ("deals: seen 39 of the source's 40")."""
        return [p for c in self.completeness for p in c["problems"]] + list(self.problems)

    @property
    def unfinished(self) -> list[str]:
        """Source counts a stopped run has not met yet, with why (`cut_short`): no discrepancy, one
        line each ("deals: 45 seen of the source's own count 46 so far: the run stopped before ...")."""
        return [p for c in self.completeness for p in c.get("unfinished", ())]

    @property
    def complete(self) -> bool:
        """True when every check adds up (`incomplete` is empty)."""
        return not self.incomplete

    @property
    def verdict(self) -> str:
        """The engine's status, with what does not add up: never a silent "succeeded"."""
        if self.complete:
            return self.status
        return f"{self.status}, incomplete: " + "; ".join(self.incomplete)

    def phase_completeness(self, phase: int) -> dict[str, Any] | None:
        """The completeness check of phase `phase`, or None when it has none (not closed yet)."""
        return next((c for c in self.completeness if c["phase"] == phase), None)

    def phase_kinds(self, phase: int, at_close: bool = False) -> list[KindRollup]:
        """The kinds of phase `phase`, in plan order; `at_close`: with the figures the phase counted
        (`KindRollup.at_close`), as its progress lines and its materialisation say them."""
        return [k.at_close() if at_close else k for k in self.kinds if k.phase == phase]

    def as_dict(self) -> dict[str, Any]:
        """The rollup as a plain dict (times as ISO text), with `counts_add_up` (`complete`: every
        check adds up - a stopped run's too, so not "the run is done"), `incomplete`, `unfinished`
        and `verdict`."""
        d = asdict(self)
        for key in ("started_at", "finished_at"):
            d[key] = d[key].isoformat() if d[key] else None
        d["counts_add_up"] = self.complete
        d["incomplete"] = self.incomplete
        d["unfinished"] = self.unfinished
        d["verdict"] = self.verdict
        return d


def rollup(db: Database, run_id: int) -> RunRollup:
    """The rollup of run `run_id` from its tasks' stats, the ledger and the run log; raises
    RunNotFound for an unknown run."""
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
        kr.kept_apart += int(r.get("kept_apart") or 0)
        for c in COUNTERS:
            setattr(kr, c, getattr(kr, c) + int(r[c]))
        if r.get("source_total") is not None:
            kr.source_total = max(kr.source_total or 0, int(r["source_total"]))
    for r in db.sql(_CREDITED, {"run_id": run_id}):
        counter, _, kind = r["key"].partition("@")
        if not counter or not kind:
            continue
        carrier = kinds.setdefault(r["task_kind"], KindRollup(kind=r["task_kind"], phase=r["phase"]))
        carrier.handed_over[counter] = carrier.handed_over.get(counter, 0) + int(r["n"])
        kr = kinds.get(kind)
        if kr is None:  # a kind no task kind of the plan is named after: the carrier's phase
            kr = kinds[kind] = KindRollup(kind=kind, phase=_phase_of(run, kind) if _in_plan(run, kind) else r["phase"])
        kr.caught_up[counter] = kr.caught_up.get(counter, 0) + int(r["n"])
    for r in db.fetch_all("rollup_left_to_catchup", {"run_id": run_id}):
        kr = kinds.setdefault(r["kind"], KindRollup(kind=r["kind"], phase=r["phase"]))
        kr.left[r["parent"]] = kr.left.get(r["parent"], 0) + int(r["n"])
    if not run.dry_run:  # a dry run keeps no records
        held = db.sql(_LEDGER_HELD, {"run_id": run.id, "waits": WAITS_FOR_WALK})
        closed = rollup_catchup.closed_phase_kinds(run, kinds)
        rollup_catchup.failed_by_catchup(closed, {r["kind"]: int(r["failed"]) for r in held})
        rollup_catchup.skipped_by_catchup(closed, {r["kind"]: int(r["skipped"]) for r in held})
    changes = ledger_reads.history_counts(db, run_id)
    for kind, counts in changes.items():
        # a ledger kind no task kind of the plan is named after: the plan's kind held under it (an
        # archived list taken alone), else a kind of its own
        kr = kinds.get(kind) or next((k for k in kinds.values() if rollup_catchup.ledger_kind_named(k.kind) == kind), None)
        if kr is None:
            kr = kinds[kind] = KindRollup(kind=kind, phase=_phase_of(run, kind))
        kr.deleted_at_source += counts.get("deleted", 0)
        kr.restored += counts.get("restored", 0)
    kind_list = list(kinds.values())
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
        kinds=kind_list,
        reasons=grouped_reasons(db, run_id, row["log"], dry_run=run.dry_run),
        started_at=row["started_at"], finished_at=row["finished_at"],
        seconds=runs_reads.active_seconds(row),
        stopped_seconds=float(row.get("stopped_seconds") or 0),
        completeness=completeness(db, run, kind_list),
        problems=run_problems(run, kind_list, changes) + still_waiting(db, run),
    )


# The failed and skipped records a run holds, per ledger kind, in one read of its entries: failed
# ones with those kept apart without a readable id (migration 0013), skipped ones but those waiting
# for the catch-up's walk - what `migrate rows` lists as failed and skipped.
_LEDGER_HELD = """
SELECT kind, sum(failed)::bigint AS failed, sum(skipped)::bigint AS skipped FROM (
    SELECT kind, count(*) FILTER (WHERE action = 'failed') AS failed,
           count(*) FILTER (WHERE action = 'skipped' AND position(%(waits)s IN COALESCE(reason, '')) = 0) AS skipped
      FROM migration_records
     WHERE migration_id = %(run_id)s AND action IN ('failed', 'skipped') GROUP BY kind
    UNION ALL
    SELECT kind, count(*), 0 FROM migration_unreadable WHERE migration_id = %(run_id)s GROUP BY kind
) held GROUP BY kind
"""


def run_problems(run: Run, kinds: list[KindRollup], changes: dict[str, dict[str, int]]) -> list[str]:
    """Run-wide checks (see the module docstring): the task stats' `updated` against the ledger
    history's `updated` + `restored` rows of the run. A dry run writes no history: not compared."""
    if run.dry_run:
        return []
    stats_updated = sum(k.updated for k in kinds)
    history_updated = sum(c.get("updated", 0) + c.get("restored", 0) for c in changes.values())
    if stats_updated == history_updated:
        return []
    return [f"{stats_updated} updated in the task stats but {history_updated} updates in the ledger's history "
            f"by this run"]


def still_waiting(db: Database, run: Run) -> list[str]:
    """The run-end check of the rows left to the catch-up's walk: a run that succeeded (its catch-up
    closed) holds no placeholder whose reason still `rows.WAITS_FOR_WALK` - one line per ledger
    kind that does ("persons: 2 rows still wait for the catch-up's walk"). Any other state: none
    (a run still walking, stopped or failed leaves them to its resume)."""
    if run.status != "succeeded" or run.dry_run:
        return []
    return [f"{kind}: {n} row{'' if n == 1 else 's'} still wait{'s' if n == 1 else ''} for the catch-up's walk"
            for kind, n in ledger_reads.waiting_counts(db, run.id).items()]


# Counters a task credited to another kind: its stats' "<counter>@<kind>" entries (the Pipedrive
# catch-up's `catchup_stats.PerKindStats`), summed per task kind.
_CREDITED = """
SELECT t.kind AS task_kind, min(t.phase) AS phase, e.key, sum(e.value::bigint) AS n
  FROM migration_tasks t CROSS JOIN LATERAL jsonb_each_text(t.stats) e
 WHERE t.migration_id = %(run_id)s AND position('@' IN e.key) > 1 AND e.value ~ '^-?[0-9]+$'
 GROUP BY t.kind, e.key ORDER BY t.kind, e.key
"""


def _in_plan(run: Run, kind: str) -> bool:
    return any(kind in group for group in run.plan)


def _phase_of(run: Run, kind: str) -> int:
    for i, group in enumerate(run.plan):
        if kind in group:
            return i
    return max(len(run.plan) - 1, 0)


def closed_phases(run: Run, kinds: list[KindRollup]) -> list[int]:
    """Phases whose barrier has passed, and the phase a terminal run ended on when none of its tasks
    is still pending or running (a run that failed or stopped there: its counts are final too)."""
    closed = [p for p in range(len(run.plan)) if p < run.current_phase]
    if run.status in ("succeeded", "failed", "stopped") and run.current_phase < len(run.plan):
        p = run.current_phase
        if not any(k.tasks.get("pending") or k.tasks.get("running") for k in kinds if k.phase == p):
            closed.append(p)
    return closed


def completeness(db: Database, run: Run, kinds: list[KindRollup]) -> list[dict[str, Any]]:
    """Per closed phase, whether its kinds add up (see the module docstring); problems as lines.

    A dry run writes no ledger rows, so only its stats and source counts are compared."""
    written = {r["kind"]: int(r["created"]) + int(r["matched"])
               for r in ledger_reads.written_by_kind(db, run.id)}
    out: list[dict[str, Any]] = []
    closed = closed_phases(run, kinds)
    # a run with a snapshot ends with a catch-up that brings the rows a phase's walk left
    # to it: until that last phase closes, a source's count not yet met is not a verdict
    pending = run.snapshot_at is not None and not run.terminal and (len(run.plan) - 1) not in closed
    waiting = ledger_reads.waiting_counts(db, run.id) if run.status == "stopped" and not run.dry_run else {}
    for phase in closed:
        mine = [k for k in kinds if k.phase == phase]
        problems: list[str] = []
        unfinished: list[str] = []
        for k in mine:
            if k.seen != k.accounted:
                problems.append(f"{k.kind}: {k.seen} seen but {k.accounted} accounted for "
                                f"(imported {k.imported}, matched {k.matched}, already here {k.already_here}, "
                                f"updated {k.updated}, skipped {k.skipped}, waiting {k.waiting}, failed {k.failed})")
            met = k.source_count_met()
            if met is False and not pending:
                caught = (f" (+{_n(k.caught_up, 'seen')} by the catch-up, {k.deleted_at_source} deleted at the source)"
                          if k.caught_up else "")
                line = f"{k.kind}: {k.seen} seen of the source's own count {k.source_total}{caught}"
                why = cut_short(run, kinds, phase, waiting)
                (unfinished if why else problems).append(f"{line} so far: {why}" if why else line)
        if not run.dry_run:
            problems.extend(rollup_catchup.beyond_listing(mine))
        stats_written = sum(k.written for k in mine)
        # per ledger kind the phase's rows are held under, once each: a phase of archived deals alone
        # claims them under `deals` (`rollup_catchup.ledger_kind_named`)
        ledger_written = sum(written.get(lk, 0) for lk in {rollup_catchup.ledger_kind_named(k.kind) for k in mine})
        if not run.dry_run and stats_written != ledger_written:
            problems.append(f"phase {phase + 1} ({', '.join(k.kind for k in mine)}): {stats_written} imported or "
                            f"matched in the task stats but {ledger_written} claimed in the ledger by this run")
        out.append({
            "phase": phase,
            "kinds": {k.kind: {"seen": k.seen, "accounted": k.accounted, "source_total": k.source_total,
                               "ledger_written": written.get(k.kind, 0), "updated": k.updated,
                               "deleted_at_source": k.deleted_at_source, "restored": k.restored,
                               "caught_up": dict(k.caught_up), "handed_over": dict(k.handed_over)}
                      for k in mine},
            "stats_written": stats_written,
            "ledger_written": None if run.dry_run else ledger_written,
            "complete": not problems,
            "problems": problems,
            "unfinished": unfinished,
        })
    return out


def cut_short(run: Run, kinds: list[KindRollup], phase: int, waiting: dict[str, int]) -> str | None:
    """Why a stopped run's source count of a kind of closed phase `phase` is not met yet, or None
    when the run did not stop short of it (a finished or failed run: the count is a verdict).
    The stop closed the phase itself when it cancelled its pending tasks (`runs.stop`: the walk did
    not finish), or closed it earlier but stopped before the last phase (the catch-up, which
    settles the `waiting` rows, one count per ledger kind, and lists every kind whole again).
    E.g. "the run stopped before phase 3 finished (2 tasks cancelled); `migrate run --tenant acme`
    resumes it"."""
    if run.status != "stopped":
        return None
    resume = f"`migrate run --tenant {run.tenant_id}` resumes it"
    cancelled = sum(k.tasks.get("cancelled", 0) for k in kinds if k.phase == phase)
    if phase == run.current_phase and cancelled:
        return (f"the run stopped before phase {phase + 1} finished ({cancelled} task{'' if cancelled == 1 else 's'} "
                f"cancelled); {resume}")
    last = len(run.plan) - 1
    if run.snapshot_at is not None and phase < last and run.current_phase <= last:
        n = sum(waiting.values())
        wait = f", {n} row{'' if n == 1 else 's'} wait{'s' if n == 1 else ''} for it" if n else ""
        return f"the run stopped before its catch-up{wait}; {resume}"
    return None


SAMPLES = 5  # example source ids kept per group of reasons


def grouped_reasons(db: Database, run_id: int, log_entries: list[dict[str, Any]] | None = None,
                    *, dry_run: bool = False) -> list[dict[str, Any]]:
    """Why rows or tasks did not land, grouped by the reason's shape, biggest first:
    [{kind, action, reason, count, samples, example}] where `reason` is the shape (ids and numbers
    as `{id}` / `{n}`, `runlog.reason_shape`: "not linked to any record: organizations {n} is not
    here"), `count` the rows (or tasks) of every reason of that shape, `samples` up to SAMPLES
    source ids of them, `example` one reason as it was written, the first sample's; `action` is "skipped"/"waiting"/"failed"
    (rows, counted from the ledger: the truth; waiting: `outcome_of`), "task failed" (tasks failed now, with their error),
    or the run log's level for notes that are not row outcomes (warnings such as bodies imported
    without their source's answer).

    Current state only: a row imported after a retry leaves the ledger's skipped/failed set and a
    task that succeeded after a retry is no longer failed, so their reasons go. The log's per-row
    and per-task errors are a sample of the same facts and are not read, except for a dry run, which writes no ledger placeholders."""
    if log_entries is None:
        row = db.fetch_one("get_run", {"run_id": run_id})
        log_entries = row["log"] if row else []
        dry_run = bool(row and row["dry_run"])
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}

    def add(kind: str, action: str, reason: str, count: int, samples: list[Any]) -> None:
        shape = reason_shape(reason)
        g = groups.setdefault((action, kind, shape), {"kind": kind, "reason": shape, "count": 0, "samples": [],
                                                      "action": action, "example": reason})
        g["count"] += count
        g["example"] = reason if samples and not g["samples"] else g["example"]  # the first sample ids' reason
        for sample in samples:
            if len(g["samples"]) < SAMPLES and str(sample) not in g["samples"]:
                g["samples"].append(str(sample))

    for r in ledger_reads.reasons(db, run_id):
        add(r["kind"], outcome_of(r["action"], r["reason"]), r["reason"] or "unknown", int(r["n"]),
            list(r["samples"] or []))
    for r in ledger_reads.unreadable_reasons(db, run_id):  # rows without a readable id (0013)
        add(r["kind"], r["action"], r["reason"], int(r["n"]), list(r["samples"] or []))
    for r in db.fetch_all("failed_task_reasons", {"run_id": run_id}):
        add(r["kind"], "task failed", r["reason"], int(r["n"]), [])
    outcomes = {(kind, shape) for (action, kind, shape) in groups}  # the ledger's rows and tasks
    for e in log_entries or []:
        level = e.get("level", "error")
        if level == "error" and not dry_run:
            continue  # rows: the ledger above; tasks: their current status above
        if (e.get("kind", ""), reason_shape(e.get("reason", ""))) in outcomes:
            continue  # a note of a row outcome the ledger already counts (a file's bytes not kept)
        samples = list(e.get("samples", []))
        # a dry run's row failures are only in its log ("error" notes of rows, not of tasks): said as the
        # outcome they are, as the ledger's are
        what = "failed" if level == "error" and not all(str(x).startswith("task ") for x in samples) else level
        add(e.get("kind", ""), what, e.get("reason", ""), int(e.get("count", 1)), samples)
    return sorted(groups.values(), key=lambda g: (-g["count"], g["kind"], g["action"], g["reason"]))


def duration_by_payload(db: Database, run_id: int, *, kind: str | None = None, stat: str = "imported",
                        top: int | None = None) -> list[dict[str, Any]]:
    """Task duration grouped by the task's own payload (the seed's first diagnostic query):
    [{payload: "0" | "1" | "2-3" | "4-7" | ..., tasks, avg_seconds, max_seconds}], buckets in powers
    of two of the stat's value so they follow the payload's distribution. `top` is accepted for
    older callers and ignored (it made every payload from 3 up one bucket)."""
    return db.fetch_all("duration_by_payload", {"run_id": run_id, "kind": kind, "stat": stat})


def outcome_of(action: str, reason: str | None) -> str:
    """A ledger entry's outcome as the run counts it: `rows.WAITING` for a placeholder whose reason
    leaves a parent to the catch-up's walk (`rows.WAITS_FOR_WALK`), else its action."""
    return WAITING if action == "skipped" and WAITS_FOR_WALK in (reason or "") else action


def phase_rows(db: Database, run_id: int, kinds: list[str], limit: int) -> list[dict[str, Any]]:
    """Run `run_id`'s skipped, waiting and failed rows of `kinds`, with their reasons, at most
    `limit`: the failed first (those without a readable id among them, under their raw key), then
    by kind and id. Each {"kind", "source_id", "action" ("waiting": `outcome_of`), "reason", "created_at"}."""
    rows = db.fetch_all("phase_rows_with_reasons", {"run_id": run_id, "kinds": kinds, "limit": limit})
    return [{**r, "action": outcome_of(r["action"], r["reason"])} for r in rows]


CLAIMED_OF_LIVE_RUN = """
SELECT t.locked_by FROM migration_tasks t JOIN migrations m ON m.id = t.migration_id
 WHERE m.id = %(run_id)s AND m.status IN ('running', 'stopping') AND t.status = 'running'
"""


def no_live_worker_since(db: Database, run_id: int) -> datetime | None:
    """When run `run_id` was last worked on (UTC: its heartbeat, a task's checkpoint, a lock
    renewed), if it is live (running or stopping), has claimed tasks, and every claimed task's
    worker ("<host>:<pid>:<n>", `worker.default_worker_id`) is a process of this host that no longer
    exists; else None. A worker of another host, of another id form, or whose pid runs (perhaps
    reused) counts as live: those are left to the stale-lock threshold. Why: after a `kill -9` of
    `migrate run` its tasks stay "running" until their locks age, and a status reading them
    would promise an ETA no process is working towards."""
    here = socket.gethostname() + ":"
    workers = [r["locked_by"] or "" for r in db.sql(CLAIMED_OF_LIVE_RUN, {"run_id": run_id})]
    if not workers:
        return None
    for w in workers:
        if not w.startswith(here):
            return None
        try:
            pid = int(w[len(here):].split(":", 1)[0])
        except ValueError:
            return None
        if pid <= 0 or process_alive(pid):
            return None
    idle = float(db.fetch_one("run_idle_seconds", {"run_id": run_id})["idle_seconds"])
    return (datetime.now(timezone.utc) - timedelta(seconds=idle)).replace(microsecond=0)
