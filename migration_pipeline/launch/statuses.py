"""Dagster run statuses as a launch groups them, and how often it polls the instance."""
from __future__ import annotations

from dagster import DagsterRunStatus


FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]
IN_PROGRESS = [DagsterRunStatus.STARTING, DagsterRunStatus.STARTED, DagsterRunStatus.CANCELING]

# How often `migrate run` reads its Dagster run while waiting (one run-storage query a poll, on the
# storage's kept connection: migration_pipeline/storage.py): a finished run is seen within this (it
# was 2 s, then 0.5 s: on average half of it in every run's tail).
POLL_SECONDS = 0.25
