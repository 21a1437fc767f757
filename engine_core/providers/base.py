"""What a source provider gives the engine: its phases, its seed cursors, and a task runner."""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from engine_core.errors import ConfigError
from engine_core.models import Run, Successor, TaskOutcome

if TYPE_CHECKING:
    from engine_core.context import TaskContext

log = logging.getLogger(__name__)


class Provider(Protocol):
    source: str

    def phases(self) -> list[list[str]]:
        """Ordered kind groups; a phase starts only when the one before it has closed."""

    def account(self) -> str:
        """The source account key the budget is shared on (never a secret)."""

    # Optional: `identity() -> str`, what the source's data belongs to (a Pipedrive company), which
    # may take a request; without it the account key stands in (see `identity_of`).

    def seed_cursors(self, run: Run, kind: str) -> list[Successor]:
        """The first tasks of a kind when its phase opens. No I/O: discovery is a task of its own."""

    def run_task(self, ctx: TaskContext) -> TaskOutcome:
        """Do one task's work through ctx (windows, checkpoints); return its successors."""

    # Optional: `depends_on(kind) -> Iterable[str]`, the kinds a kind's rows must link to. Without
    # it a retry revisits every later kind that skipped rows (see `dependents`).


def identity_of(provider: Provider) -> str | None:
    """What the provider's data belongs to, or None when the source cannot tell now (unreachable, a
    revoked token): the tasks then meet that on their own."""
    identity = getattr(provider, "identity", None)
    if identity is None:
        return provider.account()
    try:
        return identity()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - an unanswered question, not a verdict
        log.warning("could not learn the %s source's identity (%s); the tasks will meet it", provider.source, type(e).__name__)
        return None


def dependents(provider: object, kinds: Iterable[str], plan_kinds: Iterable[str]) -> set[str]:
    """Kinds whose rows may have been skipped because rows of `kinds` were missing (transitively)."""
    every = list(plan_kinds)
    depends_on = getattr(provider, "depends_on", None)
    if depends_on is None:
        return set(every) - set(kinds)
    found = set(kinds)
    grew = True
    while grew:
        grew = False
        for k in every:
            if k not in found and found & set(depends_on(k)):
                found.add(k)
                grew = True
    return found - set(kinds)


ProviderFactory = Callable[[Run | None], Provider]
_REGISTRY: dict[str, ProviderFactory] = {}


def register(source: str, factory: ProviderFactory) -> None:
    _REGISTRY[source] = factory


def provider_for(source: str, run: Run | None = None) -> Provider:
    if source not in _REGISTRY:
        _load_builtin(source)
    try:
        factory = _REGISTRY[source]
    except KeyError:
        raise ConfigError(f"unknown source {source!r}; known: {sorted(_REGISTRY)}") from None
    return factory(run)


def _load_builtin(source: str) -> None:
    # Built-in providers register themselves on import.
    if source == "example":
        import engine_core.providers.example  # noqa: F401
    elif source == "pipedrive":
        try:
            import engine_core.providers.pipedrive.provider  # noqa: F401
        except ImportError:
            pass
