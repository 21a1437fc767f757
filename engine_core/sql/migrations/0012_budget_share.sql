-- The budget at the source's real rate (issue 11): slots are scheduled one by one (GCRA per slot,
-- engine_core/budget.py has the proof), a burst 429 slows every worker sharing the account for a
-- while (rate_scale, recovering from last_burst_at), and the daily token budget is spent only up to
-- a configured share (MIGRATE_DAILY_TOKEN_SHARE): the last report of the source's remaining tokens
-- is kept with the sequence number of the slot whose response carried it, so the tokens spent since
-- are bounded by the slots leased since.

ALTER TABLE source_budgets
    ADD COLUMN IF NOT EXISTS daily_seq bigint,  -- slots_leased numbering: the slot whose response reported daily_remaining
    ADD COLUMN IF NOT EXISTS daily_reason text,  -- why daily_reset_at parks: 'share' (our share is reached) | 'spent' (a daily 429)
    ADD COLUMN IF NOT EXISTS rate_scale double precision NOT NULL DEFAULT 1.0
        CHECK (rate_scale > 0 AND rate_scale <= 1),  -- the fraction of the proven rate in force after a burst 429
    ADD COLUMN IF NOT EXISTS last_burst_at timestamptz;  -- the last burst 429: rate_scale recovers from then
