"""Dagster's default run launcher, aware of the runs `migrate run` executes in its own process.

With no daemon serving the instance, `migrate run` executes its Dagster run in the command's own
process (`launch.InProcessRun`, issue 11): no run launcher launched it, so the run carries no
`dagster/grpc_info` tag and no code server knows it. The UI's Terminate then reaches
`DefaultRunLauncher.terminate`, which marks the run CANCELING, finds no gRPC client to send the
request to and returns False: the UI says "Unable to terminate run" although the command's watcher
sees CANCELING within a poll and stops the run (engine run stopped, Dagster run CANCELED).

`MigrationRunLauncher.terminate` is the default one, except for a run in progress that never had a
gRPC client (executed in a process of its own, as `migrate run` does): it marks that run CANCELING,
records an engine event saying who stops it and answers True - the request is delivered, through
the CANCELING status the executing process polls. A run launched through a
code server (the daemon's, the UI's) is terminated exactly as before.

dagster.yaml names it in `run_launcher:`; every Dagster process of the project imports this module
from the installed project, as it does `migration_pipeline.storage`.
"""
from __future__ import annotations

from dagster import DagsterRunStatus
from dagster._core.launcher import DefaultRunLauncher
from dagster._core.storage.tags import GRPC_INFO_TAG

# Where a run without a gRPC client learns of its termination (launch.InProcessRun's watcher).
DELIVERED = ("termination requested: the process executing this run in-process (`migrate run`) sees it "
             "CANCELING and stops it at its next check; the engine run stays resumable")


# A run executed in its own process is STARTED (core_execute_run reports it first) until it ends; a run
# not yet STARTED (queued, or STARTING under a launcher that is adding its gRPC tag) keeps Dagster's answer.
IN_PROCESS_STATES = (DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING)


class MigrationRunLauncher(DefaultRunLauncher):
    """DefaultRunLauncher whose `terminate` answers True for a run executed in its own process.

    `terminate(run_id) -> bool`: True when the request was delivered (a code server accepted it, or
    the run has no gRPC client and is now CANCELING, which its executing process polls); False for
    an unknown or finished run, or when a code server refused it. Raises what
    DefaultRunLauncher.terminate raises (a code server's error)."""

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or run.is_finished or GRPC_INFO_TAG in run.tags or run.status not in IN_PROCESS_STATES:
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        self._instance.report_engine_event(message=DELIVERED, dagster_run=run, cls=self.__class__)
        return True
