"""What a source gives the engine: the Provider protocol and the helpers that read its optional parts.

The generic engine (runs, worker, reaper, barrier, verify, ...) knows a source only through this
module; which providers exist is the composition root's business (`engine_core.providers.registry`).
"""
from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from engine_core.errors import ConfigError
from engine_core.models import Run, Successor, TaskOutcome

if TYPE_CHECKING:
    from engine_core.context import TaskContext

log = logging.getLogger(__name__)


# How far before a snapshot a listing by update time starts (run option `snapshot_margin_seconds`):
# rows stamped by a source server whose clock lags, or committed a moment after their stamp, are
# listed again rather than missed. Listing them twice costs nothing: the ledger has their version.
SNAPSHOT_MARGIN_SECONDS = 300
# A margin beyond a year is no clock's skew; far beyond it timedelta overflows (1e15 s: a traceback).
MAX_MARGIN_SECONDS = 365 * 24 * 3600


def snapshot_margin(run: Run) -> timedelta:
    """The run's margin before a snapshot (option `snapshot_margin_seconds`, default 300 s)."""
    return margin_option(run.options)


def margin_option(options: Mapping[str, Any]) -> timedelta:
    """The option `snapshot_margin_seconds` of `options` (default 300 s). Raises ConfigError (one
    line naming it) for anything but a finite number of seconds from 0 to MAX_MARGIN_SECONDS (not
    NaN, Infinity or a boolean)."""
    raw = options.get("snapshot_margin_seconds", SNAPSHOT_MARGIN_SECONDS)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"snapshot_margin_seconds must be a number of seconds, got {raw!r}") from None
    # NaN and Infinity (Python's json reads both) and 1e400 (read as inf) ended in timedelta's traceback
    if isinstance(raw, bool) or not math.isfinite(seconds):
        raise ConfigError(f"snapshot_margin_seconds must be a number of seconds, got {raw!r}")
    if seconds < 0:
        raise ConfigError(f"snapshot_margin_seconds must be >= 0, got {seconds}")
    if seconds > MAX_MARGIN_SECONDS:
        raise ConfigError(f"snapshot_margin_seconds must be at most {MAX_MARGIN_SECONDS} (a year), got {raw!r}")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class RateObservation:
    """What one response of the source said about its rate limits; None: not said.

    `limit`, `remaining`: requests allowed in the burst window and left in it now; `reset`:
    seconds until that window resets. `daily_limit`, `daily_remaining`: the day's token budget and
    what is left of it; `daily_reset`: seconds until it resets. The provider's client reads them
    from its responses (Pipedrive: the `x-ratelimit-*` and `x-daily-ratelimit-*` headers) and hands
    them to the shared budget (`budget.Budget.observe`), which takes numbers, never headers."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None
    daily_limit: int | None = None
    daily_remaining: int | None = None
    daily_reset: float | None = None


class Provider(Protocol):
    """What a source gives the engine: its source name, its phases (kind groups), the account its
    rate budget is shared on, the seed cursors of a kind, and a task runner. Optional parts
    are read through the helpers of this module (`identity_of`, `source_ids`,
    `catchup_kind`, `source_time`, `dependents`, a `ledger_kind` fold). Providers need not
    subclass it."""
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

    # Optional: `catchup_kind: str`, the kind of the provider's catch-up phase (the last
    # group of `phases()`): it is no data kind of its own - its tasks bring what changed at the
    # source since the run's snapshot (rows created, changed, deleted) under the other kinds' ledger
    # identities. A run limited to some kinds keeps it (`runs.start_run`); verify skips it.

    # Optional: `opt_in_kinds: frozenset[str]`, kinds a run takes only when asked (`plan.choose_kinds`):
    # a run that names no kinds leaves them out and says so (`plan.left_out`).

    # Optional: `source_time() -> datetime | None`, the source's clock now (aware, UTC),
    # for the run's snapshot moment; None or absent: the database's clock stands in.

    # Optional: `check_options(options: Mapping[str, Any]) -> None`, raising ConfigError (one line
    # naming the option) for a run option the provider does not take or a value it would refuse
    # later. `runs.start_run` calls it before the run exists and `migrate run` before launching: a
    # bad value stored with a run failed every task of it, and every relaunch joined that run.

    def source_ids(self, settings: Any, kind: str, options: Mapping[str, Any] | None = None) -> Iterator[tuple[str, str | None]]:
        """Every id the source lists NOW for `kind` (a kind of `phases()`), with the row's version
        where the listing carries one (the same string the ledger stores as `source_version`:
        Pipedrive's `update_time` as served, else "sha256:" + the canonical JSON's hex digest), by
        the cheapest full listing the source has. Ids are strings as the ledger keys them.

        `settings`: the engine's `engine_core.config.Settings` (or None: from the environment).
        `options`: a dict; `options["db"]` (a Database) makes the requests go through the source
        account's shared rate-limit budget; `options["cost"]`, a mutable dict, gets
        `cost["requests"] += 1` and `cost["tokens"] += <the endpoint's token cost>` per request.
        The listing is not a snapshot: a row changed while it walks may be listed twice or, moving
        between lists, missed - callers confirm a missing id before acting on it.
        Raises NotImplementedError for a kind the provider cannot list (the default)."""
        raise NotImplementedError(f"the {self.source} provider cannot list the ids of {kind!r}")


def _taken(ask: Any, **given: Any) -> dict[str, Any]:
    """The keyword arguments of `given` (those not None) that the callable `ask` takes."""
    accepted = inspect.signature(ask).parameters
    return {name: value for name, value in given.items() if value is not None and name in accepted}


def identity_of(provider: Provider, cost: dict[str, int] | None = None, *, warn: bool = True,
                db: Any = None) -> str | None:
    """What the provider's data belongs to, or None when the source cannot tell now (unreachable, a
    revoked token): the tasks then meet that on their own (a warning says so unless `warn` is false:
    verify checks the credential itself then). `cost` (a dict of `requests` and
    `tokens`, verify's) is handed to an `identity` that takes it, to count its request; so is `db`
    (a `Database`), through whose shared rate-limit budget its request is then paced."""
    identity = getattr(provider, "identity", None)
    if identity is None:
        return provider.account()
    try:
        return identity(**_taken(identity, cost=cost, db=db))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - an unanswered question, not a verdict
        if warn:
            log.warning("could not learn the %s source's identity (%s); the tasks will meet it", provider.source,
                        type(e).__name__)
        return None


def source_ids(provider: object, settings: Any, kind: str, options: Mapping[str, Any] | None = None) -> Iterator[tuple[str, str | None]]:
    """`provider.source_ids(...)` (see `Provider.source_ids`); NotImplementedError when the
    provider has none (providers need not subclass the Protocol)."""
    lister = getattr(provider, "source_ids", None)
    if lister is None:
        raise NotImplementedError(f"the {getattr(provider, 'source', '?')} provider cannot list the ids of {kind!r}")
    return lister(settings, kind, options)


def catchup_kind(provider: object) -> str | None:
    """The provider's catch-up kind, or None when it has no catch-up phase."""
    kind = getattr(provider, "catchup_kind", None)
    return kind if isinstance(kind, str) and kind else None


def opt_in_kinds(provider: object) -> frozenset[str]:
    """The provider's opt-in kinds (`opt_in_kinds`), empty when it has none."""
    kinds = getattr(provider, "opt_in_kinds", None)
    return frozenset(kinds) if kinds else frozenset()


def progress_weights(provider: object) -> dict[str, float] | None:
    """What each of the provider's kinds costs a run, relative to the others (`progress_weights()`:
    {kind: weight > 0}); None when the provider does not say (its phases then weigh the same)."""
    weigh = getattr(provider, "progress_weights", None)
    weights = weigh() if weigh is not None else None
    return dict(weights) if weights else None


def source_time(provider: object, db: Any = None) -> datetime | None:
    """The source's clock now, when the provider can tell (`source_time()`); None otherwise, and
    when asking fails (the database's clock then stands in). `db` is handed to a `source_time`
    that takes it: a request it makes is paced by the account's budget there."""
    ask = getattr(provider, "source_time", None)
    if ask is None:
        return None
    try:
        moment = ask(**_taken(ask, db=db))
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the database's clock is a fine stand-in
        log.warning("could not read the %s source's clock (%s); using the database's", getattr(provider, "source", "?"), type(e).__name__)
        return None
    return moment if isinstance(moment, datetime) and moment.tzinfo is not None else None


def ledger_lists(provider: object) -> dict[str, tuple[str, ...]]:
    """The ledger kinds the provider lists through more than one of its kinds, each with those
    kinds in plan order: Pipedrive's {"deals": ("deals", "deals_archived"), "leads": ("leads",
    "leads_archived")} (its `ledger_kind` fold: one identity per source record, whichever list
    serves it). {} for a provider without the fold."""
    fold = getattr(provider, "ledger_kind", None)
    if not callable(fold):
        return {}
    ck = catchup_kind(provider)
    lists: dict[str, list[str]] = {}
    for group in provider.phases():  # type: ignore[attr-defined]
        for k in group:
            if k != ck:
                lists.setdefault(fold(k), []).append(k)
    return {lk: tuple(ks) for lk, ks in lists.items() if len(ks) > 1}


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
"""Builds a run's provider (None: the source's provider with no run, for phases and listings)."""

ProviderResolver = Callable[[Run], Provider]
"""A run's provider: what the worker and the reaper take, so that neither chooses one itself."""
