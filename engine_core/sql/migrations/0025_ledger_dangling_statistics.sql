-- No planner statistics for the ledger's `dangling` column (as migration 0018 for the product
-- tables' jsonb columns): sorting its sampled values with jsonb's comparison was most of what an
-- ANALYZE of migration_records costs (5,000 entries: 64-74 ms, 27 ms without it), and the engine's
-- statistics keeper analyzes the ledger at phase boundaries (`engine_core/statistics.py`).
-- The queries that filter on it (`owed_links`, `owed_of_kind`: `dangling @> '[{"owed": true}]'`,
-- the partial index migration_records_owed's predicate) are served by that index, which needs no
-- column statistics to be chosen; `dangling_counts` reads one run's entries by migration_id.
ALTER TABLE migration_records ALTER COLUMN dangling SET STATISTICS 0;
