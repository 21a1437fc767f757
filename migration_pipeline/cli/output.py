"""The command line's console and its one-line outcomes: rich's console sized for a terminal or a
pipe, JSON or a rendering (`emit`), an error as one line and exit 2 (`fail`), a reader that went away."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import click
import psycopg
from psycopg.rows import dict_row
from rich.console import Console

from engine_core import db as dbmod
from engine_core import ledger_reads
from engine_core.rows import EMAIL_BODY_MAX, NOTE_CONTENT_MAX
from engine_core.config import Settings


# Not a terminal (a pipe, a log, CI): COLUMNS when set (`COLUMNS=80 migrate status T | less`
# wants 80-column rows), else wide enough that the status table (updated, deleted at source and
# by catch-up beside the written columns) keeps its headers unwrapped ("would import"). Lines of text
# are never wrapped there (soft wrap): a progress line naming a phase of four kinds with their
# counts is ~300 characters, and a line broken in two is two lines to a grep or a log reader. Tables
# are laid out in that width (fitted_table). A terminal's own width is rich's (COLUMNS first too).
_TERMINAL = sys.stdout.isatty()
PIPED_WIDTH = 220


def piped_width(env: dict[str, str] | None = None) -> int:
    """The console width when stdout is not a terminal: COLUMNS when it is a whole number of at
    least 20 (as rich reads it for a terminal), else PIPED_WIDTH."""
    raw = (os.environ if env is None else env).get("COLUMNS", "").strip()
    return int(raw) if raw.isdigit() and int(raw) >= 20 else PIPED_WIDTH


def reader_gone(stream: Any) -> None:
    """`stream`'s reader has gone (BrokenPipeError: `migrate run ... | head -2` after its two lines):
    its descriptor is pointed at /dev/null, so what is still buffered for it and every later write
    (and the interpreter's last flush) succeed and go nowhere, and the command works on. Python's
    advice for a closed pipe (the "Note on SIGPIPE" of the signal module's documentation); a stream
    without a descriptor is left as it is."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (AttributeError, OSError, ValueError):
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _Console(Console):
    """rich's Console, but a reader that goes away does not end the command: rich's own
    `on_broken_pipe` points descriptor 1 at /dev/null and raises SystemExit(1) from whichever thread
    printed. An in-process run prints its progress from its watcher thread, which the SystemExit
    ended silently, and with it the handling of SIGINT/SIGTERM (the watcher acts on them): `migrate
    run | head -2` could no longer be stopped and ran on to SUCCESS. Here the
    console goes quiet and its own file (not descriptor 1, which an in-process run points at its
    log) writes to /dev/null (`reader_gone`); the run goes on, and a signal still stops it."""

    def on_broken_pipe(self) -> None:
        """Go quiet and point the console's file at /dev/null; the command goes on."""
        self.quiet = True
        reader_gone(self.file)


console = _Console(width=None if _TERMINAL else piped_width(), soft_wrap=not _TERMINAL)
# The same for stderr: what a --json command shows while it works (a launch's progress lines),
# its stdout being the JSON document alone.
_ERR_TERMINAL = sys.stderr.isatty()
err_console = _Console(stderr=True, width=None if _ERR_TERMINAL else piped_width(), soft_wrap=not _ERR_TERMINAL)


def open_db(*, create: bool = True) -> dbmod.Database:
    """A pool on the engine database, sized for the lane's threads (2 a slot, 4 more). Without
    `create` (the commands that read a tenant's runs: `status`, `report`, `explain`, `rows`,
    `verify`, `stop`, `retry`, `resume`, and `sync`, which follows a run), an embedded database MIGRATE_HOME does not hold is one
    line saying where it looked (ConfigError, exit 2), and none is made or started."""
    return dbmod.connect(max_size=Settings.from_env().lane_width * 2 + 4, create=create)


def emit(as_json: bool, payload: Any, render: Any) -> None:
    """`payload` as indented JSON on stdout when `as_json`, else `render()`; a reader gone (`| head`)
    is not the command's failure."""
    if as_json:
        try:
            click.echo(json.dumps(payload, default=str, indent=2))
        except BrokenPipeError:  # the reader has gone (`| head`): not the command's failure
            reader_gone(sys.stdout)
    else:
        render()


ERROR_PREFIX = "error: "  # every failure's line, ours (`fail`) and click's usage errors (`lowercase_error`)

# ctx.meta key (shared by the group's context and its command's): the command line holds --json
JSON_ASKED = "migrate.json_asked"


def json_asked() -> bool:
    """Whether the command being run was given --json: its own parsed flag (`as_json`) while it
    runs, else what the group saw in the command line before the command parsed it (an error of the
    group's checks, or one raised out of the command: `main._Commands`)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return False
    if "as_json" in ctx.params:
        return bool(ctx.params["as_json"])
    return bool(ctx.meta.get(JSON_ASKED))


def fail(e: Exception | str) -> None:
    """One line on stderr, no traceback, exit code 2. Under --json, stdout gets the same line as a
    JSON document on one line, {"error": "..."} (a JSON Lines command's too: `rows --json`), so a
    script reading stdout gets JSON whatever happened."""
    message = " ".join(str(e).split()) or type(e).__name__
    if json_asked():
        try:
            click.echo(json.dumps({"error": message}))
        except BrokenPipeError:  # the reader has gone: the line on stderr still says it
            reader_gone(sys.stdout)
    click.echo(f"{ERROR_PREFIX}{message}", err=True)
    sys.exit(2)


def lowercase_error(e: click.ClickException) -> click.ClickException:
    """`e` shown as click shows it (a usage error: the usage and the help hint first), but its line
    begins with ERROR_PREFIX, as every other failure of the command line does, not click's "Error: ",
    and follows them directly: no blank line between, as no other error has one."""
    def show(file: Any = None) -> None:
        out = file if file is not None else sys.stderr
        ctx = getattr(e, "ctx", None)
        if isinstance(e, click.UsageError) and ctx is not None:
            hint = (f"\nTry '{ctx.command_path} {ctx.help_option_names[0]}' for help."
                    if ctx.command.get_help_option(ctx) is not None else "")
            click.echo(f"{ctx.get_usage()}{hint}", file=out, color=ctx.color)
        click.echo(f"{ERROR_PREFIX}{e.format_message()}", file=out)
    e.show = show  # type: ignore[method-assign]
    return e


def changed_now(tenant: str) -> dict[str, int]:
    """`ledger_reads.changed_bodies` of `tenant`, read on one short connection to the engine
    database (none made or started: `database_url(create=False)`); {} when it cannot be read -
    a line of hints never fails the command that prints it."""
    try:
        url = dbmod.database_url(create=False)
        with psycopg.connect(url, autocommit=True, row_factory=dict_row, **dbmod.connect_kwargs(url)) as raw:
            return ledger_reads.changed_bodies(dbmod.Conn(raw), tenant)
    except Exception:  # noqa: BLE001 - the hints go without the figure, the command does not fail
        return {}


def changed_said(changed: dict[str, int]) -> str:
    """", 2 imported with a changed body: 1 email body cut at 1,000,000 characters (body_truncated);
    1 email without its body, refused by the source (body_unavailable)" for `changed`
    (`ledger_reads.changed_bodies`, rows); "" when none."""
    said = [f"{n} email bod{'y' if n == 1 else 'ies'} cut at {EMAIL_BODY_MAX:,} characters (body_truncated)"
            for n in [changed.get("emails_cut", 0)] if n]
    said += [f"{n} email{'' if n == 1 else 's'} without {'its' if n == 1 else 'their'} body, refused by the source "
             "(body_unavailable)" for n in [changed.get("emails_unavailable", 0)] if n]
    said += [f"{n} note{'' if n == 1 else 's'} cut at {NOTE_CONTENT_MAX:,} characters (content_truncated)"
             for n in [changed.get("notes_cut", 0)] if n]
    return f", {sum(changed.values())} imported with a changed body: {'; '.join(said)}" if said else ""


def db_shell(env: dict[str, str] | None = None) -> str:
    """How a user's shell reaches the engine database, for a psql line: `"$DATABASE_URL"` when it is
    set (`migrate db url` hides its password as ***, which cannot log in), else `"$(migrate db url)"`,
    the embedded server's URL, which has no password (it trusts local connections). Never the
    secret itself."""
    given = (os.environ if env is None else env).get("DATABASE_URL", "").strip()
    return '"$DATABASE_URL"' if given else '"$(migrate db url)"'


def what_now(tenant: str, verdict: str, bad: dict[str, dict[str, int]], ui_address: str | None,
             left_out: str | None = None, again: tuple[str, str] | None = None, *, dry_run: bool = False,
             changed: dict[str, int] | None = None, env: dict[str, str] | None = None,
             remedies: list[tuple[str, str]] | None = None) -> list[str]:
    """The few lines a finished `demo`, `run` or `sync` ends with: the `verdict` ("run #7 (...)
    succeeded") with the tenant's skipped and failed rows (`bad`: `ledger_reads.bad_row_counts`, the rows
    `migrate rows` lists), then where to look - the UI when one serves (`ui_address`), `migrate rows`
    when there are bad rows, `migrate status`, and a psql line counting the tenant's ledger rows
    (the README's "Where the data lands"): the tables alone do not say what to look at next.
    `left_out` (`engine_core.plan.left_out_line`, one to three lines), when given, follows the verdict:
    the kinds the run did not take and how to add them. `again` (`again_line`: the command and what it does),
    when given, comes first of the commands: how a stopped run resumes, a failed one is retried.
    `remedies` (`remedy.remedies`: the command and what it does) follow it: what brings the skipped
    rows a run of the tenant can still bring (the lists their parents are served by, then a sync).

    A `dry_run` wrote nothing (no ledger row, no product row): its lines point at what it did
    leave - its counts (`migrate status`), its task durations (`migrate report`) - and at the run
    that writes, not at the ledger or `migrate rows`, which it left empty.

    Rows imported with a body other than the source's (cut, or refused by the source: `changed`,
    `ledger_reads.changed_bodies`, read here by `changed_now` when not given) are neither skipped
    nor failed, so the verdict line says them apart. The psql line counts the ledger's rows with
    the failed rows kept without a readable id (`migration_unreadable`, beside the ledger), so its
    failed figures are the verdict's; it connects as `db_shell` says (`env`: default os.environ)."""
    skipped = sum(v["skipped"] for v in bad.values())
    failed = sum(v["failed"] for v in bad.values())
    if dry_run:
        lines = [f"what now: tenant {tenant!r}: {verdict}: nothing was written; its tables are what a real run would "
                 "do (would import, would match, would update, skipped, failed)"]
    else:
        changed = changed_now(tenant) if changed is None else changed
        lines = [f"what now: tenant {tenant!r}: {verdict}, {skipped} row(s) skipped, {failed} failed{changed_said(changed)}"]
    lines += [f"  {line}" for line in (left_out or "").splitlines()]
    if again:
        lines.append(f"  {again[0]}{' ' * max(2, 26 - len(again[0]))}{again[1]}")
    if not dry_run:
        lines += [f"  {command}{' ' * max(2, 26 - len(command))}{what}" for command, what in remedies or ()]
    if ui_address:
        lines.append(f"  the Dagster UI: {ui_address} (each phase asset's partition {tenant!r})")
    if dry_run:
        said = [(f"migrate status {tenant}", "the dry run's counts per kind again"),
                (f"migrate report {tenant}", "where its time went (task durations by size)")]
        if not again:
            said.append((f"migrate run --tenant {tenant}", "the real run, which writes (the dry run counts for nothing)"))
        return lines + [f"  {command}{' ' * max(2, 26 - len(command))}{what}" for command, what in said]
    if skipped or failed:
        lines.append(f"  migrate rows {tenant}        the skipped and failed rows with their reasons")
    lines.append(f"  migrate status {tenant}      its runs and counts")
    query = (f"SELECT kind, action, count(*) FROM (SELECT kind, action FROM migration_records WHERE tenant_id = "
             f"'{tenant}' UNION ALL SELECT kind, 'failed' FROM migration_unreadable WHERE tenant_id = '{tenant}') r "
             "GROUP BY 1, 2 ORDER BY 1, 2")
    lines.append(f"  psql {db_shell(env)} -c \"{query}\"")
    return lines


def again_line(tenant: str, status: str | None, sync: bool = False) -> tuple[str, str] | None:
    """How a run that did not finish goes on, for `what_now`: (the command, what it does) - the same
    launch resumes a stopped run from its tasks' checkpoints and retries a failed one's failed tasks
    (`runs.attach`); a sync's with `migrate sync`. None for any other `status`."""
    command = f"migrate sync {tenant}" if sync else f"migrate run --tenant {tenant}"
    if status in ("stopped", "stopping"):
        return command, "resumes it where it stopped (each task from its checkpoint)"
    if status == "failed":
        return command, "retries its failed tasks (the rest stay done)"
    return None


# `migrate run` / `sync`'s exit codes (README "From the command line", docs/commands.md): 0 the run
# succeeded, 1 it failed (retry: the same command), 2 refused before anything ran (bad input, a
# check, --timeout), STOPPED_ELSEWHERE an operator's stop from outside this command (`migrate stop`,
# the UI's Terminate) ended it resumable, SOURCE_FAILED the engine paused it, resumable, because the
# source failed every request for MIGRATE_SOURCE_DOWN_SECONDS (`runs.pause`), 128 + N this command
# got signal N (130: Ctrl-C).
STOPPED_ELSEWHERE = 3
SOURCE_FAILED = 4
# Who `migrate stop` says stopped a run, in the engine run's log (`runs.note_stop`)
MIGRATE_STOP = "by `migrate stop`"
ENGINE_PAUSE = "the engine's pause"


def paused_reason(step_messages: tuple[str, ...]) -> str | None:
    """Why the engine paused the run, from the phase steps' one-line messages
    (`migration_pipeline.assets.phases`: "... closed (paused: the source failed every request for
    5m00s (last: HTTP 503)); launch the partition again ..."): "the source failed every request for
    5m00s (last: HTTP 503)", or None when no step says it was paused."""
    paused = next((m for m in step_messages if "(paused: " in m), None)
    return paused.split("(paused: ", 1)[1].rsplit("); ", 1)[0] if paused else None


def stopped_by(signo: int | None = None, step_messages: tuple[str, ...] = (), noted: str | None = None) -> str:
    """Who stopped a run, as the stop line says it: this command's signal `signo` ("this command's
    Ctrl-C (SIGINT)", "SIGTERM to this command"), else - a stop from outside - `migrate stop` when
    the engine run's log says so (`noted`: its stop note since this launch, `runs.stop_noted`; the
    op it stopped may have been interrupted as by a terminate), else read from the phase steps'
    one-line messages (`paused_reason`; a terminate says "stopped by a terminate request") - the
    engine's pause ("the engine's pause (why)"), the UI's Terminate, or `migrate stop`."""
    if signo is not None:
        name = signal.Signals(signo).name
        return f"this command's Ctrl-C ({name})" if signo == signal.SIGINT else f"{name} to this command"
    if noted == f"stopped {MIGRATE_STOP}":
        return "`migrate stop` from elsewhere"
    paused = paused_reason(step_messages)
    if paused:
        return f"{ENGINE_PAUSE} ({paused})"
    if any("terminate request" in m for m in step_messages):
        return "a Terminate from elsewhere (the Dagster UI's)"
    return "`migrate stop` from elsewhere"


def stopped_exit_code(by: str) -> int:
    """The exit code of a launch a stop from outside it ended, by who stopped it (`stopped_by`):
    SOURCE_FAILED for the engine's pause (the source failed every request), STOPPED_ELSEWHERE for
    an operator's stop (`migrate stop`, the UI's Terminate)."""
    return SOURCE_FAILED if by.startswith(ENGINE_PAUSE) else STOPPED_ELSEWHERE


def stopped_line(run_name: str, status: str, by: str, tenant: str, dagster: str, sync: bool = False) -> str:
    """The one line a stopped `migrate run` / `sync` ends with, whoever stopped it (`stopped_by`):
    "run #5 (...) stopped by this command's Ctrl-C (SIGINT); `migrate run --tenant acme` resumes it
    where it stopped (Dagster run R: CANCELED)". `status` is the engine run's ("stopping": a task
    still reaching its checkpoint, said in brackets); `dagster` the Dagster side in a few words. The
    engine's pause is the source's failure, said as such: "run #5 (...) paused by the engine: the
    source failed every request for 3m00s (last: HTTP 503); `migrate run --tenant acme` resumes it
    where it stopped once the source answers (...)"."""
    command = f"migrate sync {tenant}" if sync else f"migrate run --tenant {tenant}"
    still = "" if status == "stopped" else f" (still {status}: its running tasks stop at their next checkpoint)"
    if by.startswith(f"{ENGINE_PAUSE} ("):  # the source's failure, not a stop: resuming waits for the source
        why = by.removeprefix(f"{ENGINE_PAUSE} (").removesuffix(")")
        return (f"{run_name} paused by the engine: {why}{still}; `{command}` resumes it where it stopped "
                f"once the source answers ({dagster})")
    return f"{run_name} stopped by {by}{still}; `{command}` resumes it where it stopped ({dagster})"


class RetryTally(logging.Handler):
    """A logging handler that counts the source client's retry warnings by their cause (records whose
    template has "; retry %d/%d", the cause their second argument: "HTTP 503", "429 burst") and
    passes every other record on as Python's last-resort handler would (its message on stderr)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.causes: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        """Count a retry warning; write any other record's message to stderr."""
        args = record.args if isinstance(record.args, tuple) else ()
        if "; retry %d/%d" in str(record.msg) and len(args) >= 2:
            self.causes[str(args[1])] += 1
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # noqa: BLE001 - as logging's own handlers: a log line never ends the command
            self.handleError(record)

    def line(self) -> str | None:
        """"the source was retried 165 times (HTTP 503 x 120, 429 burst x 45)", most frequent cause
        first; None when nothing was retried."""
        total = sum(self.causes.values())
        if not total:
            return None
        causes = ", ".join(f"{cause} x {n}" for cause, n in self.causes.most_common())
        return f"the source was retried {total} time(s) ({causes}); each retried request was tried again after a backoff"


@contextlib.contextmanager
def retries_summarised(logger: str = "engine_core") -> Iterator[RetryTally]:
    """For the block, the engine's retry warnings are counted rather than printed one a line
    (`RetryTally`; a `verify` over a flaky source printed 165 of them before its result); the
    tally is yielded so the command can print its one line."""
    tally = RetryTally()
    target = logging.getLogger(logger)
    propagated = target.propagate
    target.addHandler(tally)
    target.propagate = False  # the tally prints what it does not count: nothing is printed twice
    try:
        yield tally
    finally:
        target.removeHandler(tally)
        target.propagate = propagated
