-- Issue 8, items 5 and 6.
--
-- 5. References to parents deleted at the source. Pipedrive keeps a child's `org_id` (etc.) after
--    its parent was permanently deleted; GET on the parent answers 404. Such a row is imported
--    with that link empty, and the dangling ids are kept: on the product row (`dangling_refs`) and
--    on its ledger entry (`dangling`), both a list of
--      {"field": "org_id", "parent_kind": "organizations", "parent_id": "42"}
--    (the source's field name, the ledger kind of the parent, the parent's source id).
--    `ledger.dangling_counts(db, run_id)` counts the entries per kind for the rollup.
ALTER TABLE migration_records ADD COLUMN dangling jsonb;
ALTER TABLE crm.contacts   ADD COLUMN dangling_refs jsonb;
ALTER TABLE crm.deals      ADD COLUMN dangling_refs jsonb;
ALTER TABLE crm.leads      ADD COLUMN dangling_refs jsonb;
ALTER TABLE crm.activities ADD COLUMN dangling_refs jsonb;
ALTER TABLE crm.notes      ADD COLUMN dangling_refs jsonb;

-- 6. One identity per source record, whichever list served it. Archived deals and leads used to
--    be ledger kinds of their own (`deals_archived`, `leads_archived`), so a deal archived between
--    the two listings was written twice and its mail hung on the stale copy. From now on both
--    lists write ledger kind `deals` (`leads`). Entries written by older code are folded here:
--    * a source id under both kinds, both written (the defect's own product, two crm rows): the
--      `deals` claim stays; the archived copy's children (activities, notes, emails) move onto the
--      kept row, which takes the copy's archived flag when the copy is the newer version (or the
--      versions tie and the copy is archived), then the copy and its claim are deleted;
--    * a source id under both kinds where one side is a placeholder (skipped or failed): the
--      placeholder goes, the other entry stays;
--    * every other `deals_archived` / `leads_archived` entry is renamed to `deals` / `leads`.
--    A dry run's would-be writes (migration_dry_records) are renamed the same way.

CREATE TEMP TABLE fold_twins ON COMMIT DROP AS
SELECT keep.kind, keep.id AS keep_claim, copy.id AS drop_claim, keep.record_id AS keep_id, copy.record_id AS drop_id
  FROM migration_records keep
  JOIN migration_records copy
    ON copy.tenant_id = keep.tenant_id AND copy.source = keep.source AND copy.source_id = keep.source_id
   AND copy.kind = keep.kind || '_archived'
 WHERE keep.kind IN ('deals', 'leads')
   AND keep.action IN ('created', 'matched') AND copy.action IN ('created', 'matched')
   AND keep.record_type = 'crm.' || keep.kind AND copy.record_type = keep.record_type
   AND keep.record_id IS NOT NULL AND copy.record_id IS NOT NULL AND keep.record_id <> copy.record_id;

UPDATE crm.activities x SET deal_id = f.keep_id FROM fold_twins f WHERE f.kind = 'deals' AND x.deal_id = f.drop_id;
UPDATE crm.notes      x SET deal_id = f.keep_id FROM fold_twins f WHERE f.kind = 'deals' AND x.deal_id = f.drop_id;
UPDATE crm.emails     x SET deal_id = f.keep_id FROM fold_twins f WHERE f.kind = 'deals' AND x.deal_id = f.drop_id;
UPDATE crm.activities x SET lead_id = f.keep_id FROM fold_twins f WHERE f.kind = 'leads' AND x.lead_id = f.drop_id;
UPDATE crm.notes      x SET lead_id = f.keep_id FROM fold_twins f WHERE f.kind = 'leads' AND x.lead_id = f.drop_id;

UPDATE crm.deals k
   SET archived = c.archived, archived_at = c.archived_at, source_updated_at = c.source_updated_at
  FROM fold_twins f JOIN crm.deals c ON c.id = f.drop_id
 WHERE f.kind = 'deals' AND k.id = f.keep_id AND k.archived IS DISTINCT FROM c.archived
   AND (c.source_updated_at > k.source_updated_at
        OR ((c.source_updated_at IS NULL OR k.source_updated_at IS NULL OR c.source_updated_at = k.source_updated_at)
            AND c.archived));
UPDATE crm.leads k
   SET archived = c.archived, source_updated_at = c.source_updated_at
  FROM fold_twins f JOIN crm.leads c ON c.id = f.drop_id
 WHERE f.kind = 'leads' AND k.id = f.keep_id AND k.archived IS DISTINCT FROM c.archived
   AND (c.source_updated_at > k.source_updated_at
        OR ((c.source_updated_at IS NULL OR k.source_updated_at IS NULL OR c.source_updated_at = k.source_updated_at)
            AND c.archived));

DELETE FROM crm.deals x USING fold_twins f WHERE f.kind = 'deals' AND x.id = f.drop_id;
DELETE FROM crm.leads x USING fold_twins f WHERE f.kind = 'leads' AND x.id = f.drop_id;
DELETE FROM migration_records r USING fold_twins f WHERE r.id = f.drop_claim;

-- a placeholder beside a written twin goes; two placeholders keep the active list's
DELETE FROM migration_records copy USING migration_records keep
 WHERE copy.kind IN ('deals_archived', 'leads_archived') AND keep.kind || '_archived' = copy.kind
   AND copy.tenant_id = keep.tenant_id AND copy.source = keep.source AND copy.source_id = keep.source_id
   AND copy.action IN ('skipped', 'failed');
DELETE FROM migration_records keep USING migration_records copy
 WHERE copy.kind IN ('deals_archived', 'leads_archived') AND keep.kind || '_archived' = copy.kind
   AND copy.tenant_id = keep.tenant_id AND copy.source = keep.source AND copy.source_id = keep.source_id
   AND keep.action IN ('skipped', 'failed');
-- (two written twins that fold_twins could not pair - e.g. one claim pointing at no row - are
-- left as they are: the rename below would break the ledger's uniqueness, so it skips them)
UPDATE migration_records r SET kind = left(r.kind, -length('_archived'))
 WHERE r.kind IN ('deals_archived', 'leads_archived')
   AND NOT EXISTS (SELECT 1 FROM migration_records o
                    WHERE o.tenant_id = r.tenant_id AND o.source = r.source AND o.source_id = r.source_id
                      AND o.kind = left(r.kind, -length('_archived')));

DELETE FROM migration_dry_records copy USING migration_dry_records keep
 WHERE copy.kind IN ('deals_archived', 'leads_archived') AND keep.kind || '_archived' = copy.kind
   AND copy.migration_id = keep.migration_id AND copy.source_id = keep.source_id;
UPDATE migration_dry_records SET kind = left(kind, -length('_archived'))
 WHERE kind IN ('deals_archived', 'leads_archived');
