"""A stop the user asked for is never retried (issue 10, a fresh user's find).

`migrate run` stopped by Ctrl-C or SIGTERM about a second after its Dagster run began STARTING: the
terminate found no run worker yet, the command stopped its daemon, the worker died with it, the run
ended FAILURE - and Dagster's run retries (dagster.yaml: `run_retries`) re-executed it, migrating
phases 1-6 after the user had asked to stop. `launch.stop_launched_run` now tags the run
`dagster/max_retries=0` before anything else, so the failure that may follow is not retried.
"""
from __future__ import annotations

from dagster import DagsterRunStatus
from dagster._core.storage.tags import WILL_RETRY_TAG
from dagster._core.test_utils import create_run_for_test

from migration_pipeline import launch, tags
import migration_pipeline.launch.stop
from tests.dagster.support import tmpfs_instance


def test_a_run_stopped_by_its_command_is_not_retried_when_it_then_fails():
    with tmpfs_instance(overrides={"run_retries": {"enabled": True, "max_retries": 2}}) as instance:
        # the control: a run that fails on its own is retried, as dagster.yaml asks
        other = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTED,
                                    tags={tags.PARTITION: "left"})
        instance.report_run_failed(other)
        assert instance.get_run_by_id(other.run_id).tags.get(WILL_RETRY_TAG) == "true"

        run = create_run_for_test(instance, job_name="migrate_tenant", status=DagsterRunStatus.STARTING,
                                  tags={tags.PARTITION: "stopped"})
        launch.stop.stop_launched_run(instance, run.run_id, echo=lambda line: None, wait=0)
        # its worker then dies with the daemon the command stops: FAILURE, and no retry
        instance.report_run_failed(instance.get_run_by_id(run.run_id))
        assert instance.get_run_by_id(run.run_id).tags.get(WILL_RETRY_TAG) == "false"
