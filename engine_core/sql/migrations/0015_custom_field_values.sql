-- Custom fields stay true at the source's current names.
--
-- Each record's `custom_fields` keeps, per field key, what the record itself says -
-- the value (an option's id, a set's ids), the field type it was read as, a monetary value's
-- currency, a linked record's `record_id` - and no copy of the field's name or of option labels:
-- those live once, in crm.custom_field_definitions, refreshed by every run and sync (a rename or
-- a relabel at the source changes no record's update_time, so copies on the records went stale
-- and only a rewrite of every record could refresh them). The view crm.custom_field_values reads
-- the values with their current names and labels. A definition the source no longer lists is
-- kept, marked `deleted_at_source` (migration 0010's column, set by `writers.write_definitions`);
-- the view still shows its values, flagged.

-- The name and label copies earlier runs stored on the records go (the view gives them).
UPDATE crm.companies SET custom_fields = (SELECT jsonb_object_agg(k, CASE WHEN jsonb_typeof(v) = 'object'
        THEN v - 'name' - 'label' - 'labels' ELSE v END) FROM jsonb_each(custom_fields) AS f(k, v))
 WHERE custom_fields <> '{}'::jsonb;
UPDATE crm.contacts SET custom_fields = (SELECT jsonb_object_agg(k, CASE WHEN jsonb_typeof(v) = 'object'
        THEN v - 'name' - 'label' - 'labels' ELSE v END) FROM jsonb_each(custom_fields) AS f(k, v))
 WHERE custom_fields <> '{}'::jsonb;
UPDATE crm.deals SET custom_fields = (SELECT jsonb_object_agg(k, CASE WHEN jsonb_typeof(v) = 'object'
        THEN v - 'name' - 'label' - 'labels' ELSE v END) FROM jsonb_each(custom_fields) AS f(k, v))
 WHERE custom_fields <> '{}'::jsonb;
UPDATE crm.leads SET custom_fields = (SELECT jsonb_object_agg(k, CASE WHEN jsonb_typeof(v) = 'object'
        THEN v - 'name' - 'label' - 'labels' ELSE v END) FROM jsonb_each(custom_fields) AS f(k, v))
 WHERE custom_fields <> '{}'::jsonb;
UPDATE crm.activities SET custom_fields = (SELECT jsonb_object_agg(k, CASE WHEN jsonb_typeof(v) = 'object'
        THEN v - 'name' - 'label' - 'labels' ELSE v END) FROM jsonb_each(custom_fields) AS f(k, v))
 WHERE custom_fields <> '{}'::jsonb;

-- One row per record and custom value: where it is (record_type, record_id), the field's current
-- name and type, the value as stored, an enum's option label (`label`) or a set's labels in the
-- order of its ids (`labels`; NULL for an id the definition no longer has), a monetary value's
-- currency, a linked record's id, and when the source stopped listing the field (NULL: it lists
-- it). A lead's fields are described by the lead's definitions, else by the deal's (Pipedrive's
-- leads share the deals' custom fields).
CREATE VIEW crm.custom_field_values AS
WITH records AS (
    SELECT 'crm.companies'::text AS record_type, 'organization'::text AS entity, id, tenant_id, source, custom_fields
      FROM crm.companies
    UNION ALL SELECT 'crm.contacts', 'person', id, tenant_id, source, custom_fields FROM crm.contacts
    UNION ALL SELECT 'crm.deals', 'deal', id, tenant_id, source, custom_fields FROM crm.deals
    UNION ALL SELECT 'crm.leads', 'lead', id, tenant_id, source, custom_fields FROM crm.leads
    UNION ALL SELECT 'crm.activities', 'activity', id, tenant_id, source, custom_fields FROM crm.activities
)
SELECT r.record_type, r.id AS record_id, r.tenant_id, r.source, r.entity, f.key AS field_key,
       COALESCE(d.name, f.key) AS name,
       COALESCE(d.field_type, f.value ->> 'type') AS field_type,
       f.value -> 'value' AS value,
       CASE WHEN jsonb_typeof(f.value -> 'value') IN ('number', 'string') THEN
           (SELECT o ->> 'label' FROM jsonb_array_elements(d.options) AS o WHERE o ->> 'id' = f.value ->> 'value' LIMIT 1)
       END AS label,
       CASE WHEN jsonb_typeof(f.value -> 'value') = 'array' THEN
           (SELECT jsonb_agg((SELECT o ->> 'label' FROM jsonb_array_elements(d.options) AS o
                               WHERE o ->> 'id' = i.item #>> '{}' LIMIT 1) ORDER BY i.n)
              FROM jsonb_array_elements(f.value -> 'value') WITH ORDINALITY AS i(item, n))
       END AS labels,
       f.value ->> 'currency' AS currency,
       (f.value ->> 'record_id')::bigint AS linked_record_id,
       d.deleted_at_source AS field_deleted_at_source
  FROM records r
 CROSS JOIN LATERAL jsonb_each(r.custom_fields) AS f(key, value)
  LEFT JOIN LATERAL (
       SELECT c.name, c.field_type, c.options, c.deleted_at_source
         FROM crm.custom_field_definitions c
        WHERE c.tenant_id = r.tenant_id AND c.source IS NOT DISTINCT FROM r.source AND c.field_key = f.key
          AND (c.entity = r.entity OR (r.entity = 'lead' AND c.entity = 'deal'))
        ORDER BY c.entity = r.entity DESC
        LIMIT 1) AS d ON true
 WHERE jsonb_typeof(f.value) = 'object';
