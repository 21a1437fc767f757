"""Lane threads carried from one phase op to the next within one Dagster run executed step after
step in one thread (the in-process executor): a phase op whose next phase runs here leaves its
extra lane threads draining into that phase while Dagster closes its step (materialisation,
checks) and starts the next one, and the next op adopts them instead of starting its own.

The executor opens the scope around a run's steps (`steps_here`); outside one (the celery
executor, a step per process; Dagster's plain in-process executor) nothing is carried and each
op stops its threads at its phase's end, as before. Whatever is still carried when the scope
closes - the run's last step, a failed or skipped step, a terminate between steps - is stopped
there (no new claims; a running task ends at its next stop point, keeping its checkpoint). A
killed process takes its threads with it: their tasks' locks go stale and the reaper, or the
draining slot of a re-executed step, releases them, as for any killed worker."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from migration_pipeline.lane.terminate import hold_interrupts

_local = threading.local()


@contextmanager
def steps_here() -> Iterator[None]:
    """While inside, phase ops executing on this thread may carry their lane threads to the next
    op (`carry`, `adopt`); on exit every lanes object still carried is stopped (`LaunchLanes.stop`,
    errors not raised: the run's own outcome is already decided). Nested scopes share the outer one."""
    if getattr(_local, "carried", None) is not None:
        yield
        return
    _local.carried = {}
    try:
        yield
    finally:
        carried, _local.carried = _local.carried, None
        with hold_interrupts():  # a terminate delivered again meanwhile must not cut the stop short
            for lanes in carried.values():
                lanes.stop(lanes.grace, raise_errors=False)


def allowed() -> bool:
    """Whether this thread is inside a `steps_here` scope (the next phase op runs here)."""
    return getattr(_local, "carried", None) is not None


def carry(dagster_run_id: str, lanes: Any) -> None:
    """Keep `lanes` (a LaunchLanes whose threads drain on) for the next phase op of the run."""
    _local.carried[dagster_run_id] = lanes


def adopt(dagster_run_id: str) -> Any:
    """The lanes a previous phase op of the run carried here, taken out of the scope (None when
    none were, or outside a scope)."""
    carried = getattr(_local, "carried", None)
    return carried.pop(dagster_run_id, None) if carried is not None else None
