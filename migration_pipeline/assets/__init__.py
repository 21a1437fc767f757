"""Phase assets and their checks, generated from a provider's plan."""
from migration_pipeline.assets.checks import build_phase_checks
from migration_pipeline.assets.phases import PhaseSpec, build_phase_assets, phase_specs

__all__ = ["PhaseSpec", "build_phase_assets", "build_phase_checks", "phase_specs"]
