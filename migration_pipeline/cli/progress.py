"""Progress of a launched run on the console: one line per change of its phase or counts (a pipe,
a log), or one rich bar per phase (a terminal), and what its source is retrying."""
from __future__ import annotations

import time
from typing import Any

from engine_core import db as dbmod
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.progress import ProgressBoard
from migration_pipeline.cli.output import console, err_console, open_db
from migration_pipeline.cli.tables import phase_labels, phase_number, written_columns


def phase_state(dagster_status: str, r: rollups.RunRollup, phase: int) -> str:
    """What a progress line says of the phase the engine run's barrier is on: "queued" (the Dagster
    run waits for a lane slot), "running", "closed" (the barrier moved past it), "stopping",
    "stopped", "failed", "succeeded" (the run's own terminal status)."""
    if dagster_status == "QUEUED":
        return "queued"
    if r.status == "running":
        return "closed" if r.current_phase > phase else "running"
    return r.status


def phase_label(r: Any, phase: int) -> str:
    """How a progress line numbers the run's phase `phase` (its index in the run's plan): "N/M" by
    the provider's whole plan, as the phase assets are numbered (`tables.phase_number`)."""
    return "{}/{}".format(*phase_number(getattr(r, "source", ""), r.phases[phase], phase + 1, len(r.phases)))


class Progress:
    """One line per change of the engine run's phase or counts while the Dagster run works, on
    stdout, or on stderr under --json (`out`: stdout is then the JSON document alone)."""

    EVERY = 10.0  # seconds between lines while the phase does not change

    RETRIES_EVERY = 1.0  # seconds between two reads of the run's progress observations

    # An engine run's states, seen before it has run under this command, that are what the launch
    # resumes or retries: a resumed run's phase had its line twice, "stopped" then "running"
    BEFORE = ("stopped", "stopping", "failed")

    def __init__(self, as_json: bool, instance: Any = None) -> None:
        self.as_json = as_json
        self.out = err_console if as_json else console  # where the lines (or bars) go
        self.instance = instance  # the Dagster instance: the phase op's progress observations (retries)
        self.last: tuple | None = None
        self.printed = 0.0
        self.phase_printed: int | None = None  # the phase the last line was printed for (the current one then)
        self.db: dbmod.Database | None = None
        self.observed: str | None = None  # cursor of the run's observations read so far
        self.retrying: str | None = None  # what the latest observation says is retrying ("3 x ConnectError")
        self.read_at = 0.0
        self.retry_said: tuple[str | None, float] = (None, 0.0)  # (retrying, when) last printed
        self.seen_running = False  # the engine run was running at a tick of this command's

    def __call__(self, dagster_run: Any) -> None:
        engine_id = dagster_run.tags.get("migration/run_id")
        if not engine_id:
            return
        if self.db is None:
            self.db = open_db()
        if self.out.is_terminal:  # one rich bar per phase (engine_core.progress.ProgressBoard)

            if getattr(self, "board", None) is None:
                engine_run = runs.get_run(self.db, int(engine_id))
                self.board = ProgressBoard(int(engine_id), engine_run.plan, console=self.out, dry_run=engine_run.dry_run,
                                           labels=phase_labels(engine_run.source, engine_run.plan))
                self.board.__enter__()
            self.board.update(self.db)
            return
        r = rollups.rollup(self.db, int(engine_id))
        if r.status == "running":
            self.seen_running = True
        elif r.status in self.BEFORE and not self.seen_running:
            return  # the stop or failure this launch resumes or retries: not news, the next line is its phase running
        phase = min(r.current_phase, len(r.phases) - 1)
        kinds = r.phase_kinds(phase, at_close=True)
        queued = dagster_run.status.value == "QUEUED"
        state = (queued, r.status, phase, tuple((k.imported, k.updated, k.already_here, k.failed) for k in kinds))
        now = time.monotonic()
        # a phase the barrier moved past since the last line: its closing figures (a short phase
        # otherwise showed only the counts it had when it started: "0 imported"); at the first
        # line, every phase before the current one, which may have closed before this command's
        # first tick (a phase 1 of a few rows closes within the first poll's interval)
        for closed in range(self.phase_printed if self.phase_printed is not None else 0, phase):
            self._line(r, closed, "closed", self.out)
        if self.phase_printed is None or phase > self.phase_printed:
            self.phase_printed = phase
        if state != self.last and (self.last is None or state[:3] != self.last[:3] or now - self.printed >= self.EVERY):
            self.last, self.printed = state, now
            self._line(r, phase, phase_state(dagster_run.status.value, r, phase), self.out)
        # the source failing: the counts stand still while requests are retried (up to
        # MIGRATE_SOURCE_DOWN_SECONDS before the run pauses); say what is retried and why
        retrying = self._retrying(dagster_run.run_id, now) if r.status == "running" else None
        said, at = self.retry_said
        if retrying and (retrying != said or now - at >= self.EVERY):
            self.retry_said = (retrying, now)
            self.out.print(f"  phase {phase_label(r, phase)} ({', '.join(r.phases[phase])}) retrying: {retrying}: "
                          f"{r.name}", highlight=False)

    def _retrying(self, run_id: str, now: float) -> str | None:
        """What the Dagster run's latest progress observation (`PhaseReporter.tick`, every few
        seconds: the op's own process counts the retries) says is being retried, with its cause
        ("4 x ConnectError: ..."), or None. Read at most every RETRIES_EVERY seconds, new records
        only; a failure to read is not the command's failure."""
        if self.instance is None or now - self.read_at < self.RETRIES_EVERY:
            return self.retrying
        self.read_at = now
        from dagster import DagsterEventType

        try:
            result = self.instance.get_records_for_run(run_id, cursor=self.observed,
                                                       of_type=DagsterEventType.ASSET_OBSERVATION)
        except Exception:  # noqa: BLE001 - progress lines are best effort
            return self.retrying
        if result.records:
            self.observed = result.cursor
            event = result.records[-1].event_log_entry.dagster_event
            metadata = event.asset_observation_data.asset_observation.metadata if event else {}
            value = metadata.get("retrying")
            self.retrying = str(value.value) if value is not None else None
        return self.retrying

    @staticmethod
    def _line(r: Any, phase: int, state: str, out: Any = None) -> None:
        # skipped rows and the results tables' words, a dry run's included (the
        # lines left skipped rows out, and a dry run's said "imported", then "0 updated" where the
        # tables said "would update")
        imported, _, here, updated = written_columns(r.dry_run)
        counts = ", ".join(f"{k.kind} {k.imported} {imported}/{k.updated} {updated}/{k.already_here} {here}/"
                           f"{k.skipped} skipped/" + (f"{k.waiting} waiting/" if k.waiting else "")
                           + f"{k.failed} failed" for k in r.phase_kinds(phase, at_close=True))
        (out or console).print(f"  phase {phase_label(r, phase)} ({', '.join(r.phases[phase])}) {state}: {r.name}: {counts}")

    def close(self) -> None:
        """End the bars (on a terminal) with the run's figures now, and close the progress's own
        pool; safe to call twice. The bars had ended with the last tick's figures: the last phase
        "tasks 7/8 | 0 rows/s" above a results table that said it closed."""
        if getattr(self, "board", None) is not None:
            try:
                if self.db is not None:
                    self.board.update(self.db)
            except Exception:  # noqa: BLE001 - the bars are best effort; the results follow
                pass
            self.board.__exit__(None, None, None)
            self.board = None
        if self.db is not None:
            self.db.close()
            self.db = None


class VerifyDisplay:
    """`migrate verify`'s progress (`engine_core.verify.VerifyStep`): a line per kind once it is
    read (its ids, the requests so far), and while a kind is read, a live status on a terminal or
    a line every EVERY seconds on a pipe: a verify lists every record again, minutes under
    latency. Nothing with --json (stdout is the JSON alone). `close` ends the status."""

    EVERY = 10.0

    def __init__(self, tenant: str, as_json: bool, clock: Any = time.monotonic) -> None:
        self.tenant, self.as_json, self.clock = tenant, as_json, clock
        self.status: Any = None
        self.printed = clock()

    def __call__(self, step: Any) -> None:
        if self.as_json:
            return
        where = f"{step.kind} ({step.index}/{step.total})"
        if step.done:
            console.print(f"  verify {self.tenant}: {where} read: {step.listed:,} ids; "
                          f"{step.requests:,} requests so far", highlight=False)
            self.printed = self.clock()
        text = (f"verify {self.tenant}: reading {where}: {step.listed:,} ids so far; "
                f"{step.requests:,} requests so far")
        if console.is_terminal:
            if self.status is None:
                self.status = console.status(text)
                self.status.start()
            else:
                self.status.update(text)
        elif not step.done and self.clock() - self.printed >= self.EVERY:
            console.print(f"  {text}", highlight=False)
            self.printed = self.clock()

    def close(self) -> None:
        """End the terminal's status line; safe to call twice."""
        if self.status is not None:
            self.status.stop()
            self.status = None
