-- Soft links owed to a kind a run left out (engine_core/owed_links.py): an entry of `dangling`
--   {"field": "owner_id", "parent_kind": "users", "parent_id": "3", "owed": true, "path": ["owner_id"]}
-- is a link left empty because the run did not take the parent's kind; a later run that takes it
-- fills the link from the ledger and removes the entry. The index keeps the look-up at a run's end
-- cheap for every tenant, most of which owe nothing.
CREATE INDEX IF NOT EXISTS migration_records_owed ON migration_records (tenant_id, source)
 WHERE dangling @> '[{"owed": true}]';
