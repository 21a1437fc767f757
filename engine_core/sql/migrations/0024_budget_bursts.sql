-- The budget's schedule with bursts (engine_core/budget.py, "The guarantee"): the row remembers the
-- database times (epoch seconds, oldest first) of the account's latest granted slots, as many as
-- the limit in force, and a lease places each new slot at the earliest time no window of W + d
-- seconds would hold more than the limit - so a quiet account's requests go out at once instead of
-- one every (W + d) / L seconds. `tat` is no longer read; it keeps the latest slot's time, so an
-- engine of the version before (a deploy's overlap) schedules after this one's slots.
ALTER TABLE source_budgets ADD COLUMN IF NOT EXISTS recent double precision[] NOT NULL DEFAULT '{}';

-- The times of n new slots after the granted ones `recent` (oldest first), each the earliest that is:
-- * at or after `start` (now, or the end of a pause), and after the slot before it;
-- * `spacing` x (j - ready) after `start` for the j-th (1-based) beyond the first `ready` (the
--   slots nobody waits for yet are spread as the sustained rate would, so a chunk leased for one
--   request does not spend the window's room at once);
-- * `horizon` (W + d) after the `lim`-th slot before it: at most `lim` in any horizon;
-- * `gap` (just over d) after the `burst`-th slot before it: a daily report of slot k counts every
--   slot numbered k - burst or lower (the proof's lag);
-- * `spacing` after the slot before it once `half` slots lie within the horizon before it: bursts
--   fill only the first half of a window, so a busy account's slots come evenly, as the sustained
--   rate sends them, and requests sent together never meet a window already near its limit.
-- Pure; the lease statement (engine_core/budget_row.py) calls it under the row lock.
CREATE OR REPLACE FUNCTION budget_slots(recent double precision[], start double precision, n integer,
                                        ready integer, spacing double precision, lim integer,
                                        horizon double precision, burst integer, gap double precision,
                                        half integer)
RETURNS double precision[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    a double precision[] := COALESCE(recent, '{}');
    m integer;
    s double precision := start;
    out double precision[] := '{}';
BEGIN
    FOR j IN 1..n LOOP
        m := COALESCE(array_length(a, 1), 0);
        s := GREATEST(s, start + GREATEST(0, j - ready) * spacing);
        IF m >= lim THEN
            s := GREATEST(s, a[m - lim + 1] + horizon);
        END IF;
        IF m >= burst THEN
            s := GREATEST(s, a[m - burst + 1] + gap);
        END IF;
        IF m >= half AND a[m - half + 1] > s - horizon THEN
            s := GREATEST(s, a[m] + spacing);
        END IF;
        a := a || s;
        out := out || s;
    END LOOP;
    RETURN out;
END
$$;
