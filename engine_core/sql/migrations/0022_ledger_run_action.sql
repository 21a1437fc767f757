-- A run's ledger entries by outcome: (migration_id, action, kind), in place of (migration_id, kind,
-- action). Every read of one run's entries names the outcome (the rollup on every poll of a run:
-- its failed and skipped records, their reasons, the placeholders still waiting, the claims per
-- kind; the dangling counts). With the kind second, an outcome is found only by walking
-- all of the run's entries: reading a run's failed and skipped records costs as many index pages
-- as the run has rows, even when it has none. With the outcome second, those reads touch the
-- failed and skipped entries alone, and the claims per kind a range of the run's written entries.
-- A read by run and kind only still finds the run's entries through the first column. One index
-- replaces the other, so the ledger's writes keep one index of the run.
DROP INDEX IF EXISTS migration_records_run;
CREATE INDEX IF NOT EXISTS migration_records_run_action ON migration_records (migration_id, action, kind);
