"""SIGINT, SIGTERM and SIGHUP during a launch: raised as `Interrupted` in the main thread, and held
off while what was started is being stopped. Imports no Dagster."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# How long an interrupted `migrate run` waits for its Dagster run to end CANCELED (the phase op
# stops at its next task boundary) before it stops its daemon, whose process group ends the run.
INTERRUPT_WAIT_SECONDS = 60.0


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached a command while it waited on work it launched. A
    KeyboardInterrupt, so every `finally` and BaseException handler on the way runs as for Ctrl-C."""

    def __init__(self, signo: int, announced: bool = False) -> None:
        self.signo = int(signo)
        self.announced = announced  # "SIGTERM: stopping what this command started" was said already
        super().__init__(signal.Signals(signo).name)

    @property
    def exit_code(self) -> int:
        """The shell's convention for a command ended by a signal: 128 + the signal's number."""
        return 128 + self.signo


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """While inside: SIGINT, SIGTERM and SIGHUP raise Interrupted in the main thread (SIGTERM and
    SIGHUP would otherwise end the process at once, skipping every cleanup, and a script started
    with `&` has SIGINT ignored). The previous handlers are restored on exit."""
    def _raise(signo: int, frame: Any) -> None:
        raise Interrupted(signo)

    previous = {sig: signal.signal(sig, _raise) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_held() -> Iterator[None]:
    """While inside: the stop signals are ignored (the cleanup of an interrupted command runs to
    its end, bounded by its own waits, instead of being cut short by a second Ctrl-C)."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
