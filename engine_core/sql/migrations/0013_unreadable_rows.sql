-- Rows without a readable id (issue 8's "no silent loss"; a fresh user's find): a source row whose
-- id is missing, or is not an id of its kind (Pipedrive: a positive integer, a lead's uuid), fails
-- alone with its reason, but the ledger (migration_records) keys every row by its source id, so
-- such a row was counted failed and told only in the run log's sample: not in the grouped reasons,
-- `migrate status --json`, the phase's metadata or `migrate explain`. It is recorded here, once per
-- tenant, source, kind and raw key (`engine_core.rows.unreadable_key`: the id as served, as text,
-- or "sha256:" and 16 hex digits of the row when it has none), so a retried task refreshes its
-- record instead of adding one. Nothing else reads this table as source ids: resolution, the
-- catch-up and the proof from the source keep to the ledger.
CREATE TABLE IF NOT EXISTS migration_unreadable (
    id            bigserial   PRIMARY KEY,
    migration_id  bigint      NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    tenant_id     text        NOT NULL,
    source        text        NOT NULL,
    kind          text        NOT NULL,
    raw_key       text        NOT NULL,
    reason        text        NOT NULL,
    excerpt       text,                               -- the row as served: its JSON, cut at 300 characters
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT migration_unreadable_once UNIQUE (tenant_id, source, kind, raw_key)
);
CREATE INDEX IF NOT EXISTS migration_unreadable_run ON migration_unreadable (migration_id, kind);
