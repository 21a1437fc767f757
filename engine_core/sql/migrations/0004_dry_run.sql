-- What a dry run would have written, so its later phases link to parents it would have created
-- (a dry run writes nothing to the target or the ledger: its rows' savepoints roll back).
CREATE TABLE migration_dry_records (
    migration_id  bigint NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    kind          text   NOT NULL,
    source_id     text   NOT NULL,
    outcome       text   NOT NULL,
    PRIMARY KEY (migration_id, kind, source_id)
);
