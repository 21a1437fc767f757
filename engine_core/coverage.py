"""Which of the kinds a new full run asks for the tenant's succeeded full runs already took.

A tenant is migrated kind by kind: a kind some succeeded full run of the tenant took came over
whole, and a new full run that walks it again lists it all over to write nothing new (a plain
`migrate run` after `--kinds organizations,persons,...` re-walked those six kinds, 148 s). So a
launch that is not a sync and does not ask for a new run explicitly (`--new-run`, the run tag
`migration/new_run=true`) takes only the kinds it asks for that no such run took
(`Coverage.lacking`), and nothing when none is left (`runs.AlreadyMigrated`). A kind it takes whose
parents an earlier run took links to them through the ledger (`earlier_kinds`), as one run of every
kind would. The kinds covered are brought up to date by a sync (`runs.synced_kinds` takes every kind
any succeeded run took).

Which runs count (the rule `runs.migrated_by` states): the tenant's latest run of the source
succeeded (a live, stopped or failed one is joined, resumed or retried before this is asked), and
its succeeded full runs together - not one alone, syncs aside (a sync lists only what changed), dry
runs only for a dry launch - took the kind.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_core.db import Database
from engine_core.models import Run
from engine_core.plan import choose_kinds
from engine_core.source import Provider, catchup_kind, opt_in_kinds


@dataclass(frozen=True)
class Coverage:
    """A new full run's kinds against the tenant's succeeded full runs.

    `wanted`: the kinds the launch's kinds choice plans, in plan order, catch-up aside; `covered`:
    those some succeeded full run took; `by`: the latest succeeded full run that took any of them
    (the run a refusal names, None when none did)."""

    wanted: tuple[str, ...]
    covered: tuple[str, ...]
    by: Run | None

    @property
    def lacking(self) -> tuple[str, ...]:
        """The wanted kinds no succeeded full run took, in plan order: what the launch takes."""
        return tuple(k for k in self.wanted if k not in self.covered)

    @property
    def complete(self) -> bool:
        """Every wanted kind is covered: the launch has nothing to take (`runs.AlreadyMigrated`)."""
        return bool(self.covered) and not self.lacking

    @property
    def partial(self) -> bool:
        """Some wanted kinds are covered and some are not: the launch takes only `lacking`."""
        return bool(self.covered) and bool(self.lacking)

    def narrowed(self, start_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        """`start_kwargs` with `kinds` the lacking kinds (plain names: exactly those) when the
        coverage is partial; otherwise a copy as given."""
        kw = dict(start_kwargs or {})
        if self.partial:
            kw["kinds"] = list(self.lacking)
        return kw

    def line(self, tenant: str) -> str:
        """The one line a launch says when it narrows, e.g. "tenant 'six' is migrated for
        organizations, persons; this run takes the kinds it lacks: users, products; `migrate sync six`
        brings the migrated ones up to date"."""
        return (f"tenant {tenant!r} is migrated for {', '.join(self.covered)}; this run takes the kinds it lacks: "
                f"{', '.join(self.lacking)}; `migrate sync {tenant}` brings the migrated ones up to date")


def wanted_kinds(provider: Provider, kinds: Sequence[str] | None) -> tuple[str, ...]:
    """The kinds a run of the kinds choice `kinds` takes (`plan.choose_kinds`; None: the defaults),
    in plan order, without the catch-up kind every run ends with. ConfigError on unknown kinds."""
    phases = provider.phases()
    chosen = choose_kinds(phases, kinds, opt_in_kinds(provider))
    ck = catchup_kind(provider)
    every = [k for group in phases for k in group]
    return tuple(k for k in every if k != ck and (chosen is None or k in chosen))


def coverage(db: Database, tenant_id: str, provider: Provider,
             start_kwargs: Mapping[str, Any] | None) -> Coverage | None:
    """The `Coverage` of a new full run with `start_kwargs` (`runs.start_run`'s keywords: `kinds`,
    `dry_run`, `mode`) on `tenant_id`, or None when no run counts: a sync (`mode="sync"`: bringing
    what changed repeats nothing), a tenant without runs of the provider's source, or one whose
    latest run did not succeed. See the module for which runs count."""
    kw = dict(start_kwargs or {})
    if (kw.get("mode") or "full") == "sync":
        return None
    latest = db.fetch_one("latest_run_for_tenant", {"tenant_id": tenant_id, "source": provider.source})
    if latest is None or latest["status"] != "succeeded":
        return None
    done = [Run.from_row(r) for r in db.fetch_all(
        "succeeded_full_runs", {"tenant_id": tenant_id, "source": provider.source, "dry": bool(kw.get("dry_run"))})]
    wanted = wanted_kinds(provider, kw.get("kinds"))
    taken = {k for run in done for k in run.kinds}
    covered = tuple(k for k in wanted if k in taken)
    took_some = [run for run in done if set(run.kinds) & set(covered)]
    if not covered:
        return Coverage(wanted, (), None)
    # nothing left: the latest of the runs (as `migrate status` shows it); else the latest that took any
    by = max(done if not any(k not in taken for k in wanted) else took_some, key=lambda run: run.id)
    return Coverage(wanted, covered, by)
