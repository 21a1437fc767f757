"""The phases of a source's plan as Dagster sees them: one `PhaseSpec` (and one asset key) a phase."""
from __future__ import annotations

import re
from dataclasses import dataclass

from dagster import AssetKey

from engine_core.models import Run
from engine_core.plan import plan_number
from engine_core.providers.registry import provider_for


@dataclass(frozen=True)
class PhaseSpec:
    """One phase of the provider's plan and the asset that stands for it."""

    source: str
    index: int  # position in the provider's full plan
    kinds: tuple[str, ...]

    @property
    def name(self) -> str:
        """The asset's name: "phase_3_persons_organizations" (1-based index, kinds made identifiers)."""
        return f"phase_{self.index + 1}_" + "_".join(re.sub(r"[^a-z0-9]+", "_", k.lower()) for k in self.kinds)

    @property
    def key(self) -> AssetKey:
        """The asset key: [source, name]."""
        return AssetKey([self.source, self.name])

    def run_phase(self, run: Run) -> int | None:
        """This phase's index in a run's plan (a run limited to some kinds has fewer phases)."""
        for i, group in enumerate(run.plan):
            if set(group) & set(self.kinds):
                return i
        return None


def plan_of(source: str) -> list[list[str]]:
    """The source provider's full plan: its non-empty kind groups, in order. Raises what loading
    the provider raises (an unknown source: ConfigError)."""
    return [list(g) for g in provider_for(source).phases() if g]


def phase_specs(source: str, phases: list[list[str]] | None = None) -> list[PhaseSpec]:
    """One PhaseSpec per phase of `phases` (default: the source's plan, `plan_of`)."""
    phases = plan_of(source) if phases is None else phases
    return [PhaseSpec(source, i, tuple(group)) for i, group in enumerate(phases)]


def asset_number(run: Run, phase: int) -> int:
    """The number (from 1) of the phase asset that stands for `run`'s phase `phase` (its index in
    the run's plan): `engine_core.plan.plan_number` in the source's whole plan (the catch-up of a run
    without the opt-in phase is phase_9_catchup); `phase + 1` when the source does not load."""
    try:
        plan = plan_of(run.source)
    except Exception:  # noqa: BLE001 - a source that no longer loads: the run's own numbering
        plan = []
    return plan_number(plan, run, phase)
