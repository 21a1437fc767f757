"""What a provider's task runner gets: its task, its run, its position (`checkpoint.Checkpoints`)
and the window writer (`window.Windows`)."""
from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine_core import window as windows
from engine_core.checkpoint import Checkpoints
from engine_core.config import WINDOW, Settings
from engine_core.db import Database
from engine_core.models import Run, Stats, Task
from engine_core.runlog import RunLog
from engine_core.window import Windows


@dataclass
class TaskContext(Checkpoints, Windows):
    """One claimed task's context: the database, its run and task, this worker's id, the settings,
    the run log, the cancel Event, the task's stats and offset (rows of its cursor committed), and
    the window sizes. Its methods are the mechanisms' (stop points, checkpoint, cursor moves, windows)."""

    db: Database
    run: Run
    task: Task
    worker: str
    settings: Settings
    log: RunLog
    cancel: threading.Event = field(default_factory=threading.Event)
    stats: Stats = field(default_factory=Stats)
    offset: int = 0
    # the ledger kinds the source lists through several of its kinds (`source.ledger_lists`): a
    # placeholder's reason names the lists of its parent's kind the run does not take
    lists: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    window: int = WINDOW
    # rows per window when the window is written set-based (optimistic windows): no savepoints, so
    # the subxid cache does not bound it; a refused one is written again per row in windows of
    # `window` rows. Read from `window.SET_WINDOW` when a context is made (a test may set it).
    set_window: int = field(default_factory=lambda: windows.SET_WINDOW)
    # Set by the lock keeper (or `touch`) when the task's lock was found taken: the task is someone
    # else's now, so it stops at its next stop point and its next checkpoint raises LockLost.
    lock_lost: threading.Event = field(default_factory=threading.Event)
    _stop_checked: float = 0.0
    _stop_seen: bool = False
