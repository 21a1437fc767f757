-- The owed links' look-up reads a tenant's owed entries in id order, a batch at a time
-- (engine_core/owed_links.py `fill`, `after` and `limit`): with the id in the partial index each
-- batch is a range scan from where the last one ended, already in order, instead of reading and
-- sorting every owed entry left for every batch (quadratic in a tenant's owed entries).
DROP INDEX IF EXISTS migration_records_owed;
CREATE INDEX IF NOT EXISTS migration_records_owed ON migration_records (tenant_id, source, id)
 WHERE dangling @> '[{"owed": true}]';
