"""Phase assets (with their ledger checks), generated from a provider's plan: `specs` (a phase as
Dagster sees it), `phases` (the asset factory and the op's step), `checks`, `metadata`."""
