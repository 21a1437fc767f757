"""A run's life: admission, start, stop, retry, resume; and a sync.

Admission is fenced by a partial unique index (one live run per tenant and source), so fifty
concurrent starts admit exactly one, and retry/resume pass the same check when they reopen a run.

A run is a snapshot plus a catch-up. Starting a run records its snapshot moment
(`migrations.snapshot_at`): the source's clock where the provider can read it (`source_time`,
Pipedrive's `Date` header), the database's otherwise. The provider's walks cover what the source had
at that moment, and its catch-up phase (`catchup_kind`, the plan's last group, kept even in a run
limited to some kinds) brings what changed since - rows created, changed (updated in place through
the ledger), deleted (marked) - before the run succeeds. A sync (`start_sync`, mode 'sync') is the
same run - same phases, claims, windows, budget, stop/retry/resume - bringing what changed since
the last succeeded run's or sync's snapshot (`migrations.since`): the provider decides how (the
Pipedrive provider's sync is its catch-up phase: the id listings deletions need carry the changed
rows; with the option `detect_deletes: false` it lists only rows updated since `since` minus
`SNAPSHOT_MARGIN_SECONDS`, the margin for the clocks of the source's servers). The example
provider has no catch-up phase: its source holds still, so its runs are their snapshot.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import errors as pg_errors
from psycopg.types.json import Jsonb

from engine_core.config import Settings
from engine_core.db import Database
from engine_core.errors import (AdmissionRefused, ConfigError, EngineError, NothingToDo, NothingToSync, RunNotFound,
                                SourceMismatch, TenantSourceMismatch)
from engine_core.models import Run
from engine_core.plan import choose_kinds, plan_for, plan_number
from engine_core.barrier import advance_phase, seed_phase
from engine_core.coverage import coverage
from engine_core.topup import top_up
from engine_core.reaper import release_dead_here, release_stale_of_run
from engine_core.runlog import RunLog
from engine_core.runs_reads import tenant_sources
from engine_core.source import (MAX_MARGIN_SECONDS, SNAPSHOT_MARGIN_SECONDS, Provider, catchup_kind,  # noqa: F401
                                dependents, identity_of, margin_option, opt_in_kinds, snapshot_margin, source_time)

MODES = ("full", "sync")


class RunStillStopping(EngineError):
    """A stopping run did not settle in time: a task has not reached a stop point yet."""


class AlreadyMigrated(EngineError):
    """The tenant's succeeded full runs already took what a launch asks for (`migrated_by`): a launch
    that is not a sync and does not ask for a new run explicitly starts nothing ("Materialize all" on a
    migrated tenant started a whole new full run, ~83% of a migration's source tokens, writing
    nothing). `run` is the succeeded run a refusal names."""

    def __init__(self, run: Run) -> None:
        self.run = run
        super().__init__(f"{run.name} already succeeded{' (a dry run)' if run.dry_run else ''}; a new full run would "
                         "list the whole account again and write nothing new")


def get_run(db: Database, run_id: int) -> Run:
    """Run `run_id`; raises RunNotFound when there is none."""
    row = db.fetch_one("get_run", {"run_id": run_id})
    if row is None:
        raise RunNotFound(f"no migration run #{run_id}")
    return Run.from_row(row)


def live_run(db: Database, tenant_id: str, source: str) -> Run | None:
    """The tenant's live run (not ended) of `source`, or None. A `stopping` run with nothing running
    is settled here (`settle_stop`) and is no longer live: whoever should have settled it is gone
    (a worker's process ended between its task's release and the settle), and a launch must resume
    it, not join a run nobody drives."""
    row = db.fetch_one("live_run_for_tenant", {"tenant_id": tenant_id, "source": source})
    if row and row["status"] == "stopping" and db.fetch_one("settle_stop", {"run_id": row["id"]}):
        return None
    return Run.from_row(row) if row else None


def latest_run(db: Database, tenant_id: str, source: str | None = None) -> Run:
    """The tenant's latest run (of `source`, or of any source when None); raises RunNotFound when
    the tenant has none, or none of `source` ("tenant 'acme' has no run of source 'x' (its runs are
    of: pipedrive)": a tenant known by another source's runs is not a tenant without runs)."""
    row = db.fetch_one("latest_run_for_tenant", {"tenant_id": tenant_id, "source": source})
    if row is None:
        others = tenant_sources(db, tenant_id) if source is not None else []
        if others:
            raise RunNotFound(f"tenant {tenant_id!r} has no run of source {source!r} "
                              f"(its runs are of: {', '.join(others)})")
        raise RunNotFound(f"tenant {tenant_id!r} has no migration run")
    return Run.from_row(row)


def latest_runs(db: Database, source: str | None = None) -> list[tuple[Run, dict[str, int]]]:
    """Every tenant's latest run (of `source`, or per source), by tenant then source, each with its
    tasks' counts by status ({"succeeded": 40, "running": 2}); [] when no run exists."""
    return [(Run.from_row(row), {k: int(v) for k, v in sorted(row["task_counts"].items())})
            for row in db.fetch_all("latest_runs", {"source": source})]


def _refuse(db: Database, tenant_id: str, source: str) -> AdmissionRefused:
    other = live_run(db, tenant_id, source)
    if other is None:
        return AdmissionRefused(f"another run of {source} for tenant {tenant_id!r}")
    return AdmissionRefused(other.name, other.id)


def run_plan(provider: Provider, kinds: Iterable[str] | None = None) -> list[list[str]]:
    """The phases a run needs for a kinds choice (`plan.choose_kinds`: None takes the default
    kinds, `+name`/`-name` adjust them, plain names are exactly those), with the provider's
    catch-up phase kept last even when `kinds` leaves it out (a run limited to notes still catches
    up on the notes). Raises ConfigError naming unknown kinds."""
    plan = plan_for(provider.phases(), choose_kinds(provider.phases(), kinds, opt_in_kinds(provider)))
    ck = catchup_kind(provider)
    if ck is not None and not any(ck in group for group in plan):
        plan.append([ck])
    return plan


def start_run(
    db: Database,
    provider: Provider,
    tenant_id: str,
    *,
    kinds: Iterable[str] | None = None,
    dry_run: bool = False,
    options: dict[str, Any] | None = None,
    settings: Settings | None = None,
    mode: str = "full",
    since: datetime | None = None,
) -> Run:
    """Admit a new run, record its snapshot moment, seed its first phase and put it on the lane.

    `mode`: "full" or "sync" (use `start_sync`, which finds `since`). Raises AdmissionRefused
    (another live run of the tenant and source), ConfigError (unknown kind or mode, or an option
    the provider's `check_options` refuses), TenantSourceMismatch (the provider reaches another
    source than the tenant's data came from: `check_tenant_identity`)."""
    settings = settings or Settings.from_env()
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    check_options = getattr(provider, "check_options", None)
    if callable(check_options):  # before the run exists: a bad value stored with it failed every task
        check_options(options or {})
    if mode == "sync" and since is None:
        raise ConfigError("a sync needs since (the last succeeded run's snapshot): use runs.start_sync")
    plan = run_plan(provider, kinds)
    identity = identity_of(provider, db=db)  # before the transaction: it may ask the source
    check_tenant_identity(db, tenant_id, provider.source, identity)
    snapshot = source_time(provider, db)  # the source's clock; None: the database's (now() below)
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
            row = tx.sql(
                "UPDATE migrations SET mode = %(mode)s, snapshot_at = COALESCE(%(snapshot)s, now()), since = %(since)s"
                " WHERE id = %(id)s RETURNING *",
                {"mode": mode, "snapshot": snapshot, "since": since, "id": row["id"]},
            )[0]
            run = Run.from_row(row)
            seed_phase(tx, run, 0, provider)
    except pg_errors.UniqueViolation:
        raise _refuse(db, tenant_id, provider.source) from None
    top_up(db, run.id, settings)
    advance_phase(db, run.id, 0, provider, settings)  # a phase that seeded nothing closes at once
    return get_run(db, run.id)


def tenant_identity(db: Database, tenant_id: str, source: str) -> tuple[str, str] | None:
    """What the tenant's data of `source` came from: (run name, source identity) of its latest run
    that recorded one (dry runs wrote nothing and do not count), or None for a tenant without."""
    rows = db.sql(
        "SELECT id, source_identity FROM migrations WHERE tenant_id = %(t)s AND source = %(s)s"
        " AND source_identity IS NOT NULL AND NOT dry_run ORDER BY id DESC LIMIT 1",
        {"t": tenant_id, "s": source})
    return (f"run #{rows[0]['id']}", rows[0]["source_identity"]) if rows else None


def check_tenant_identity(db: Database, tenant_id: str, source: str, identity: str | None) -> None:
    """Refuse settings that reach another source than the tenant's data came from
    (`tenant_identity`): TenantSourceMismatch, before anything is read or written. A run binds its
    workers to its identity (`worker`, SourceMismatch); this binds the tenant's next runs, syncs and
    verifies to it too (a sync with another company's settings had updated the tenant's rows with
    that company's). `identity` None (the source could not tell now) is not judged here: the run's
    tasks bind it when they meet it."""
    if identity is None:
        return
    known = tenant_identity(db, tenant_id, source)
    if known is not None and known[1] != identity:
        raise TenantSourceMismatch(tenant_id, known[0], known[1], identity)


def last_snapshot(db: Database, tenant_id: str, source: str) -> datetime | None:
    """The snapshot moment of the tenant's last succeeded (not dry) run or sync of `source`: what a
    sync starts from. A run from before snapshots were kept counts with its start time. "Last" is
    by start, not by snapshot: a snapshot is the source's `Date` (whole seconds, and a server may
    serve one up to a second old) or that plus the time since it was asked, so a sync's snapshot
    can sort before the run it synced when both fall in one second."""
    rows = db.sql(
        "SELECT COALESCE(snapshot_at, started_at) AS at FROM migrations"
        " WHERE tenant_id = %(t)s AND source = %(s)s AND status = 'succeeded' AND NOT dry_run"
        " ORDER BY started_at DESC, id DESC LIMIT 1",
        {"t": tenant_id, "s": source},
    )
    return rows[0]["at"] if rows else None


def synced_kinds(db: Database, tenant_id: str, provider: Provider) -> list[str] | None:
    """The kinds a sync takes when it names none: every kind any succeeded (not dry) run or sync of
    the tenant took, catch-up kind aside, in plan order - an opt-in kind taken stays in sync, and a
    kind run alone later (`--kinds deal_history`, as the README says) does not drop the rest; None
    (the defaults): no such run."""
    rows = db.sql(
        "SELECT plan FROM migrations WHERE tenant_id = %(t)s AND source = %(s)s AND status = 'succeeded'"
        " AND NOT dry_run", {"t": tenant_id, "s": provider.source})
    taken = {k for row in rows for group in row["plan"] for k in group}
    ck = catchup_kind(provider)
    kinds = [k for group in provider.phases() for k in group if k in taken and k != ck]
    return kinds or None


def start_sync(db: Database, provider: Provider, tenant_id: str, **options: Any) -> Run:
    """Start a sync of the tenant (mode 'sync'): the same phases, claims, windows, budget and
    stop/retry/resume as a run, listing only what changed since the last succeeded run's or sync's
    snapshot (`last_snapshot`), plus the id listings deletions need (the catch-up phase).

    `options`: `start_run`'s keywords (kinds, dry_run, options, settings); without kinds, those
    of the run it syncs from (`synced_kinds`). Returns the new Run. Raises NothingToSync (one line, names the tenant) when the tenant has no succeeded run or sync
    of this source; AdmissionRefused when another run of the tenant is live."""
    options.pop("mode", None)
    options.pop("since", None)
    since = last_snapshot(db, tenant_id, provider.source)
    if since is None:
        raise NothingToSync(f"tenant {tenant_id!r} has no succeeded {provider.source} run or sync to sync from; "
                            "run a full migration first")
    options["kinds"] = options.get("kinds") or synced_kinds(db, tenant_id, provider)
    return start_run(db, provider, tenant_id, mode="sync", since=since, **options)


def start_or_join(db: Database, provider: Provider, tenant_id: str, **kwargs: Any) -> tuple[Run, bool]:
    """The live run of the tenant if there is one, else a new one; (run, started). `mode="sync"`
    starts a sync (`start_sync`: NothingToSync propagates)."""
    mode = kwargs.pop("mode", "full") or "full"
    for _ in range(3):
        current = live_run(db, tenant_id, provider.source)
        if current is not None:
            return current, False
        try:
            if mode == "sync":
                return start_sync(db, provider, tenant_id, **kwargs), True
            return start_run(db, provider, tenant_id, mode=mode, **kwargs), True
        except AdmissionRefused:
            continue  # lost a race to another starter: join theirs
    raise _refuse(db, tenant_id, provider.source)


def stop(db: Database, run_id: int, settings: Settings | None = None) -> Run:
    """Set the stop flag (checked before every claim) and cancel what has not started; the stop
    settles (`stopped`) once nothing of the run is running.

    A running task whose worker died (kill -9, a lost host) never reaches a stop point: its lock,
    renewed every third of MIGRATE_STALE_LOCK_SECONDS by a live worker's lock keeper, goes stale,
    and the stop cancels it here (`reaper.release_stale_of_run`) instead of waiting for the
    reaper's tick - or for ever, with no daemon. So a run is `stopping` at most
    MIGRATE_STALE_LOCK_SECONDS after its last live worker is gone, once `stop` is called again
    (`migrate stop --force` does so until it settles)."""

    settings = settings or Settings.from_env()
    with db.transaction() as tx:
        tx.fetch_one("request_stop", {"run_id": run_id})
        tx.execute("cancel_pending_tasks", {"run_id": run_id})
    if get_run(db, run_id).status == "stopping":
        release_stale_of_run(db, run_id, settings.stale_lock_seconds)
    db.fetch_one("settle_stop", {"run_id": run_id})
    return get_run(db, run_id)


def held_tasks(db: Database, run_id: int) -> list[dict[str, Any]]:
    """The run's running tasks with their worker (`locked_by`) and the age of their lock in
    seconds (`lock_age`): what a stopping run waits for."""
    return db.sql(
        "SELECT id, kind, locked_by, EXTRACT(EPOCH FROM now() - locked_at)::float AS lock_age"
        " FROM migration_tasks WHERE migration_id = %(r)s AND status = 'running' ORDER BY id",
        {"r": run_id},
    )


def stop_until_settled(db: Database, run_id: int, settings: Settings | None = None,
                       on_wait: Any = None, poll: float = 1.0) -> Run:
    """`stop`, then again until the run settles: a live worker's task reaches its stop point, a
    dead worker's lock goes stale (MIGRATE_STALE_LOCK_SECONDS after its last renewal) and is
    cancelled. Bounded: gives up (returns the run, still `stopping`) after twice the stale-lock
    threshold plus 30 s - only a worker that is alive and renewing its lock yet never reaches a
    stop point can outlast it. `on_wait(held_tasks)` is called once a second while waiting."""
    import time

    settings = settings or Settings.from_env()
    deadline = time.monotonic() + 2 * settings.stale_lock_seconds + 30
    said = 0.0
    run = stop(db, run_id, settings)
    while run.status == "stopping" and time.monotonic() < deadline:
        if on_wait is not None and time.monotonic() - said >= 1.0:
            on_wait(held_tasks(db, run_id))
            said = time.monotonic()
        time.sleep(poll)
        run = stop(db, run_id, settings)
    return run


def pause(db: Database, run_id: int, reason: str) -> Run:
    """Stop a run for a reason outside it (the source failing every request for minutes): the
    reason goes to the run log as a warning (shown in the grouped reasons), then `stop`. Resuming
    (`resume`, or launching the partition again) carries on from the checkpoints."""

    log = RunLog(run_id, None)
    log.note("warning", "source", f"paused: {reason}")
    with db.transaction() as tx:
        log.flush(tx)
    return stop(db, run_id)


def note_stop(db: Database, run_id: int, by: str, unless_noted_since: datetime | None = None) -> None:
    """Say in the run's log who stopped it: "stopped " + `by` ("from Dagster (Dagster run 1a2b3c4d
    terminated)"), an "info" entry that `migrate status` shows among the run's grouped reasons, as a
    pause's reason is. The stop flag itself says only that a stop was asked for, not by whom.
    `unless_noted_since`: nothing is written when a stop was noted at or after that moment (the
    terminate that follows `migrate stop`'s own stop is that stop, not a second one)."""
    if unless_noted_since is not None and stop_noted(db, run_id, unless_noted_since):
        return
    log = RunLog(run_id, None)
    log.note("info", "run", f"stopped {by}")
    with db.transaction() as tx:
        log.flush(tx)


def stop_noted(db: Database, run_id: int, since: datetime) -> str | None:
    """The latest "stopped ..." entry `note_stop` wrote in the run's log at or after `since` (the
    log's times are whole seconds), or None."""
    (row,) = db.sql("SELECT log FROM migrations WHERE id = %(id)s", {"id": run_id}) or [{"log": []}]
    floor = since.replace(microsecond=0).isoformat(timespec="seconds")
    said = [e for e in row["log"] or [] if e.get("kind") == "run" and str(e.get("reason", "")).startswith("stopped ")
            and datetime.fromisoformat(e["at"]) >= datetime.fromisoformat(floor)]
    return said[-1]["reason"] if said else None


def _reopen(db: Database, run_id: int, statuses: list[str], provider: Provider, settings: Settings) -> Run:
    run = get_run(db, run_id)
    # settings that reach another source reopen nothing: the run stays as it is (reopened, every
    # task would refuse to claim - SourceMismatch - while status showed it running with an ETA)
    identity = identity_of(provider, db=db)
    if identity is not None and run.source_identity is not None and identity != run.source_identity:
        raise SourceMismatch(run.name, run.source_identity, identity)
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
    """Re-arm a stopped run's cancelled tasks; checkpoints make them resume where they were.
    SourceMismatch (nothing changed) when `provider` reaches another source than the run reads;
    `retry` likewise."""
    settings = settings or Settings.from_env()
    return _reopen(db, run_id, ["cancelled"], provider, settings)


# -- run policy: which engine run a launch works on, and how it is prepared ----------------------

STOP_SETTLE_SECONDS = 30.0


@dataclass(frozen=True)
class Attached:
    """The engine run a launch works on and how it got it.

    `action`: "attached" (the run the launch already worked on), "joined" (the tenant's live run),
    "rerun" (the latest run, failed or stopped: `prepare` retries or resumes it), "started" (new),
    then after `prepare`: "resumed", "retried", "restarted" (a stopped run with nothing to resume:
    a new run with its kinds and options) or "ready" (nothing to prepare). `message` is one line."""

    run: Run
    action: str
    message: str = ""


def migrated_by(db: Database, tenant_id: str, provider: Provider, start_kwargs: dict[str, Any] | None) -> Run | None:
    """The succeeded run a new full run with `start_kwargs` would only repeat, or None.

    The rule: the tenant's latest run of the provider's source succeeded, and every kind the new
    run would plan (`run_plan`) was taken by some succeeded full run of the tenant and source -
    the runs together, not one alone - that is not a dry run unless the new run is one too.
    Together: a kind run alone later (`--kinds deal_history`, as the README adds an opt-in kind)
    leaves the tenant as migrated as the runs before it made it. Full runs only: a sync lists only
    what changed, so a kind a sync alone took never came over whole. A sync (`mode="sync"`) repeats
    nothing: bringing what changed is what it is for. Returns the latest of those runs: the run a
    refusal names, the one `migrate status` shows. When only some kinds are covered the launch takes
    the others (`coverage.coverage`), and this is None."""
    got = coverage(db, tenant_id, provider, start_kwargs)
    return got.by if got is not None and got.complete else None


def existing_attachment(db: Database, tenant_id: str, source: str) -> Attached | None:
    """Steps 2 and 3 of `attach`: the tenant's live run of `source` ("joined"), else its latest run
    when that failed or was stopped ("rerun"); None when a launch would start a new run or meet a
    succeeded one. `migrate run` asks this too, for its note on flags a relaunch ignores, so the
    note and the launch cannot disagree about which run is worked on."""
    current = live_run(db, tenant_id, source)
    if current is not None:
        return Attached(current, "joined", f"joined {current.name}")
    try:
        latest = latest_run(db, tenant_id, source)
    except RunNotFound:
        return None
    if latest.status in ("failed", "stopped"):
        return Attached(latest, "rerun", f"rerunning {latest.name} ({latest.status})")
    return None


def attach(
    db: Database,
    provider: Provider,
    tenant_id: str,
    *,
    tagged_run_id: int | None = None,
    may_start: bool = True,
    start_kwargs: dict[str, Any] | None = None,
    new_run: bool = False,
) -> Attached:
    """Which engine run a launch for `tenant_id` works on (the policy both Dagster faces call):

    1. the run the launch already worked on (`tagged_run_id`, kept by re-execution) if it is this
       tenant's and this source's;
    2. else the tenant's live run (join);
    3. else the latest run when it failed or was stopped (a rerun: `prepare` retries or resumes it);
    4. else, when the tenant's succeeded runs already took every kind `start_kwargs` asks for
       (`migrated_by`), AlreadyMigrated naming such a run - unless `new_run` asks for a new run
       explicitly (a sync never repeats one);
    5. else, when `may_start`, a new run (admission as in `start_run`; AdmissionRefused propagates)
       of the kinds asked for that no succeeded full run took (`coverage.Coverage.lacking`: kinds
       a run took are never walked again by a launch that does not ask for a new run), its message
       then opening with the line saying so (`Coverage.line`).

    A drainer passes `may_start=False` and gets None-free answers only for runs that exist: it raises
    RunNotFound when there is nothing to join."""
    source = provider.source
    if tagged_run_id is not None:
        try:
            tagged = get_run(db, tagged_run_id)
            if tagged.tenant_id == tenant_id and tagged.source == source:
                return Attached(tagged, "attached")
        except RunNotFound:
            pass
    existing = existing_attachment(db, tenant_id, source)
    if existing is not None:
        return existing
    if not may_start:
        raise RunNotFound(f"tenant {tenant_id!r} has no live {source} run to join")
    covered = None if new_run else coverage(db, tenant_id, provider, start_kwargs)
    if covered is not None and covered.complete:
        raise AlreadyMigrated(covered.by)  # type: ignore[arg-type]  # complete: some run took them
    narrowed = covered is not None and covered.partial
    run, started = start_or_join(db, provider, tenant_id,
                                 **(covered.narrowed(start_kwargs) if narrowed else (start_kwargs or {})))
    plan = " -> ".join("[" + ", ".join(g) + "]" for g in run.plan)
    said = f"{covered.line(tenant_id)}; " if narrowed and started else ""  # type: ignore[union-attr]
    return Attached(run, "started" if started else "joined",
                    f"{said}{'started' if started else 'joined'} {run.name}: {plan}")


def settle_stopping(db: Database, run_id: int, timeout: float = STOP_SETTLE_SECONDS) -> Run:
    """Wait up to `timeout` s for a stopping run's running tasks to reach a stop point; `stop` is
    idempotent and settles the stop once nothing runs."""
    import time

    run = get_run(db, run_id)
    deadline = time.monotonic() + timeout
    while run.status == "stopping" and time.monotonic() < deadline:
        run = stop(db, run.id)
        if run.status == "stopping":
            time.sleep(0.5)
    return run


def prepare(db: Database, run_id: int, provider: Provider, settings: Settings | None = None) -> Attached:
    """Once per launch (a rerun of a failed or stopped partition is the engine's retry):

    * a stopping run is given STOP_SETTLE_SECONDS to settle (RunStillStopping if it does not);
    * a stopped run resumes: its cancelled and failed tasks are re-armed (`retry`); one stopped
      between phases with nothing to re-arm is restarted as a new run with its kinds and options;
    * a run with failed tasks (failed at a phase, or still running) is retried: failed tasks
      re-armed, barrier rewound to the earliest (`retry`);
    * anything else is "ready" as it is.
    First, tasks held by workers whose process is gone from this host (a `migrate run` killed with
    SIGKILL) are released at once (`reaper.release_dead_here`), not after the stale-lock threshold.
    AdmissionRefused propagates (another live run of the tenant)."""

    settings = settings or Settings.from_env()
    release_dead_here(db, run_id)
    run = get_run(db, run_id)
    if run.status == "stopping":
        run = settle_stopping(db, run.id)
        if run.status == "stopping":
            raise RunStillStopping(f"{run.name} is still stopping (a task has not reached a stop point); "
                                   "launch it again once it has stopped")
    try:
        if run.status == "stopped":
            run = retry(db, run.id, provider, settings)
            return Attached(run, "resumed", f"resumed {run.name} from its checkpoints at phase "
                                            f"{plan_number(provider.phases(), run, run.current_phase)}")
        if db.fetch_one("failed_task_reasons", {"run_id": run.id}) is not None:
            run = retry(db, run.id, provider, settings)
            return Attached(run, "retried", f"retrying {run.name}: failed tasks re-armed, barrier at phase "
                                            f"{plan_number(provider.phases(), run, run.current_phase)}")
    except NothingToDo:
        if run.status == "stopped":
            new, _ = start_or_join(db, provider, run.tenant_id, options=dict(run.options), dry_run=run.dry_run,
                                   kinds=list(run.kinds), mode=run.mode)
            return Attached(new, "restarted", f"{run.name} was stopped with no task to resume; started {new.name}")
        raise
    return Attached(run, "ready")


def rerun(
    db: Database,
    provider: Provider,
    tenant_id: str,
    *,
    tagged_run_id: int | None = None,
    prepare_run: bool = True,
    may_start: bool = True,
    start_kwargs: dict[str, Any] | None = None,
    settings: Settings | None = None,
    new_run: bool = False,
) -> list[Attached]:
    """`attach` then, when `prepare_run`, `prepare`: the steps taken, the last one's run is the
    one to drain. A launch prepares once (its first phase op); later ops of the same launch only
    attach to the tagged run."""
    steps = [attach(db, provider, tenant_id, tagged_run_id=tagged_run_id, may_start=may_start,
                    start_kwargs=start_kwargs, new_run=new_run)]
    if prepare_run:
        steps.append(prepare(db, steps[-1].run.id, provider, settings))
    return steps
