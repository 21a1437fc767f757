"""The sandbox's mutable state: config, dataset, limiter, faults, stats, shapes and live account."""
from __future__ import annotations

import threading
from typing import Any

from .config import SandboxConfig
from .data import Dataset, dataset_for
from .faults import FaultPlan
from .limits import RateLimiter
from .live import Live
from .shapes import Shapes
from .stats import Stats


class SandboxState:
    """Everything one server holds: config, dataset (shared per scale and seed within the process),
    rate limiter, fault plan, stats, shapes, live account, and the deals-summary caches.

    `lock` (an RLock) orders the live changes against the handlers: a handler holds it while it
    builds an answer, so a change lands between two answers, never inside one."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.dataset: Dataset = dataset_for(config.scale, config.seed, config.big_deal_messages)
        self.limiter = RateLimiter(
            burst_limit=config.burst_limit,
            window=config.burst_window_seconds,
            daily_budget=config.daily_budget,
            day_seconds=config.day_seconds,
        )
        self.faults = FaultPlan(config.seed, config.fault_spec, config.latency_spec)
        self.stats = Stats()
        self.shapes = Shapes(self.dataset, config)
        self.summary_cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.summary_base: dict[tuple[Any, ...], dict[str, list[float]]] = {}  # generated deals only
        self.summary_version = 0  # the live version summary_cache answers for
        # Live account: changes run under this lock, which handlers hold while they answer.
        self.lock = threading.RLock()
        self.live = Live(self.dataset, lambda: self.shapes, lambda: self.config, self.lock)
        if config.live_rate > 0:
            self.live.start()

    @property
    def badrow(self) -> float:
        """The configured rate of malformed rows (the `badrow` fault), 0.0 when off."""
        return self.config.fault_spec.rate("badrow")

    def reconfigure(self, changes: dict[str, Any]) -> SandboxConfig:
        """Apply run-time option changes (ValueError names a bad one). Swaps config and shapes under
        the lock; (re)starts the live background outside it (its thread takes the lock to stop)."""
        with self.lock:
            old, new = self.config, self._reconfigure(changes)
        if new.live_rate != old.live_rate or (new.live_rate > 0 and not self.live.running and new.live_max != old.live_max):
            self.live.start()  # a new rate (or cap) starts the background changes over from now; 0 stops them
        return new

    def _reconfigure(self, changes: dict[str, Any]) -> SandboxConfig:
        new = self.config.with_changes(changes)
        self.limiter.reconfigure(
            burst_limit=new.burst_limit,
            window=new.burst_window_seconds,
            daily_budget=new.daily_budget,
            day_seconds=new.day_seconds,
        )
        self.faults.reconfigure(new.fault_spec, new.latency_spec)
        if any(getattr(new, name) != getattr(self.config, name) for name in SandboxConfig.SHAPES):
            self.shapes = Shapes(self.dataset, new)  # a fresh shape state: archive flips start over
            self.summary_cache.clear()
            self.summary_base.clear()
        self.config = new
        return new
