-- The further families' rows are marked when the source no longer has their record, as the core
-- kinds' are (migration 0010): the catch-up sets deleted_at_source and keeps the row.
ALTER TABLE crm.products          ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.deal_products     ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.files             ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.deal_participants ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.followers         ADD COLUMN deleted_at_source timestamptz;
ALTER TABLE crm.deal_history      ADD COLUMN deleted_at_source timestamptz;
