-- The source's rate-limit budget: one row per source account, shared by every tenant and worker
-- importing that account (engine_core/budget.py explains the arithmetic).

CREATE TABLE source_budgets (
    source          text             NOT NULL,
    account         text             NOT NULL,  -- the account's key (company id or domain), never a token
    burst_limit     integer          NOT NULL CHECK (burst_limit > 0),  -- per window: configured or reported, the lower
    window_seconds  double precision NOT NULL DEFAULT 2.0 CHECK (window_seconds > 0),
    -- Token bucket in its GCRA form: the earliest time the next chunk may start. One timestamp is
    -- the whole bucket state; every lease moves it forward by the chunk's spacing.
    tat             timestamptz      NOT NULL DEFAULT now(),
    paused_until    timestamptz,     -- a burst 429 was seen: no chunk starts before this
    daily_limit     bigint,          -- x-daily-ratelimit-token-limit, as last reported
    daily_remaining bigint,          -- x-daily-ratelimit-token-remaining, as last reported
    daily_reset_at  timestamptz,     -- the daily budget is spent until then: every worker parks
    leases          bigint           NOT NULL DEFAULT 0,  -- chunks granted, for the run page and the tests
    slots_leased    bigint           NOT NULL DEFAULT 0,
    created_at      timestamptz      NOT NULL DEFAULT now(),
    updated_at      timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (source, account)
);
