-- No planner statistics for the product tables' jsonb columns (custom fields, emails, phones,
-- addresses, labels, dangling references...): no query filters, joins or sorts on them, and they were
-- most of what an ANALYZE of these tables costs - the sort of every sampled value with jsonb's
-- comparison (crm.contacts at 1,500 rows: 30 ms, 4 ms without them; the engine's statistics keeper
-- analyzes each grown table at every phase boundary, `engine_core/statistics.py`). The tables' other
-- columns and their expression indexes (lower(email)) keep theirs: a column list on ANALYZE would
-- have dropped the expression indexes' statistics.
DO $$
DECLARE
    c record;
BEGIN
    FOR c IN SELECT col.table_name, col.column_name
               FROM information_schema.columns col
               JOIN information_schema.tables t USING (table_schema, table_name)
              WHERE col.table_schema = 'crm' AND col.data_type = 'jsonb' AND t.table_type = 'BASE TABLE'
              ORDER BY col.table_name, col.column_name
    LOOP
        EXECUTE format('ALTER TABLE crm.%I ALTER COLUMN %I SET STATISTICS 0', c.table_name, c.column_name);
    END LOOP;
END $$;
