-- The product's CRM tables (schema `crm`): what a migration writes and what the product shows.
--
-- Every row has its tenant. Rows a migration created carry `source` and `source_id` (where they
-- came from); rows the product already had carry neither, and only those are candidates for
-- "already here" matching (a contact by email, a company by name or domain). No unique key on
-- (tenant, source, source_id) on purpose: the ledger (migration_records) is the only dedupe, and
-- a target row exists only with its ledger claim, written in the same transaction.
--
-- Custom fields are stored on each record as jsonb keyed by the field's key, each value carrying
-- the field's name and type and, for option fields, the option labels, so the product can show
-- them without a join; the definitions themselves are in crm.custom_field_definitions.

CREATE SCHEMA IF NOT EXISTS crm;

CREATE TABLE crm.custom_field_definitions (
    id          bigserial PRIMARY KEY,
    tenant_id   text        NOT NULL,
    source      text        NOT NULL,
    entity      text        NOT NULL,            -- deal, person, organization, activity, lead, note
    field_key   text        NOT NULL,            -- the source's key (a 40-hex hash for custom fields)
    name        text        NOT NULL,
    field_type  text        NOT NULL,            -- varchar, text, double, monetary, date, enum, set, ...
    options     jsonb,                           -- [{"id": 117, "label": "High"}] for enum/set
    subfields   jsonb,
    is_custom   boolean     NOT NULL DEFAULT false,
    position    integer     NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- one definition per field: a later run refreshes names and option labels in place
    CONSTRAINT custom_field_definitions_once UNIQUE (tenant_id, source, entity, field_key)
);

CREATE TABLE crm.users (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    name              text        NOT NULL,
    email             text,
    phone             text,
    active            boolean     NOT NULL DEFAULT true,
    is_admin          boolean     NOT NULL DEFAULT false,
    timezone          text,
    locale            text,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX users_tenant ON crm.users (tenant_id, lower(email));

CREATE TABLE crm.companies (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    name              text        NOT NULL,
    -- the matching key: case and spacing do not make a second company
    name_key          text        GENERATED ALWAYS AS (lower(regexp_replace(btrim(name), '\s+', ' ', 'g'))) STORED,
    domain            text,                      -- lower-case host, no www.
    owner_id          bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    address           jsonb,
    label_ids         jsonb       NOT NULL DEFAULT '[]'::jsonb,
    visible_to        text,
    custom_fields     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX companies_name ON crm.companies (tenant_id, name_key);
CREATE INDEX companies_domain ON crm.companies (tenant_id, domain) WHERE domain IS NOT NULL;
CREATE INDEX companies_source ON crm.companies (tenant_id, source, source_id);

CREATE TABLE crm.contacts (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    name              text        NOT NULL,
    first_name        text,
    last_name         text,
    email             text,                      -- the primary address, lower case
    emails            jsonb       NOT NULL DEFAULT '[]'::jsonb,   -- [{"value", "label", "primary"}]
    phones            jsonb       NOT NULL DEFAULT '[]'::jsonb,
    job_title         text,
    company_id        bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    owner_id          bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    postal_address    jsonb,
    birthday          date,
    label_ids         jsonb       NOT NULL DEFAULT '[]'::jsonb,
    visible_to        text,
    custom_fields     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX contacts_email ON crm.contacts (tenant_id, lower(email));
CREATE INDEX contacts_company ON crm.contacts (company_id);
CREATE INDEX contacts_source ON crm.contacts (tenant_id, source, source_id);

CREATE TABLE crm.deals (
    id                  bigserial PRIMARY KEY,
    tenant_id           text        NOT NULL,
    title               text        NOT NULL,
    value               numeric,
    currency            text,
    status              text,                    -- open, won, lost
    archived            boolean     NOT NULL DEFAULT false,
    archived_at         timestamptz,
    contact_id          bigint      REFERENCES crm.contacts (id) ON DELETE SET NULL,
    company_id          bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    owner_id            bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    pipeline_ref        text,                    -- the source's pipeline and stage ids
    stage_ref           text,
    probability         numeric,
    lost_reason         text,
    expected_close_date date,
    closed_at           timestamptz,
    won_at              timestamptz,
    lost_at             timestamptz,
    stage_changed_at    timestamptz,
    origin              text,
    label_ids           jsonb       NOT NULL DEFAULT '[]'::jsonb,
    visible_to          text,
    custom_fields       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source              text,
    source_id           text,
    source_created_at   timestamptz,
    source_updated_at   timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX deals_tenant ON crm.deals (tenant_id, source, source_id);
CREATE INDEX deals_contact ON crm.deals (contact_id);
CREATE INDEX deals_company ON crm.deals (company_id);

CREATE TABLE crm.leads (
    id                  bigserial PRIMARY KEY,
    tenant_id           text        NOT NULL,
    title               text        NOT NULL,
    value               numeric,
    currency            text,
    archived            boolean     NOT NULL DEFAULT false,
    contact_id          bigint      REFERENCES crm.contacts (id) ON DELETE SET NULL,
    company_id          bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    owner_id            bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    source_name         text,                    -- where the lead came from (web form, import, ...)
    expected_close_date date,
    was_seen            boolean,
    label_ids           jsonb       NOT NULL DEFAULT '[]'::jsonb,
    visible_to          text,
    custom_fields       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source              text,
    source_id           text,
    source_created_at   timestamptz,
    source_updated_at   timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX leads_tenant ON crm.leads (tenant_id, source, source_id);

CREATE TABLE crm.activities (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    subject           text        NOT NULL,
    activity_type     text,
    done              boolean     NOT NULL DEFAULT false,
    done_at           timestamptz,
    due_date          date,
    due_time          text,
    duration          text,
    busy              boolean,
    location          jsonb,
    note              text,
    public_description text,
    participants      jsonb       NOT NULL DEFAULT '[]'::jsonb,
    deal_id           bigint      REFERENCES crm.deals (id) ON DELETE SET NULL,
    lead_id           bigint      REFERENCES crm.leads (id) ON DELETE SET NULL,
    contact_id        bigint      REFERENCES crm.contacts (id) ON DELETE SET NULL,
    company_id        bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    owner_id          bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    custom_fields     jsonb       NOT NULL DEFAULT '{}'::jsonb,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX activities_tenant ON crm.activities (tenant_id, source, source_id);
CREATE INDEX activities_deal ON crm.activities (deal_id);

CREATE TABLE crm.notes (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    content           text        NOT NULL,
    deal_id           bigint      REFERENCES crm.deals (id) ON DELETE SET NULL,
    lead_id           bigint      REFERENCES crm.leads (id) ON DELETE SET NULL,
    contact_id        bigint      REFERENCES crm.contacts (id) ON DELETE SET NULL,
    company_id        bigint      REFERENCES crm.companies (id) ON DELETE SET NULL,
    author_id         bigint      REFERENCES crm.users (id) ON DELETE SET NULL,
    pinned            jsonb       NOT NULL DEFAULT '[]'::jsonb,   -- ["deal", "person", ...]
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notes_tenant ON crm.notes (tenant_id, source, source_id);
CREATE INDEX notes_deal ON crm.notes (deal_id);

CREATE TABLE crm.emails (
    id                bigserial PRIMARY KEY,
    tenant_id         text        NOT NULL,
    deal_id           bigint      NOT NULL REFERENCES crm.deals (id) ON DELETE CASCADE,
    subject           text        NOT NULL,
    snippet           text,
    body              text,
    sender            jsonb       NOT NULL DEFAULT '[]'::jsonb,   -- [{"email", "name", "contact_id"}]
    recipients        jsonb       NOT NULL DEFAULT '{}'::jsonb,   -- {"to": [...], "cc": [...], "bcc": [...]}
    sent_at           timestamptz,
    outbound          boolean,
    thread_ref        text,
    has_attachments   boolean     NOT NULL DEFAULT false,
    source            text,
    source_id         text,
    source_created_at timestamptz,
    source_updated_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX emails_tenant ON crm.emails (tenant_id, source, source_id);
CREATE INDEX emails_deal ON crm.emails (deal_id, sent_at);
