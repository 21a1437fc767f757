"""The phase barrier: seed a phase, and close it exactly once when its last task has settled.

A phase starts only when the one before it has closed; the fenced `advance_phase` query lets one
caller win, and that winner seeds the next phase, finalises the run, or fails it at this phase.
"""
from __future__ import annotations

from engine_core import owed_links, statistics
from engine_core.config import Settings
from engine_core.db import Conn, Database
from engine_core.models import Run
from engine_core.runlog import RunLog
from engine_core.source import Provider
from engine_core.topup import WORK, insert_tasks, top_up


def seed_phase(tx: Conn, run: Run, phase: int, provider: Provider) -> int:
    """Create the phase's tasks, and the next phase's early ones: a seed whose cursor
    says `early` only reads the source and hands on tasks of its own phase (a discovery), so it
    may run while this phase's tail runs (`claim_next`); the next phase's own seeding finds it
    made (find-or-create). Returns how many tasks were new."""
    created = 0
    for kind in run.plan[phase]:
        created += insert_tasks(tx, run, phase, kind, provider.seed_cursors(run, kind))
    if phase + 1 < len(run.plan):
        for kind in run.plan[phase + 1]:
            early = [s for s in provider.seed_cursors(run, kind) if s.cursor.get("early") is True]
            if early:
                created += insert_tasks(tx, run, phase + 1, kind, early)
    return created


def advance_phase(db: Database, run_id: int, phase: int, provider: Provider, settings: Settings,
                  *, background_statistics: bool = False) -> bool:
    """Try to close `phase`. Exactly one caller wins; returns whether this one did.

    The winner seeds the next phase, or finalises the run after the last one, or - when the phase
    closed with failed tasks - fails the run at that phase (no drainer works on past a
    failed phase; `runs.retry` re-arms the failed tasks and rewinds to it) and writes one grouped
    run-log entry per failed kind. After the barrier commits, the winner analyzes what the phase
    grew (`statistics.after_advance`; on the process's statistics thread with
    `background_statistics`). The barrier holds while any task of the phase is pending,
    running or cancelled. A phase whose tasks all exist already (a rewound retry) or
    that seeds nothing closes at once.
    """
    won_any = failed_here = finalized = False
    while True:
        with db.transaction() as tx:
            row = tx.fetch_one("advance_phase", {"run_id": run_id, "phase": phase})
            if row is None:
                break
            won_any = True
            if row["failed_tasks"]:
                _log_failed_phase(tx, row, phase, settings)
                failed_here = True  # the run failed at this phase: nothing to seed or top up
                break
            run = Run.from_row(row)
            if run.current_phase < len(run.plan):
                seed_phase(tx, run, run.current_phase, provider)
            else:
                ended = tx.fetch_one("finalize_run", {"run_id": run_id})
                # the links earlier runs left owed to this run's kinds, filled from the ledger, and said
                filled = owed_links.fill(tx, run, settled=bool(ended and ended["status"] == "succeeded"))
                _log_filled(tx, run, filled, settings)
                finalized = True
                break
        phase = run.current_phase
    if won_any and not failed_here:
        top_up(db, run_id, settings)
    if won_any:
        WORK.notify()  # the run moved on (or ended): this process's idle lanes look again now
    # after the barrier commits; never raises. A lane's worker analyzes in the background
    # while a next phase runs; the run's end (finalised or failed) waits for it as it always did
    statistics.after_advance(db, closed=won_any,
                             background=background_statistics and not (finalized or failed_here))
    return won_any


def _log_filled(tx: Conn, run: Run, filled: owed_links.Filled, settings: Settings) -> None:
    """One "info" run-log entry per parent kind whose owed links the run's end filled, counted in
    links: what status, report and the last phase's metadata say of the fill."""
    if not filled:
        return
    log = RunLog(run.id, None, cap=settings.log_cap)
    for kind, (n, line) in owed_links.filled_lines(filled).items():
        log.note("info", kind, line)
        log.groups[next(reversed(log.groups))]["count"] = n  # links, not notes
    log.flush(tx)


def _log_failed_phase(tx: Conn, run_row: dict, phase: int, settings: Settings) -> None:
    """One grouped entry per kind whose tasks failed the phase, in the barrier's transaction."""
    plan = run_row["plan"]
    kinds = ", ".join(plan[phase]) if phase < len(plan) else "?"
    log = RunLog(run_row["id"], None, cap=settings.log_cap)
    for r in tx.fetch_all("phase_failed_tasks", {"run_id": run_row["id"], "phase": phase}):
        reason = (f"phase {phase + 1} ({kinds}) closed with {r['n']} failed {r['kind']} task(s): the run "
                  f"failed at this phase and nothing later was started (retry re-arms them); first: {r['reason']}")
        log.note("error", r["kind"], reason[:500], subject=f"task {r['first_task']}")
        log.groups[next(reversed(log.groups))]["count"] = int(r["n"])  # tasks, not notes
    log.flush(tx)
