"""What can go wrong talking to Pipedrive, typed by what the worker should do about it.

Each docstring is the default message. Messages name the HTTP method, the path (never the query
string) and the status; they never carry the API token (the client scrubs it from anything the
server echoes back, too).

How the worker treats them:

* `TransientHTTPError` is a `TransientError`: release the task with its cursor intact, retry later.
* `DailyLimitReached` is a `RateLimitParked`: park the task until `wait_seconds` without burning
  an attempt (the account's daily token budget is spent for every worker sharing it).
* `BurstLimited` (a `RateLimited` of burst scope, and a `TransientError`) only escapes the client
  when its own retries are exhausted: release and retry, like any transient failure.
* `Cancelled` is a `TaskStopped`: the run was stopped; keep the progress, stop the task.
* `AuthError`, `NotFound`, `BadResponse`, `RequestRejected`: not retried by the client; they are
  the task's failure (a `NotFound` on one row's detail fetch is usually that row's failure).
* `ItemRefused`: one item's sub-resource (a deal's mail listing, a mail body) answered 403 (private
  to another user) or 404 (the item is gone since it was listed). Not retried and not the task's
  failure: it is that item's outcome, told with its reason (`paging.settle_refusals` first asks
  whether the token itself is refused). `BodyUnavailable` is the mail body's: the message is
  imported without its body and says so.
"""
from __future__ import annotations

from typing import Literal

from engine_core.errors import EngineError, RateLimitParked, TaskStopped, TransientError

Scope = Literal["burst", "daily"]


def _where(method: str | None, path: str | None, status: int | None, detail: str | None) -> str:
    parts = []
    if method or path:
        parts.append(" ".join(p for p in (method, path) if p))
    if status is not None:
        parts.append(f"HTTP {status}")
    if detail:
        parts.append(detail)
    return ": ".join(parts)


class PipedriveError(EngineError):
    """The Pipedrive API request failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = None,
        detail: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.detail = detail
        base = message or (type(self).__doc__ or "").strip()
        where = _where(method, path, status, detail)
        # Explicitly EngineError's: with multiple inheritance (DailyLimitReached) super() would be
        # RateLimitParked.__init__, whose first argument is a number.
        EngineError.__init__(self, f"{base.rstrip('.')} ({where})" if where else base)


class TransientHTTPError(PipedriveError, TransientError):
    """Pipedrive did not answer usefully this time (server error, timeout or dropped connection)."""


class RateLimited(PipedriveError):
    """Pipedrive refused the request: the rate limit is spent."""

    def __init__(
        self,
        retry_after: float,
        scope: Scope = "burst",
        message: str | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = 429,
        detail: str | None = None,
    ) -> None:
        self.retry_after = float(retry_after)
        self.scope: Scope = scope
        extra = f"{scope} limit, retry after {self.retry_after:.1f}s"
        super().__init__(
            message,
            method=method,
            path=path,
            status=status,
            detail=f"{detail}; {extra}" if detail else extra,
        )


class BurstLimited(RateLimited, TransientError):
    """Pipedrive kept refusing the request: the burst window stayed full through every retry."""

    def __init__(self, retry_after: float, message: str | None = None, **where: object) -> None:
        RateLimited.__init__(self, retry_after, "burst", message, **where)  # type: ignore[arg-type]


class DailyLimitReached(RateLimited, RateLimitParked):
    """The account's daily token budget is spent: park until it resets."""

    def __init__(
        self,
        retry_after: float,
        message: str | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
        status: int | None = 429,
        detail: str | None = None,
    ) -> None:
        # RateLimitParked's contract: the worker reads wait_seconds to set the task's not_before.
        self.wait_seconds = float(retry_after)
        RateLimited.__init__(
            self, retry_after, "daily", message, method=method, path=path, status=status, detail=detail
        )


class AuthError(PipedriveError):
    """Pipedrive rejected the API token (PIPEDRIVE_API_TOKEN: unauthorised or forbidden)."""


class NotFound(PipedriveError):
    """Pipedrive has no such resource."""


class ItemRefused(PipedriveError):
    """Pipedrive refused one item's sub-resource to this token (403: private to another user; 404:
    the item is gone since it was listed)."""


class BodyUnavailable(ItemRefused):
    """The mail message's body is not available to this token (private, or deleted since listed)."""


class RequestRejected(PipedriveError):
    """Pipedrive rejected the request as malformed."""


class BadResponse(PipedriveError):
    """Pipedrive answered with something that is not the documented response."""

    def __init__(self, message: str | None = None, *, malformed: bool = False, **where: object) -> None:
        # malformed: the body was not JSON at all (often a cut-off read), which is worth a retry;
        # a well-formed wrong envelope or `success: false` is not.
        self.malformed = malformed
        super().__init__(message, **where)  # type: ignore[arg-type]


class Cancelled(PipedriveError, TaskStopped):
    """The request was abandoned because the task was asked to stop."""
