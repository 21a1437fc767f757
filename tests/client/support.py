"""A scripted `httpx.MockTransport` and fakes of the budget, for the client's unit tests."""
from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from engine_core.providers.pipedrive.client import PipedriveClient

TOKEN = "tok-SECRET-4f1d2c9e8b7a"
BASE = "http://pipedrive.test"

Step = httpx.Response | BaseException | Callable[[httpx.Request], httpx.Response]


def ok(data: Any = None, *, headers: dict[str, str] | None = None, **extra: Any) -> httpx.Response:
    body = {"success": True, "data": data, **extra}
    return httpx.Response(200, json=body, headers=headers or {})


def status(code: int, *, headers: dict[str, str] | None = None, body: Any = None) -> httpx.Response:
    if body is None:
        body = {"success": False, "error": f"status {code}"}
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.Response(code, content=content, headers={"content-type": "application/json", **(headers or {})})


@dataclass
class Script:
    """Answers requests from a list of steps in order (the last step repeats) and records them."""

    steps: list[Step]
    requests: list[httpx.Request] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
            step = self.steps[min(len(self.requests) - 1, len(self.steps) - 1)]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, httpx.Response):
            return httpx.Response(step.status_code, headers=step.headers, content=step.content)
        return step(request)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self)


@dataclass
class Jitter:
    """An injected rng: a fixed sequence of draws."""

    draws: Iterable[float]

    def __post_init__(self) -> None:
        self._it = iter(self.draws)

    def __call__(self) -> float:
        return next(self._it)


@dataclass
class FakeBudget:
    """Records what the client asks of a budget (the real one is tested against Postgres)."""

    acquired: int = 0
    observed: list[Any] = field(default_factory=list)  # RateObservations
    limited: list[tuple[str, float]] = field(default_factory=list)
    parked: float | None = None

    def acquire(self, cancel: threading.Event | None = None) -> None:
        if self.parked is not None:
            from engine_core.errors import RateLimitParked

            raise RateLimitParked(self.parked)
        self.acquired += 1

    def observe(self, seen: Any) -> None:
        self.observed.append(seen)

    def note_rate_limited(self, scope: str, retry_after: float) -> None:
        self.limited.append((scope, retry_after))


def make_client(script: Script, **kwargs: Any) -> tuple[PipedriveClient, list[float]]:
    sleeps: list[float] = []
    kwargs.setdefault("sleep", sleeps.append)
    kwargs.setdefault("rng", Jitter([0.0] * 100))
    kwargs.setdefault("wall_clock", lambda: 1_780_000_000.0)
    client = PipedriveClient(BASE, TOKEN, transport=script.transport(), **kwargs)
    return client, sleeps
