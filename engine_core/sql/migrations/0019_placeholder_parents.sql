-- A placeholder skipped as not linked keeps the parents it was mapped with: a JSON list of
--   {"kinds": ["persons"], "id": "12", "missing": true}
-- (the ledger kinds the parent may be written under, its source id, and whether it was missing
-- when the row was skipped), NULL for every other entry. The catch-up reads a fan-out row again
-- through the record it was listed under once every parent is written (a participant read before
-- its person was written: providers/pipedrive/retake.py), and verify tells such a row apart from a
-- settled skip. Cleared when a write takes the placeholder over.
ALTER TABLE migration_records ADD COLUMN parents jsonb;
