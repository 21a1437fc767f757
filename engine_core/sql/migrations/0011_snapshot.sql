-- Issue 9: a run is a snapshot plus a catch-up; a sync brings what changed since the last one.
--
-- mode         'full' (every list walked) or 'sync' (only what changed since `since`, plus the
--              id listings deletions need): same phases, claims, windows, budget, stop/retry/resume.
-- snapshot_at  the source's moment the run's listings start from (the source's clock, from its
--              `Date` header, where it answers; the database's otherwise). The main walks cover
--              what the source had then; the catch-up phase brings everything after it.
-- since        a sync's lower bound: the snapshot_at of the tenant's last succeeded run or sync
--              (listings ask `updated_since` = since minus a margin for clock skew).
ALTER TABLE migrations
    ADD COLUMN mode        text NOT NULL DEFAULT 'full' CHECK (mode IN ('full', 'sync')),
    ADD COLUMN snapshot_at timestamptz,
    ADD COLUMN since       timestamptz;

-- The catch-up's inventory: every source id its listings saw, per run and ledger kind. The ledger's
-- live entries of a kind that the inventory did not see are the candidates for deleted at source
-- (each confirmed by a GET that answers 404 before it is marked). Rows go when the run's catch-up
-- of the kind is done; ON DELETE CASCADE takes the rest with the run.
CREATE TABLE migration_inventory (
    migration_id bigint NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    kind         text   NOT NULL,
    source_id    text   NOT NULL,
    PRIMARY KEY (migration_id, kind, source_id)
);

CREATE INDEX migrations_last_snapshot ON migrations (tenant_id, source, snapshot_at DESC)
    WHERE status = 'succeeded' AND NOT dry_run;
