"""Phase assets (with their ledger checks), generated from a provider's plan."""
from migration_pipeline.assets.phases import PhaseSpec, build_phase_assets, phase_specs

__all__ = ["PhaseSpec", "build_phase_assets", "phase_specs"]
