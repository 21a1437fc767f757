"""Run tags the face reads and writes. `dagster/partition` is Dagster's; the rest are ours."""
from __future__ import annotations

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
