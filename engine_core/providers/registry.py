"""The providers this project ships, by source name: imported only by composition roots.

The Dagster face, the CLI, the benches and the tests pick a provider here and hand it (or a factory)
to the engine; the engine itself never imports this module nor any concrete provider, so adding a
source is one entry in `SHIPPED`, not an edit to the engine.
"""
from __future__ import annotations

from typing import Any

from engine_core.errors import ConfigError
from engine_core.models import Run
from engine_core.providers.example import ExampleProvider
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.source import Provider, ProviderFactory

SHIPPED: dict[str, ProviderFactory] = {
    "example": ExampleProvider,  # in-memory rows and injectable failures: the demo and the engine's tests
    "pipedrive": PipedriveProvider,  # a Pipedrive company over its v1/v2 REST API
}

_REGISTRY: dict[str, ProviderFactory] = dict(SHIPPED)


def register(source: str, factory: ProviderFactory) -> None:
    """Add (or replace) the factory of `source`: tests and benches register their own providers."""
    _REGISTRY[source] = factory


def provider_for(source: str, run: Run | None = None, **settings: Any) -> Provider:
    """The provider of `source` for `run` (None: for phases and listings without a run).
    `settings` are handed to the factory as keywords: the values a deployment resolved for this run
    (Pipedrive: base_url, token), which win over the process environment. Raises ConfigError naming
    the known sources for an unknown one."""
    try:
        factory = _REGISTRY[source]
    except KeyError:
        raise ConfigError(f"unknown source {source!r}; known: {sorted(_REGISTRY)}") from None
    return factory(run, **settings) if settings else factory(run)


def for_run(run: Run) -> Provider:
    """A run's provider (`provider_for(run.source, run)`): the factory the worker and the reaper take."""
    return provider_for(run.source, run)
