-- Pipelines and their stages, so a deal can show where it stands ("Sales / Negotiation") rather
-- than the source's ids. Written through the ledger like every other kind (kinds `pipelines` and
-- `stages`); a deal links to its pipeline and stage when they are here and keeps the source's ids
-- (pipeline_ref, stage_ref) either way, so a deal whose stage was deleted at the source is still
-- imported.

CREATE TABLE crm.pipelines (
    id                        bigserial PRIMARY KEY,
    tenant_id                 text        NOT NULL,
    name                      text        NOT NULL,
    position                  integer,
    active                    boolean     NOT NULL DEFAULT true,
    deal_probability_enabled  boolean,
    source                    text,
    source_id                 text,
    source_created_at         timestamptz,
    source_updated_at         timestamptz,
    created_at                timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pipelines_tenant ON crm.pipelines (tenant_id, source, source_id);

CREATE TABLE crm.stages (
    id                 bigserial PRIMARY KEY,
    tenant_id          text        NOT NULL,
    pipeline_id        bigint      NOT NULL REFERENCES crm.pipelines (id) ON DELETE CASCADE,
    name               text        NOT NULL,
    position           integer,
    active             boolean     NOT NULL DEFAULT true,
    deal_probability   numeric,
    rotten_after_days  integer,                  -- null when deals never rot in this stage
    source             text,
    source_id          text,
    source_created_at  timestamptz,
    source_updated_at  timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stages_tenant ON crm.stages (tenant_id, source, source_id);
CREATE INDEX stages_pipeline ON crm.stages (pipeline_id);

ALTER TABLE crm.deals
    ADD COLUMN pipeline_id bigint REFERENCES crm.pipelines (id) ON DELETE SET NULL,
    ADD COLUMN stage_id    bigint REFERENCES crm.stages (id) ON DELETE SET NULL;
CREATE INDEX deals_stage ON crm.deals (stage_id);
