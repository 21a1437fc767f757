"""Run tags the face reads and writes. `dagster/partition` is Dagster's; the rest are ours."""
from __future__ import annotations

from typing import Any

PARTITION = "dagster/partition"  # every tenant run carries it, whatever launched it: the lane key
PRIORITY = "dagster/priority"  # the run queue dequeues higher first
ENGINE_RUN = "migration/run_id"  # the engine run this Dagster run attached to (set by the first phase)
ROLE = "migration/role"  # "drainer" on the sensor's helper runs
SOURCE = "migration/source"
DRAINER = "drainer"
DRAINER_PRIORITY = "-1"  # a tenant's own launch goes before helper drainers waiting for the lane
MODE = "migration/mode"  # "sync" on the sync job's runs: the phase ops start a sync, not a full run
SYNC = "sync"
# A launch that asks for a new engine run explicitly (launchpad: Edit tags, `migration/new_run: true`;
# `migrate run --new-run`): without it a tenant whose latest run succeeded gets no new full run.
NEW_RUN = "migration/new_run"
# Set on a Dagster run whose own interruption (a terminate, its worker's shutdown) set the stop flag
# of its engine run (the engine run's id): a retry of it resumes that stop, not one made by hand.
STOPPED_ENGINE = "migration/stopped_engine_run"
# "true" on a Dagster run whose first phase op joined an engine run another launch had started
# (two launches of one tenant at once): its results are that run's.
JOINED = "migration/joined"
# Set (to the Dagster run's own id) by a step that ends its own run CANCELING because its engine run
# was stopped or paused (`assets.cancel.cancel_this_run`), before the run goes CANCELING: that
# CANCELING is no terminate, and an in-process run's watcher delivers no interrupt for it.
CANCELED_BY_STEP = "migration/canceled_by_step"


def read_run_tags(context: Any) -> dict[str, str]:
    """The op's Dagster run's tags, read now from the instance (earlier steps may have tagged it)."""
    current = context.instance.get_run_by_id(context.run_id)  # fresh: earlier steps may have tagged it
    return dict(current.tags if current else context.run.tags)


class RunTags:
    """This Dagster run's tags as one phase op knows them: read once when the op starts (earlier
    steps may have tagged the run), then kept in step with the op's own writes (`add`). The keys
    the op reads (the engine run, attached_by, the lane tags, the launch's options) are written
    only by the run's own phase ops, one at a time, so the copy stays true for the op's life; reading
    the run per look cost five reads of the run (each a query and a deserialisation) per phase op."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.tags = read_run_tags(context)

    def get(self, key: str, default: str = "") -> str:
        """The tag's value as this copy holds it, `default` when absent."""
        return self.tags.get(key, default)

    def add(self, new: dict[str, str]) -> None:
        """Write `new` on the run (Dagster's `add_run_tags`) and into this copy."""
        self.context.instance.add_run_tags(self.context.run_id, new)
        self.tags.update(new)
