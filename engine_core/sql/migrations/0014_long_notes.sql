-- Notes are kept whole up to crm.NOTE_CONTENT_MAX characters (far above anything Pipedrive ever
-- allowed); a longer note is cut there, never dropped, and says so:
--   content_truncated        the content was cut at crm.NOTE_CONTENT_MAX characters
--   content_original_length  the source content's length in characters, when it was cut
ALTER TABLE crm.notes
    ADD COLUMN content_truncated       boolean NOT NULL DEFAULT false,
    ADD COLUMN content_original_length integer;
