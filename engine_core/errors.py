"""The engine's exceptions. Each docstring is the default message."""
from __future__ import annotations


class EngineError(Exception):
    """The migration engine failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__class__.__doc__ or "").strip())


class ConfigError(EngineError):
    """A configuration variable is invalid."""


class SourceMismatch(ConfigError):
    """This worker's source settings reach another source than the run reads."""

    def __init__(self, run_name: str, run_identity: str, worker_identity: str) -> None:
        self.run_identity = run_identity
        self.worker_identity = worker_identity
        super().__init__(
            f"{run_name} reads {run_identity}, but this worker's source settings reach {worker_identity}; "
            f"it claims nothing rather than mix two sources in one tenant (drain it with the settings it "
            f"was started with)"
        )


class TenantSourceMismatch(ConfigError):
    """These source settings reach another source (another Pipedrive company) than the tenant's
    data came from: a new run, a sync or a verify of the tenant is refused before it reads or
    writes anything (a sync with another company's settings would update the tenant's rows with
    that company's and mark the rows it lacks deleted)."""

    def __init__(self, tenant_id: str, run_name: str, tenant_identity: str, settings_identity: str) -> None:
        self.tenant_identity = tenant_identity
        self.settings_identity = settings_identity
        super().__init__(
            f"tenant {tenant_id!r} holds data of {tenant_identity} ({run_name}), but these source settings reach "
            f"{settings_identity}; a tenant holds one source's data: use the settings it was migrated with, or "
            f"another tenant name for this source"
        )


class AdmissionRefused(EngineError):
    """Another run of this tenant and source is live."""

    def __init__(self, live_run_name: str, live_run_id: int | None = None) -> None:
        self.live_run_name = live_run_name
        self.live_run_id = live_run_id
        super().__init__(f"refused: {live_run_name} is live for this tenant and source; stop it or wait for it")


class RunNotFound(EngineError):
    """No such migration run."""


class NothingToDo(EngineError):
    """The run has no tasks in the state this action works on."""


class NothingMigrated(EngineError):
    """The tenant has only dry runs of this source: nothing was written, so there is nothing to prove."""


class NothingToSync(EngineError):
    """The tenant has no succeeded run or sync to sync from: run a full migration first."""


class TransientError(EngineError):
    """A transient failure: the task is released with its cursor intact and retried."""


class TransientDatabaseError(TransientError):
    """The database aborted the transaction (deadlock or serialization failure)."""


class DatabaseUnavailable(TransientError):
    """The database connection failed."""


class LockLost(EngineError):
    """This worker no longer holds the task's lock (it was released as stale): its writes roll back."""


class RateLimitParked(EngineError):
    """The source's budget is spent: park the task until the reset without burning an attempt."""

    def __init__(self, wait_seconds: float, message: str | None = None) -> None:
        self.wait_seconds = wait_seconds
        super().__init__(message or f"source budget spent; parked for {wait_seconds:.0f}s")


class TaskStopped(EngineError):
    """The run was asked to stop while this task ran; its progress is kept."""


class BudgetCancelled(TaskStopped):
    """The wait for a rate-limit slot was abandoned because the task was asked to stop."""


class PageFailed(EngineError):
    """Every row of the page failed."""
