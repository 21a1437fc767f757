-- Mail bodies the source serves but Postgres (or the product) cannot hold as given (issue 8, item 7):
-- an email is always imported; these columns say what happened to its body.
--   body_truncated        the body was longer than crm.EMAIL_BODY_MAX characters and was cut there
--   body_original_length  the source body's length in characters, when it was cut
--   body_unavailable      the HTTP status the body fetch answered when there is no body to show:
--                         403 (a private message) or 404 (deleted since its deal was listed);
--                         NULL when the body was fetched
ALTER TABLE crm.emails
    ADD COLUMN body_truncated       boolean  NOT NULL DEFAULT false,
    ADD COLUMN body_original_length integer,
    ADD COLUMN body_unavailable     smallint CHECK (body_unavailable BETWEEN 400 AND 499);
