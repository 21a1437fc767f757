-- Issue 9: changes go through the ledger (a versioned ledger, updates in place, soft deletes).
--
-- source_version     which version of the source row the ledger wrote. Pipedrive: the row's
--                    update time as served (`update_time`, users' `modified`); a row without one:
--                    "sha256:" + the hex digest of its canonical JSON (sorted keys). NULL for entries
--                    written before this migration and for placeholders (nothing written).
--                    A sighting with another (newer) version updates the product row in place
--                    (task outcome `updated`), never a second row.
-- deleted_at_source  when the engine found the row gone from the source (`ledger.mark_deleted`):
--                    on the ledger entry and on the product row it points at. Never a hard delete;
--                    a row seen again later clears both ("restored").
ALTER TABLE migration_records
    ADD COLUMN source_version    text,
    ADD COLUMN deleted_at_source timestamptz;

ALTER TABLE crm.users                    ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.pipelines                ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.stages                   ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.companies                ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.contacts                 ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.deals                    ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.leads                    ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.activities               ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.notes                    ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.emails                   ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.custom_field_definitions ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE example_items                ADD COLUMN deleted_at_source timestamptz;

-- What a change did to a ledger entry's product row, one row per change: `updated` (a newer source
-- version written in place; `before` holds the product row's previous values of the columns that
-- changed), `deleted` (marked deleted at the source) and `restored` (seen again after that).
-- `migration_id` is the run that made the change (the entry's own migration_id stays the run that
-- claimed it, so a run's claims stay its own).
CREATE TABLE migration_record_history (
    id             bigserial   PRIMARY KEY,
    record_id      bigint      NOT NULL REFERENCES migration_records (id) ON DELETE CASCADE,
    migration_id   bigint      NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    action         text        NOT NULL CHECK (action IN ('updated', 'deleted', 'restored')),
    version_before text,
    version_after  text,
    before         jsonb,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX migration_record_history_record ON migration_record_history (record_id, id);
CREATE INDEX migration_record_history_run ON migration_record_history (migration_id, action);
