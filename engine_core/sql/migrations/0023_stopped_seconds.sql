-- A run's elapsed time is the time it was running: its span from start to end (or now) less the
-- spans it spent stopped, failed or ended before a resume, retry or rerun reopened it
-- (`runs.active_seconds`). Without this, a run stopped for a day and resumed counted a day elapsed.
-- Added by `reopen_run` as it reopens the run: `finished_at` is when that span began.
ALTER TABLE migrations ADD COLUMN IF NOT EXISTS stopped_seconds double precision NOT NULL DEFAULT 0;
