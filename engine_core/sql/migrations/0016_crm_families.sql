-- The rest of a Pipedrive account: products and deal lines, files (metadata, and their bytes in a
-- content-addressed store), deal participants, followers and deal history.
--
-- As in 0003: every row has its tenant, rows a migration wrote carry `source`/`source_id`, and the
-- ledger (migration_records) is the only dedupe. A reference the source names but that may be gone
-- there (a deal line's product purged, a file's parent deleted) keeps the source's id in a `*_ref`
-- column beside the link, so the product can say what it pointed at.

CREATE TABLE crm.products (
    id                       bigserial PRIMARY KEY,
    tenant_id                text        NOT NULL,
    name                     text        NOT NULL,
    code                     text,
    description              text,
    unit                     text,
    tax                      numeric,
    category                 text,
    active                   boolean     NOT NULL DEFAULT true,   -- the source's is_deleted, inverted
    selectable               boolean,                             -- the source's is_linkable
    visible_to               text,
    owner_id                 bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    prices                   jsonb       NOT NULL DEFAULT '[]'::jsonb,  -- [{"currency", "price", "cost", ...}]
    billing_frequency        text,
    billing_frequency_cycles integer,
    custom_fields            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source                   text,
    source_id                text,
    source_created_at        timestamptz,
    source_updated_at        timestamptz,
    created_at               timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX products_tenant ON crm.products (tenant_id, source, source_id);

-- One line of a deal: the product sold, how many, at what price. `sum` is the source's total
-- (quantity x item_price less the discount, plus an exclusive tax), kept as served, not recomputed.
CREATE TABLE crm.deal_products (
    id                       bigserial PRIMARY KEY,
    tenant_id                text        NOT NULL,
    deal_id                  bigint      NOT NULL REFERENCES crm.deals (id) ON DELETE CASCADE,
    product_id               bigint      REFERENCES crm.products (id) ON DELETE SET NULL,
    product_ref              text,                                -- the source's product id
    name                     text,
    quantity                 numeric,
    item_price               numeric,
    discount                 numeric,
    discount_type            text,                                -- percentage | amount
    tax                      numeric,
    tax_method               text,                                -- exclusive | inclusive | none
    sum                      numeric,
    currency                 text,
    order_nr                 integer,
    comments                 text,
    enabled                  boolean,
    billing_frequency        text,
    billing_frequency_cycles integer,
    billing_start_date       date,
    source                   text,
    source_id                text,
    source_created_at        timestamptz,
    source_updated_at        timestamptz,
    created_at               timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deal_products_tenant ON crm.deal_products (tenant_id, source, source_id);
CREATE INDEX deal_products_deal ON crm.deal_products (deal_id, order_nr);

-- File contents, once per tenant and content (sha256 of the bytes): two files with the same
-- bytes, or a file a later run reads again unchanged, share one blob. The bytes live in
-- crm.file_blob_chunks (engine_core.target.files.PostgresFileStore) or outside the database (the
-- directory store: no chunk rows). `sha256` is NULL while a blob is being written.
CREATE TABLE crm.file_blobs (
    id         bigserial PRIMARY KEY,
    tenant_id  text        NOT NULL,
    sha256     text        CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size       bigint      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT file_blobs_once UNIQUE (tenant_id, sha256)
);

CREATE TABLE crm.file_blob_chunks (
    blob_id bigint  NOT NULL REFERENCES crm.file_blobs (id) ON DELETE CASCADE,
    n       integer NOT NULL,                                    -- 0, 1, ... in byte order
    data    bytea   NOT NULL,
    PRIMARY KEY (blob_id, n)
);

-- A file's metadata and where its bytes are. content_status says why a file has no bytes here:
--   stored      content_sha256 names its blob
--   pending     not fetched yet (contents are fetched after the metadata, or left out of the run)
--   forbidden   the download answered 403 (private to another user)
--   missing     the download answered 404 (purged from the source's storage)
--   too_large   file_size is above the store's size limit
CREATE TABLE crm.files (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    name              text,
    file_name         text        NOT NULL,
    file_type         text,
    file_size         bigint,
    description       text,
    deal_id           bigint      REFERENCES crm.deals (id) ON DELETE SET NULL,
    lead_id           bigint      REFERENCES crm.leads (id) ON DELETE SET NULL,
    contact_id        bigint      REFERENCES crm.contacts (id) ON DELETE SET NULL,
    company_id        bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    activity_id       bigint      REFERENCES crm.activities (id) ON DELETE SET NULL,
    product_id        bigint      REFERENCES crm.products (id) ON DELETE SET NULL,
    owner_id          bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    remote_location   text,
    content_status    text        NOT NULL DEFAULT 'pending'
                      CHECK (content_status IN ('stored', 'pending', 'forbidden', 'missing', 'too_large')),
    content_sha256    text        CHECK (content_sha256 ~ '^[0-9a-f]{64}$'),
    dangling_refs     jsonb,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX files_tenant ON crm.files (tenant_id, source, source_id);
CREATE INDEX files_deal ON crm.files (deal_id);
CREATE INDEX files_pending ON crm.files (tenant_id) WHERE content_status = 'pending';

-- A person taking part in a deal (besides or including the deal's own person).
CREATE TABLE crm.deal_participants (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    deal_id           bigint      NOT NULL REFERENCES crm.deals (id) ON DELETE CASCADE,
    contact_id        bigint      REFERENCES crm.contacts (id) ON DELETE CASCADE,
    contact_ref       text,                                       -- the source's person id
    added_by_id       bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    active            boolean     NOT NULL DEFAULT true,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deal_participants_tenant ON crm.deal_participants (tenant_id, source, source_id);
CREATE INDEX deal_participants_deal ON crm.deal_participants (deal_id);

-- A user following a deal, a contact or a company: exactly one of the three is set.
CREATE TABLE crm.followers (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    user_id           bigint      REFERENCES crm.users (id) ON DELETE CASCADE,
    user_ref          text,                                       -- the source's user id
    deal_id           bigint      REFERENCES crm.deals (id) ON DELETE CASCADE,
    contact_id        bigint      REFERENCES crm.contacts (id) ON DELETE CASCADE,
    company_id        bigint      REFERENCES crm.companies (id) ON DELETE CASCADE,
    source            text,
    source_id         text,                                       -- "<deals|persons|organizations>:<id>:<user id>"
    source_created_at timestamptz,                                -- when the user started following
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT followers_one_record CHECK (num_nonnulls(deal_id, contact_id, company_id) = 1)
);
CREATE INDEX followers_tenant ON crm.followers (tenant_id, source, source_id);
CREATE INDEX followers_deal ON crm.followers (deal_id) WHERE deal_id IS NOT NULL;
CREATE INDEX followers_contact ON crm.followers (contact_id) WHERE contact_id IS NOT NULL;
CREATE INDEX followers_company ON crm.followers (company_id) WHERE company_id IS NOT NULL;

-- One change of one deal field, as the source's changelog says it (values as text).
CREATE TABLE crm.deal_history (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    deal_id           bigint      NOT NULL REFERENCES crm.deals (id) ON DELETE CASCADE,
    field_key         text        NOT NULL,                       -- stage_id, value, status, title, ...
    old_value         text,
    new_value         text,
    changed_at        timestamptz NOT NULL,
    actor_id          bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    change_source     text,
    source            text,
    source_id         text,                                       -- "<deal id>:<digest of the entry>"
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deal_history_tenant ON crm.deal_history (tenant_id, source, source_id);
CREATE INDEX deal_history_field ON crm.deal_history (deal_id, field_key, changed_at);

-- Time in stage: one row per stay of a deal in a stage (stage_ref: the source's stage id), from
-- the stage_id changes in crm.deal_history. The first stay starts at the deal's creation; the
-- last one is open (left_at NULL, duration up to now, or to the close for a won or lost deal).
CREATE VIEW crm.deal_stage_periods AS
WITH changes AS (
    SELECT h.tenant_id, h.deal_id, h.old_value, h.new_value, h.changed_at,
           row_number() OVER (PARTITION BY h.deal_id ORDER BY h.changed_at, h.id) AS n
      FROM crm.deal_history h
     WHERE h.field_key = 'stage_id'
), stays AS (
    SELECT tenant_id, deal_id, new_value AS stage_ref, changed_at AS entered_at FROM changes
    UNION ALL
    SELECT c.tenant_id, c.deal_id, c.old_value, d.source_created_at
      FROM changes c JOIN crm.deals d ON d.id = c.deal_id
     WHERE c.n = 1 AND c.old_value IS NOT NULL AND d.source_created_at IS NOT NULL
), ordered AS (
    SELECT s.*, lead(s.entered_at) OVER (PARTITION BY s.deal_id ORDER BY s.entered_at) AS left_at
      FROM stays s
)
SELECT o.tenant_id, o.deal_id, o.stage_ref, o.entered_at, o.left_at,
       COALESCE(o.left_at, d.closed_at, now()) - o.entered_at AS duration
  FROM ordered o JOIN crm.deals d ON d.id = o.deal_id;
