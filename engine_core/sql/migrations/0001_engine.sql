-- The engine's own tables: the run, its tasks, and the ledger.

CREATE TABLE migrations (
    id               bigserial PRIMARY KEY,
    tenant_id        text        NOT NULL,
    source           text        NOT NULL,
    source_account   text        NOT NULL,
    status           text        NOT NULL DEFAULT 'running'
                     CHECK (status IN ('running', 'stopping', 'stopped', 'succeeded', 'failed')),
    current_phase    integer     NOT NULL DEFAULT 0,
    plan             jsonb       NOT NULL,           -- ordered kind groups, one per phase
    options          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    dry_run          boolean     NOT NULL DEFAULT false,
    cancel_requested boolean     NOT NULL DEFAULT false,
    log              jsonb       NOT NULL DEFAULT '[]'::jsonb,  -- capped, grouped reasons
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);

-- Admission fence: at most one live run per (tenant, source), whoever starts it.
CREATE UNIQUE INDEX migrations_one_live_run
    ON migrations (tenant_id, source) WHERE status IN ('running', 'stopping');
CREATE INDEX migrations_tenant ON migrations (tenant_id, source, id);

CREATE TABLE migration_tasks (
    id               bigserial PRIMARY KEY,
    migration_id     bigint      NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    phase            integer     NOT NULL,
    kind             text        NOT NULL,
    cursor_key       text        NOT NULL,
    cursor           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    processed_offset integer     NOT NULL DEFAULT 0,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
    attempts         integer     NOT NULL DEFAULT 0,
    enqueued_at      timestamptz,                    -- on the lane: counts against MAX_INFLIGHT
    not_before       timestamptz,                    -- parked (daily budget, backoff)
    locked_at        timestamptz,
    locked_by        text,
    stats            jsonb       NOT NULL DEFAULT '{}'::jsonb,
    error            text,
    started_at       timestamptz,
    finished_at      timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    -- find-or-create key: a retried page cannot create a second successor
    CONSTRAINT migration_tasks_cursor UNIQUE (migration_id, kind, cursor_key)
);
CREATE INDEX migration_tasks_phase_status ON migration_tasks (migration_id, phase, status);
CREATE INDEX migration_tasks_running ON migration_tasks (locked_at) WHERE status = 'running';

CREATE TABLE migration_records (
    id            bigserial PRIMARY KEY,
    migration_id  bigint      NOT NULL REFERENCES migrations (id) ON DELETE CASCADE,
    tenant_id     text        NOT NULL,
    source        text        NOT NULL,
    kind          text        NOT NULL,
    source_id     text        NOT NULL,
    record_type   text,
    record_id     bigint,
    action        text        NOT NULL CHECK (action IN ('created', 'matched', 'skipped', 'failed')),
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    -- the ledger: every source row once per tenant
    CONSTRAINT migration_records_once UNIQUE (tenant_id, source, kind, source_id)
);
CREATE INDEX migration_records_run ON migration_records (migration_id, kind, action);

-- The example provider's target (the engine's own demo/test writer); the product's CRM tables
-- come with the Pipedrive provider. No unique key on purpose: the ledger is the only dedupe.
CREATE TABLE example_items (
    id          bigserial PRIMARY KEY,
    tenant_id   text   NOT NULL,
    kind        text   NOT NULL,
    source_id   text   NOT NULL,
    parent_id   bigint,
    payload     jsonb  NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX example_items_tenant ON example_items (tenant_id, kind);
