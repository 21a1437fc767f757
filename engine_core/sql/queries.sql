-- Named statements of the engine. Code refers to them by name; parameters are %(named)s.

-- name: live_run_for_tenant --
SELECT * FROM migrations
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND status IN ('running', 'stopping')
 ORDER BY id DESC LIMIT 1;

-- name: succeeded_full_runs --
-- The tenant's succeeded full runs of a source (syncs aside; dry runs only when asked), newest
-- first: what a new full run would repeat (`runs.migrated_by`).
SELECT * FROM migrations
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND status = 'succeeded' AND mode <> 'sync'
   AND (%(dry)s OR NOT dry_run)
 ORDER BY id DESC;

-- name: latest_run_for_tenant --
SELECT * FROM migrations
 WHERE tenant_id = %(tenant_id)s AND (%(source)s::text IS NULL OR source = %(source)s)
 ORDER BY id DESC LIMIT 1;

-- name: latest_runs --
-- Every tenant's latest run per source (`runs.latest_runs`, `migrate status` without a tenant),
-- with its tasks' counts by status as {status: n}.
SELECT m.*,
       (SELECT COALESCE(jsonb_object_agg(c.status, c.n), '{}'::jsonb)
          FROM (SELECT status, count(*) AS n FROM migration_tasks t
                 WHERE t.migration_id = m.id GROUP BY status) c) AS task_counts
  FROM (SELECT DISTINCT ON (tenant_id, source) * FROM migrations
         WHERE %(source)s::text IS NULL OR source = %(source)s
         ORDER BY tenant_id, source, id DESC) m
 ORDER BY m.tenant_id, m.source;

-- name: get_run --
SELECT * FROM migrations WHERE id = %(run_id)s;

-- name: run_idle_seconds --
-- Seconds since anything worked on the run: its heartbeat (a settled task's, throttled), its tasks'
-- checkpoints and finishes, and the lock keeper's renewals of running tasks' locks (every third of
-- the stale-lock threshold). `migrate status` says when this passes the threshold.
SELECT extract(epoch FROM now() - greatest(m.heartbeat_at,
         (SELECT max(greatest(t.updated_at, t.locked_at)) FROM migration_tasks t WHERE t.migration_id = m.id)))::float8
       AS idle_seconds
  FROM migrations m WHERE m.id = %(run_id)s;

-- name: insert_run --
-- Fenced by the partial unique index migrations_one_live_run: a second live run fails to insert.
INSERT INTO migrations (tenant_id, source, source_account, source_identity, plan, options, dry_run)
VALUES (%(tenant_id)s, %(source)s, %(source_account)s, %(source_identity)s, %(plan)s, %(options)s, %(dry_run)s)
RETURNING *;

-- name: bind_source_identity --
-- The first worker to learn what the source's data belongs to records it; everyone gets the bound value.
UPDATE migrations SET source_identity = COALESCE(source_identity, %(identity)s)
 WHERE id = %(run_id)s
RETURNING source_identity;

-- name: insert_task --
-- Find-or-create on (run, kind, cursor_key): seeding or a successor twice creates one task.
INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor)
VALUES (%(run_id)s, %(phase)s, %(kind)s, %(cursor_key)s, %(cursor)s)
ON CONFLICT ON CONSTRAINT migration_tasks_cursor DO NOTHING
RETURNING id;

-- name: get_task --
SELECT * FROM migration_tasks WHERE id = %(task_id)s;

-- name: lock_run_lane --
-- Serialises top-ups of one run so the in-flight bound is exact (transaction-scoped).
SELECT pg_advisory_xact_lock(7741, %(run_id)s::int);

-- name: enqueue_pending --
-- Refill to the deficit: only tasks not yet enqueued are new work. Re-enqueueing a task that is
-- already enqueued (the seed's one-successor bug) adds nothing and lets the pool decay to one.
WITH inflight AS (
    SELECT count(*) AS n FROM migration_tasks
     WHERE migration_id = %(run_id)s
       AND (status = 'running' OR (status = 'pending' AND enqueued_at IS NOT NULL))
)
UPDATE migration_tasks SET enqueued_at = now(), updated_at = now()
 WHERE id IN (
    SELECT t.id FROM migration_tasks t JOIN migrations m ON m.id = t.migration_id
     WHERE t.migration_id = %(run_id)s AND t.status = 'pending' AND t.enqueued_at IS NULL
       AND (t.phase = m.current_phase
            OR (t.phase = m.current_phase + 1 AND t.cursor @> '{"early": true}'::jsonb))
       AND m.status = 'running'
     ORDER BY t.phase, t.id
     LIMIT GREATEST(0, %(max_inflight)s - (SELECT n FROM inflight))
 )
RETURNING id;

-- name: inflight_count --
SELECT count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'pending' AND enqueued_at IS NOT NULL) AS enqueued,
       count(*) FILTER (WHERE status = 'pending') AS pending
  FROM migration_tasks WHERE migration_id = %(run_id)s;

-- name: drain_look --
-- What a lane that found nothing to claim looks at, in one round trip (issue 11: it was two, and
-- idle lanes look after every wake-up): the run as it is now and its tasks' `inflight_count`.
SELECT m.*, c.running, c.enqueued, c.pending
  FROM migrations m,
       LATERAL (SELECT count(*) FILTER (WHERE status = 'running') AS running,
                       count(*) FILTER (WHERE status = 'pending' AND enqueued_at IS NOT NULL) AS enqueued,
                       count(*) FILTER (WHERE status = 'pending') AS pending
                  FROM migration_tasks WHERE migration_id = m.id) c
 WHERE m.id = %(run_id)s;

-- name: claim_task --
-- The claim fence: of workers racing for one task, only the one that sees it pending proceeds.
UPDATE migration_tasks
   SET status = 'running', attempts = attempts + 1, locked_at = now(), locked_by = %(worker)s,
       started_at = COALESCE(started_at, now()), updated_at = now()
 WHERE id = %(task_id)s AND status = 'pending'
RETURNING *;

-- name: claim_next --
-- Oldest enqueued task of the run's current phase; `status = 'pending'` is the fence, SKIP LOCKED
-- only spares racing workers a wait. Gated on the barrier and the stop flag. An early task of the
-- next phase (cursor `early`: it only reads the source and hands on tasks of its own phase, e.g. a
-- discovery) may run while the current phase's tail runs (issue 11), after the current phase's.
UPDATE migration_tasks t
   SET status = 'running', attempts = t.attempts + 1, locked_at = now(), locked_by = %(worker)s,
       started_at = COALESCE(t.started_at, now()), updated_at = now()
 WHERE t.id = (
        SELECT c.id FROM migration_tasks c JOIN migrations m ON m.id = c.migration_id
         WHERE (%(run_id)s::bigint IS NULL OR c.migration_id = %(run_id)s)
           AND c.status = 'pending' AND c.enqueued_at IS NOT NULL
           AND (c.phase = m.current_phase
                OR (c.phase = m.current_phase + 1 AND c.cursor @> '{"early": true}'::jsonb))
           AND (%(max_phase)s::int IS NULL OR c.phase <= %(max_phase)s)
           AND m.status = 'running' AND NOT m.cancel_requested
           AND (c.not_before IS NULL OR c.not_before <= now())
         ORDER BY c.phase, c.enqueued_at, c.id
         LIMIT 1
           FOR UPDATE OF c SKIP LOCKED)
   AND t.status = 'pending'
RETURNING t.*;

-- name: checkpoint_task --
-- Written inside the window's transaction; fenced on our lock so a worker whose task was
-- released as stale cannot commit rows for it.
UPDATE migration_tasks
   SET processed_offset = %(offset)s, stats = %(stats)s, locked_at = now(), updated_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s;

-- name: touch_task --
-- The lock keeper's (and a long wait's) heartbeat; 0 rows: the lock is lost (released as stale).
UPDATE migration_tasks SET locked_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s;

-- name: update_task_cursor --
-- A task that moves its own cursor (e.g. next page of a deal's mail) restarts its offset with it.
UPDATE migration_tasks
   SET cursor = %(cursor)s, processed_offset = %(offset)s, stats = %(stats)s, locked_at = now(), updated_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s;

-- name: finish_task --
-- Only the worker holding the lock can finish the task.
UPDATE migration_tasks
   SET status = %(status)s, stats = %(stats)s, error = %(error)s, finished_at = now(),
       locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s
RETURNING id;

-- name: release_task --
-- Back to pending with the cursor and offset intact; `refund` gives back the attempt for waits
-- that are not failures (a spent daily budget).
UPDATE migration_tasks
   SET status = 'pending', locked_at = NULL, locked_by = NULL, error = %(error)s,
       not_before = %(not_before)s, attempts = GREATEST(0, attempts - %(refund)s), updated_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s
RETURNING id;

-- name: cancel_running_task --
-- Only a stop of the run cancels a task (issue 8): fenced on the run's flag too, so a worker that
-- is merely shutting down can never cancel a task of a run nobody stopped (it releases it instead).
UPDATE migration_tasks
   SET status = 'cancelled', stats = %(stats)s, locked_at = NULL, locked_by = NULL, updated_at = now()
 WHERE id = %(task_id)s AND status = 'running' AND locked_by = %(worker)s
   AND EXISTS (SELECT 1 FROM migrations m WHERE m.id = migration_id AND m.cancel_requested)
RETURNING id;

-- name: heartbeat_run --
-- Throttled: the run row is hot, so it is rewritten at most once per interval.
UPDATE migrations SET heartbeat_at = now()
 WHERE id = %(run_id)s AND heartbeat_at < now() - make_interval(secs => %(interval)s);

-- name: after_task --
-- A settled task's one look at its run (issue 11: one round trip where three were): the heartbeat
-- (throttled as `heartbeat_run`), the run as it is now (its stop flag), and how many tasks of the
-- task's phase are still open - pending, running or cancelled, `advance_phase`'s own count. Read
-- after the task's settle committed, so the last finisher of a phase sees 0 and tries the barrier.
WITH beat AS (
    UPDATE migrations SET heartbeat_at = now()
     WHERE id = %(run_id)s AND heartbeat_at < now() - make_interval(secs => %(interval)s)
    RETURNING id
)
SELECT m.*,
       (SELECT count(*) FROM migration_tasks t
         WHERE t.migration_id = m.id AND t.phase = %(phase)s
           AND t.status NOT IN ('succeeded', 'failed')) AS phase_open,
       (SELECT count(*) FROM beat) AS beat
  FROM migrations m WHERE m.id = %(run_id)s;

-- name: advance_phase --
-- The barrier. Two fences: `current_phase = phase` (a late task of an earlier phase advances
-- nothing) and every task of the phase settled as succeeded or failed (only the last finisher of
-- the phase wins; a pending, running or cancelled task holds it - a cancelled task in a run nobody
-- stopped is re-armed by the reaper, never walked past). A phase that closes with failed tasks
-- fails the run there (issue 10): nothing of the next phase is seeded, `current_phase` stays on
-- the failed phase for a retry to rewind to. `failed_tasks` says which case won.
WITH phase AS (
    SELECT count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed')) AS open
      FROM migration_tasks
     WHERE migration_id = %(run_id)s AND phase = %(phase)s
)
UPDATE migrations m
   SET current_phase = CASE WHEN p.failed = 0 THEN %(phase)s + 1 ELSE m.current_phase END,
       status = CASE WHEN p.failed = 0 THEN m.status ELSE 'failed' END,
       finished_at = CASE WHEN p.failed = 0 THEN m.finished_at ELSE now() END,
       updated_at = now()
  FROM phase p
 WHERE m.id = %(run_id)s AND m.current_phase = %(phase)s AND m.status = 'running'
   AND NOT m.cancel_requested AND p.open = 0
RETURNING m.*, p.failed AS failed_tasks;

-- name: finalize_run --
-- Terminal once. `succeeded` only when every task of the run succeeded: a failed, cancelled,
-- pending or running task means rows not accounted for, so the run says failed (issue 8).
UPDATE migrations
   SET status = CASE WHEN EXISTS (SELECT 1 FROM migration_tasks
                                   WHERE migration_id = %(run_id)s AND status <> 'succeeded')
                     THEN 'failed' ELSE 'succeeded' END,
       finished_at = now(), updated_at = now()
 WHERE id = %(run_id)s AND status = 'running' AND current_phase >= jsonb_array_length(plan)
RETURNING *;

-- name: request_stop --
UPDATE migrations SET cancel_requested = true, status = 'stopping', updated_at = now()
 WHERE id = %(run_id)s AND status = 'running'
RETURNING *;

-- name: cancel_pending_tasks --
-- Only a stop cancels: a no-op unless the run's stop flag is set (a stop of a run that already
-- failed or finished must not turn its pending work into cancelled work).
UPDATE migration_tasks SET status = 'cancelled', enqueued_at = NULL, updated_at = now()
 WHERE migration_id = %(run_id)s AND status = 'pending'
   AND EXISTS (SELECT 1 FROM migrations m WHERE m.id = %(run_id)s AND m.cancel_requested);

-- name: lock_stopping_run --
-- Taken first by a transaction that ends a task (`Worker`: cancel, release, finish) and settles a
-- stop in the same commit: on a stopping run's row, such transactions take turns, so the last one
-- sees every other task let go; without it two committing at once each saw the other's task still
-- running and left the run `stopping` with nothing running. No lock while the run is running.
SELECT id FROM migrations WHERE id = %(run_id)s AND status = 'stopping' FOR UPDATE;

-- name: settle_stop --
-- A stopping run becomes stopped once nothing of it runs.
UPDATE migrations SET status = 'stopped', finished_at = now(), updated_at = now()
 WHERE id = %(run_id)s AND status = 'stopping'
   AND NOT EXISTS (SELECT 1 FROM migration_tasks WHERE migration_id = %(run_id)s AND status = 'running')
RETURNING *;

-- name: reopen_run --
-- Retry/resume: back to live; the partial unique index re-checks admission. The span since it
-- ended (`finished_at`) was not running: counted apart, out of its elapsed time (migration 0023).
UPDATE migrations
   SET status = 'running', cancel_requested = false, finished_at = NULL,
       stopped_seconds = stopped_seconds + GREATEST(0, extract(epoch FROM now() - COALESCE(finished_at, now()))),
       heartbeat_at = now(), updated_at = now()
 WHERE id = %(run_id)s AND status IN ('stopped', 'failed', 'succeeded')
RETURNING *;

-- name: rearm_tasks --
-- Returns each re-armed task's phase, kind and the status it had.
WITH old AS (
    SELECT id, status FROM migration_tasks
     WHERE migration_id = %(run_id)s AND status = ANY(%(statuses)s::text[])
       FOR UPDATE
)
UPDATE migration_tasks t
   SET status = 'pending', attempts = 0, enqueued_at = NULL, not_before = NULL,
       locked_at = NULL, locked_by = NULL, finished_at = NULL, updated_at = now()
  FROM old
 WHERE t.id = old.id
RETURNING t.phase, t.kind, old.status;

-- name: rewind_barrier --
-- Retry's fix for work stranded behind the barrier: go back to the earliest re-armed phase.
UPDATE migrations SET current_phase = LEAST(current_phase, %(phase)s), updated_at = now()
 WHERE id = %(run_id)s
RETURNING *;

-- name: log_append --
-- One statement per task: append the task's grouped entries and keep the newest `cap`.
UPDATE migrations
   SET log = (SELECT COALESCE(jsonb_agg(e ORDER BY ord), '[]'::jsonb)
                FROM (SELECT e, ord
                        FROM jsonb_array_elements(log || %(entries)s::jsonb) WITH ORDINALITY AS x(e, ord)
                       ORDER BY ord DESC LIMIT %(cap)s) newest)
 WHERE id = %(run_id)s;

-- name: claim_record --
-- The ledger's contract: created/matched rows are exclusive (no row returned: roll back the
-- write, it is already here); skipped/failed rows are placeholders a real write takes over.
-- `dangling` (migration 0008): references to parents that do not exist at the source, or NULL.
-- `source_version` (migration 0010): the version written. Ends with `claim_takes_over` (ledger.py
-- appends it and RETURNING id).
INSERT INTO migration_records
       (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action, reason, dangling,
        source_version)
VALUES (%(run_id)s, %(tenant_id)s, %(source)s, %(kind)s, %(source_id)s, %(record_type)s,
        %(record_id)s, %(action)s, %(reason)s, %(dangling)s, %(source_version)s)

-- name: claim_records --
-- `claim_record` for a window's rows in one statement (issue 11, optimistic windows): the same
-- contract row by row - created/matched rows are exclusive (a source id left out of the answer is
-- already here), skipped/failed placeholders are taken over. The caller passes each source id
-- once, sorted (two writers of one page wait on each other in the same order). `claims` is one
-- JSON array of objects, a key left out for NULL (one text to send: psycopg dumps a list as an
-- array value by value in Python: a twelfth of the engine's GIL time on the entity
-- path). A NULL record id is the id of the row's new product row, read from the CTE
-- `new(new_id, source_id)` the caller puts before it (ledger.claim_window: the product rows are
-- inserted by the same statement, for the claims that win). Ends with `claim_takes_over`.
-- jsonb, not json: json_to_recordset parses each claim's `dangling` text a second time into its
-- jsonb column (500 deal claims: 11-16 ms, 5-10 ms read as jsonb); a value either refuses (a NUL)
-- fails both ways.
INSERT INTO migration_records
       (migration_id, tenant_id, source, kind, source_id, record_type, record_id, action, reason, dangling,
        source_version)
SELECT %(run_id)s, %(tenant_id)s, %(source)s, %(kind)s, u.source_id, u.record_type,
       COALESCE(u.record_id, n.new_id), u.action, u.reason, u.dangling, u.source_version
  FROM jsonb_to_recordset(%(claims)s::jsonb)
       AS u(source_id text, record_type text, record_id bigint, action text, reason text, dangling jsonb,
            source_version text)
  LEFT JOIN new n ON n.source_id = u.source_id
 ORDER BY u.source_id

-- name: claim_takes_over --
-- The conflict clause of every claim (`claim_record`, `claim_records`, a window's claimed insert):
-- a written (created/matched) entry is exclusive - the claim returns nothing for it - and a
-- skipped/failed placeholder is taken over; a placeholder taken over is here again, so its
-- deleted_at_source clears.
ON CONFLICT ON CONSTRAINT migration_records_once DO UPDATE
   SET migration_id = EXCLUDED.migration_id, record_type = EXCLUDED.record_type,
       record_id = EXCLUDED.record_id, action = EXCLUDED.action, reason = EXCLUDED.reason,
       dangling = EXCLUDED.dangling, source_version = EXCLUDED.source_version, parents = NULL,
       deleted_at_source = NULL, created_at = now()
 WHERE migration_records.action IN ('skipped', 'failed')

-- name: note_placeholder --
-- A skip or a failure claims nothing: it only fills an empty slot or refreshes another placeholder.
-- `source_version`: the version of the row as listed when skipped (NULL for a failure), which a
-- catch-up compares with the version it lists (the row's references are the ones seen then).
INSERT INTO migration_records
       (migration_id, tenant_id, source, kind, source_id, action, reason, source_version, parents)
VALUES (%(run_id)s, %(tenant_id)s, %(source)s, %(kind)s, %(source_id)s, %(action)s, %(reason)s, %(version)s,
        %(parents)s::jsonb)
ON CONFLICT ON CONSTRAINT migration_records_once DO UPDATE
   SET migration_id = EXCLUDED.migration_id, action = EXCLUDED.action, reason = EXCLUDED.reason,
       source_version = EXCLUDED.source_version, parents = EXCLUDED.parents, deleted_at_source = NULL,
       created_at = now()
 WHERE migration_records.action IN ('skipped', 'failed')
RETURNING id;

-- name: note_unreadable --
-- A failed row without a readable id (migration 0013): once per tenant, source, kind and raw key;
-- meeting it again (a retry, a later run) takes the record over.
INSERT INTO migration_unreadable (migration_id, tenant_id, source, kind, raw_key, reason, excerpt)
VALUES (%(run_id)s, %(tenant_id)s, %(source)s, %(kind)s, %(raw_key)s, %(reason)s, %(excerpt)s)
ON CONFLICT ON CONSTRAINT migration_unreadable_once DO UPDATE
   SET migration_id = EXCLUDED.migration_id, reason = EXCLUDED.reason, excerpt = EXCLUDED.excerpt,
       created_at = now();

-- name: note_placeholders --
-- `note_placeholder` for a window's skipped rows in one statement (issue 11): each fills an empty
-- slot or refreshes another placeholder; a written (created/matched) entry is left as it is and
-- its source id is not returned (the row is already here). Source ids once each, sorted.
INSERT INTO migration_records
       (migration_id, tenant_id, source, kind, source_id, action, reason, source_version, parents)
SELECT %(run_id)s, %(tenant_id)s, %(source)s, %(kind)s, u.source_id, %(action)s, u.reason, u.version,
       u.parents::jsonb
  FROM unnest(%(source_ids)s::text[], %(reasons)s::text[], %(versions)s::text[], %(parents)s::text[])
       AS u(source_id, reason, version, parents)
 ORDER BY u.source_id
ON CONFLICT ON CONSTRAINT migration_records_once DO UPDATE
   SET migration_id = EXCLUDED.migration_id, action = EXCLUDED.action, reason = EXCLUDED.reason,
       source_version = EXCLUDED.source_version, parents = EXCLUDED.parents, deleted_at_source = NULL,
       created_at = now()
 WHERE migration_records.action IN ('skipped', 'failed')
RETURNING source_id;

-- name: resolve_references --
-- One query per page: source ids -> local ids, only through rows actually written.
SELECT r.kind, r.source_id, r.record_id
  FROM migration_records r
  JOIN unnest(%(kinds)s::text[], %(source_ids)s::text[]) AS want(kind, source_id)
    ON r.kind = want.kind AND r.source_id = want.source_id
 WHERE r.tenant_id = %(tenant_id)s AND r.source = %(source)s AND r.action IN ('created', 'matched');

-- name: reference_entries --
-- A page's references in one query: every entry of these pairs, whatever its action (a written
-- one resolves; any other is known to the ledger, a placeholder or a failure: not asked of the
-- source). `waits`: a placeholder left to the catch-up's walk (its reason says `rows.WAITS_FOR_WALK`).
SELECT r.kind, r.source_id, r.action, r.record_id,
       (r.action = 'skipped' AND position(%(waiting)s IN COALESCE(r.reason, '')) > 0) AS waits
  FROM migration_records r
  JOIN unnest(%(kinds)s::text[], %(source_ids)s::text[]) AS want(kind, source_id)
    ON r.kind = want.kind AND r.source_id = want.source_id
 WHERE r.tenant_id = %(tenant_id)s AND r.source = %(source)s;

-- name: ledger_kinds_held --
-- Which of these ledger kinds the tenant's ledger holds an entry of: kinds an earlier run took
-- (one probe of the `migration_records_once` index per kind, however many rows each holds).
SELECT k.kind
  FROM unnest(%(kinds)s::text[]) AS k(kind)
 WHERE EXISTS (SELECT 1 FROM migration_records r
                WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = k.kind);

-- name: written_record --
SELECT record_id FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND source_id = %(source_id)s AND action IN ('created', 'matched');

-- name: dangling_counts --
-- Rows a run imported with references to parents deleted at the source, per kind (the rollup's);
-- a link owed to a kind the run left out (`owed_links`, migration 0020) is not such a reference.
SELECT kind, count(*) AS n FROM migration_records
 WHERE migration_id = %(run_id)s AND dangling IS NOT NULL AND action IN ('created', 'matched')
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(dangling) d WHERE NOT d ? 'owed')
 GROUP BY kind ORDER BY kind;

-- name: explain_record --
SELECT r.*, m.status AS run_status, m.mode AS run_mode
  FROM migration_records r JOIN migrations m ON m.id = r.migration_id
 WHERE r.tenant_id = %(tenant_id)s AND r.kind = %(kind)s AND r.source_id = %(source_id)s
   AND (%(source)s::text IS NULL OR r.source = %(source)s);

-- name: active_queries --
SELECT count(*) AS n FROM pg_stat_activity
 WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid();

-- name: rollup_tasks --
SELECT phase, kind, status, count(*) AS n,
       COALESCE(sum((stats->>'imported')::bigint), 0) AS imported,
       COALESCE(sum((stats->>'matched')::bigint), 0) AS matched,
       COALESCE(sum((stats->>'already_here')::bigint), 0) AS already_here,
       COALESCE(sum((stats->>'updated')::bigint), 0) AS updated,
       COALESCE(sum((stats->>'skipped')::bigint), 0) AS skipped,
       COALESCE(sum((stats->>'waiting')::bigint), 0) AS waiting,
       COALESCE(sum((stats->>'failed')::bigint), 0) AS failed,
       COALESCE(sum((stats->>'seen')::bigint), 0) AS seen,
       -- records kept apart (`marks.KEPT_APART`), counted in seen and failed above too
       COALESCE(sum((stats->>'kept_apart')::bigint), 0) AS kept_apart,
       max((stats->>'source_total')::bigint) AS source_total,
       -- tasks a discovery not yet run expects to seed beyond those that exist (its predecessor's
       -- estimate in its cursor); the progress counts it only for tasks not finished
       COALESCE(sum((cursor->>'expected_tasks')::bigint), 0) AS tasks_expected,
       min(started_at) AS first_started, max(finished_at) AS last_finished
  FROM migration_tasks WHERE migration_id = %(run_id)s
 GROUP BY phase, kind, status ORDER BY phase, kind, status;

-- name: rollup_left_to_catchup --
-- Per task kind, the records of a parent kind whose child rows its tasks left to the catch-up
-- unlisted: the "left_to_catchup:<parent>" task stats (`rows.LEFT_TO_CATCHUP`), summed.
SELECT t.kind, min(t.phase) AS phase, substr(e.key, length('left_to_catchup:') + 1) AS parent,
       sum(e.value::bigint) AS n
  FROM migration_tasks t CROSS JOIN LATERAL jsonb_each_text(t.stats) e
 WHERE t.migration_id = %(run_id)s AND e.key LIKE 'left\_to\_catchup:%%' AND e.value ~ '^[0-9]+$'
 GROUP BY t.kind, parent ORDER BY t.kind, parent;

-- name: kind_count --
-- One kind's count as this run knows it: the source's own (its discovery's) and the rows its tasks saw.
SELECT max((stats->>'source_total')::bigint) AS source_total,
       COALESCE(sum((stats->>'seen')::bigint), 0) AS seen
  FROM migration_tasks WHERE migration_id = %(run_id)s AND kind = %(kind)s;

-- name: failed_task_reasons --
SELECT kind, COALESCE(error, 'unknown') AS reason, count(*) AS n
  FROM migration_tasks WHERE migration_id = %(run_id)s AND status = 'failed'
 GROUP BY kind, error ORDER BY n DESC;

-- name: duration_by_payload --
-- The seed's first question: does task time move with the task's own payload? Buckets follow the
-- payload's distribution in powers of two (0, 1, 2-3, 4-7, ... 512-1023): a kind whose tasks carry
-- 0 to 5,000 rows spreads over a dozen buckets instead of "0" and "3+". The bucket of v >= 1 is
-- its bit length b: [2^(b-1), 2^b - 1], computed on integers (no floating log).
WITH t AS (
    SELECT GREATEST(COALESCE((stats->>%(stat)s)::bigint, 0), 0) AS v,
           extract(epoch FROM finished_at - started_at) AS secs
      FROM migration_tasks
     WHERE migration_id = %(run_id)s AND (%(kind)s::text IS NULL OR kind = %(kind)s)
       AND status = 'succeeded'
), b AS (
    SELECT v, secs, length(ltrim(v::bit(63)::text, '0')) AS bits FROM t
)
SELECT CASE WHEN bits = 0 THEN '0'
            WHEN bits = 1 THEN '1'
            ELSE (1::bigint << (bits - 1))::text || '-' || ((1::bigint << bits) - 1)::text END AS payload,
       count(*)                                         AS tasks,
       round(avg(secs)::numeric, 2)                     AS avg_seconds,
       round(max(secs)::numeric, 2)                     AS max_seconds
  FROM b
 GROUP BY bits ORDER BY bits;

-- name: stale_running_tasks --
-- Reaper sweep 1: a running task whose lock is older than the threshold lost its worker.
-- A task of a run being stopped is cancelled instead, so the stop can settle.
UPDATE migration_tasks t
   SET status = CASE WHEN m.cancel_requested THEN 'cancelled' ELSE 'pending' END,
       locked_at = NULL, locked_by = NULL,
       error = 'released: worker lock older than ' || %(threshold)s::text || 's', updated_at = now()
  FROM migrations m
 WHERE m.id = t.migration_id AND t.status = 'running'
   AND t.locked_at < now() - make_interval(secs => %(threshold)s)
RETURNING t.id, t.migration_id;

-- name: rearm_orphaned_cancelled --
-- Reaper sweep: a task is cancelled only by a stop of its run, so a cancelled task in a running
-- run nobody stopped (left by older code, or any other path) goes back to pending with its cursor
-- and offset, instead of holding the barrier for ever. FOR SHARE on the run serialises this with a
-- concurrent stop (which then cancels it again).
UPDATE migration_tasks t
   SET status = 'pending', enqueued_at = NULL, not_before = NULL, locked_at = NULL, locked_by = NULL,
       finished_at = NULL, error = 'cancelled while its run was not stopping: re-armed', updated_at = now()
 WHERE t.status = 'cancelled'
   AND t.migration_id IN (SELECT m.id FROM migrations m
                           WHERE m.status = 'running' AND NOT m.cancel_requested
                             FOR SHARE)
RETURNING t.id, t.migration_id;

-- name: phase_failed_tasks --
-- Why a phase failed the run, grouped by kind for the run log.
SELECT kind, count(*) AS n, min(id) AS first_task, min(COALESCE(error, 'unknown')) AS reason
  FROM migration_tasks
 WHERE migration_id = %(run_id)s AND phase = %(phase)s AND status = 'failed'
 GROUP BY kind ORDER BY kind;

-- name: live_runs --
SELECT * FROM migrations WHERE status IN ('running', 'stopping') ORDER BY id;

-- name: runs_needing_finalize --
-- Reaper sweep 4: heartbeat stopped, nothing left running, no terminal status.
SELECT m.* FROM migrations m
 WHERE m.status IN ('running', 'stopping')
   AND m.heartbeat_at < now() - make_interval(secs => %(threshold)s)
   AND NOT EXISTS (SELECT 1 FROM migration_tasks t WHERE t.migration_id = m.id
                    AND t.status IN ('pending', 'running'))
 ORDER BY m.id;

-- name: unqueue_later_phases --
-- After a rewind, tasks of later phases leave the lane until the barrier reaches them again.
UPDATE migration_tasks SET enqueued_at = NULL
 WHERE migration_id = %(run_id)s AND status = 'pending' AND phase > %(phase)s AND enqueued_at IS NOT NULL;

-- name: claimed_by_run --
SELECT source_id, migration_id FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND source_id = ANY(%(source_ids)s::text[]) AND action IN ('created', 'matched');

-- name: dry_record --
INSERT INTO migration_dry_records (migration_id, kind, source_id, outcome)
VALUES (%(run_id)s, %(kind)s, %(source_id)s, %(outcome)s)
ON CONFLICT DO NOTHING;

-- name: placeholder_reason --
-- A run's skipped placeholder of one row, read back before a dry run's savepoint rolls it away.
SELECT reason FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s AND source_id = %(source_id)s
   AND migration_id = %(run_id)s AND action = 'skipped';

-- name: dry_written --
-- A dry run's would-be writes, for its own later phases (one query per page, like the ledger's).
SELECT d.kind, d.source_id
  FROM migration_dry_records d
  JOIN unnest(%(kinds)s::text[], %(source_ids)s::text[]) AS want(kind, source_id)
    ON d.kind = want.kind AND d.source_id = want.source_id
 WHERE d.migration_id = %(run_id)s;

-- name: revisit_tasks --
-- Retry's second half: later-phase tasks that skipped rows or left them waiting for the catch-up
-- (their parents may have been on the
-- failed pages) run again from the top with fresh counts; rows this run already wrote are
-- recognised through the ledger and not written again.
UPDATE migration_tasks
   SET status = 'pending', processed_offset = 0, stats = '{"revisit": 1}'::jsonb, attempts = 0,
       enqueued_at = NULL, not_before = NULL, error = NULL, finished_at = NULL, updated_at = now()
 WHERE migration_id = %(run_id)s AND status = 'succeeded' AND phase > %(phase)s
   AND kind = ANY(%(kinds)s::text[])
   AND COALESCE((stats->>'skipped')::int, 0) + COALESCE((stats->>'waiting')::int, 0) > 0
RETURNING id;

-- name: written_by_run --
SELECT source_id, action FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s AND migration_id = %(run_id)s
   AND source_id = ANY(%(source_ids)s::text[]) AND action IN ('created', 'matched');

-- name: table_growth --
-- Statistics of its own (engine_core/statistics.py): rows changed since each grown table's last
-- analyze against its row estimate; tables that do not exist are left out (to_regclass is NULL).
SELECT s.schemaname, s.relname, c.reltuples, s.n_mod_since_analyze, s.analyze_count + s.autoanalyze_count AS analyze_count
  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
 WHERE s.relid IN (SELECT to_regclass(t) FROM unnest(%(tables)s::text[]) AS t);

-- name: try_analyze_lock --
-- Fences ANALYZE: one worker at a time per table; released when the analyzing transaction ends.
SELECT pg_try_advisory_xact_lock(%(lock)s, hashtext(%(table)s)) AS locked;

-- name: ledger_reasons --
-- Why rows were skipped or failed, from the ledger (the truth, not the run log's sample): grouped by
-- kind, action and reason with numbers of 3+ digits folded (as runlog.group_key does), with up to
-- five sample source ids. Rows a later write took over are no longer skipped/failed, so a reason
-- whose rows were imported after a retry disappears by itself. `reason` is the first sample's, so
-- the example said beside the ids is one of theirs.
SELECT kind, action, (array_agg(reason ORDER BY length(source_id), source_id))[1] AS reason, count(*) AS n,
       (array_agg(source_id ORDER BY length(source_id), source_id))[1:5] AS samples
  FROM migration_records
 WHERE migration_id = %(run_id)s AND action IN ('skipped', 'failed')
 GROUP BY kind, action, regexp_replace(COALESCE(reason, 'unknown'), '[0-9]{3,}', 'N', 'g')
 ORDER BY n DESC, kind;

-- name: unreadable_reasons --
-- `ledger_reasons` for the run's rows without a readable id (migration 0013): failed, grouped the
-- same way, their raw keys as samples, `reason` the first sample's.
SELECT kind, 'failed' AS action, (array_agg(reason ORDER BY length(raw_key), raw_key))[1] AS reason, count(*) AS n,
       (array_agg(raw_key ORDER BY length(raw_key), raw_key))[1:5] AS samples
  FROM migration_unreadable
 WHERE migration_id = %(run_id)s
 GROUP BY kind, regexp_replace(reason, '[0-9]{3,}', 'N', 'g')
 ORDER BY n DESC, kind;

-- name: explain_unreadable --
-- Rows without a readable id by their raw key (`rows.unreadable_key`), whole or its id part alone
-- ("abc" finds "abc sha256:..."), with their runs, the latest first.
SELECT u.*, m.status AS run_status, m.dry_run AS run_dry_run
  FROM migration_unreadable u JOIN migrations m ON m.id = u.migration_id
 WHERE u.tenant_id = %(tenant_id)s AND u.kind = %(kind)s
   AND (u.raw_key = %(raw_key)s OR left(u.raw_key, length(%(raw_key)s) + 8) = %(raw_key)s || ' sha256:')
   AND (%(source)s::text IS NULL OR u.source = %(source)s)
 ORDER BY u.created_at DESC, u.id DESC;

-- name: ledger_written_by_kind --
-- Completeness: the rows a run claimed (created or matched), per ledger kind. Claims are never
-- taken over by a later run, so these stay the run's own.
SELECT kind, count(*) FILTER (WHERE action = 'created') AS created,
       count(*) FILTER (WHERE action = 'matched') AS matched
  FROM migration_records
 WHERE migration_id = %(run_id)s AND action IN ('created', 'matched')
 GROUP BY kind ORDER BY kind;

-- name: phase_rows_with_reasons --
-- A phase's skipped and failed rows with their reasons, capped (the phase metadata's table).
-- Rows without a readable id (migration 0013) are among the failed, under their raw key.
SELECT kind, source_id, action, reason, created_at FROM (
    SELECT kind, source_id, action, reason, created_at
      FROM migration_records
     WHERE migration_id = %(run_id)s AND kind = ANY(%(kinds)s::text[]) AND action IN ('skipped', 'failed')
    UNION ALL
    SELECT kind, raw_key, 'failed', reason, created_at
      FROM migration_unreadable
     WHERE migration_id = %(run_id)s AND kind = ANY(%(kinds)s::text[])
) AS r
 ORDER BY action, kind, length(source_id), source_id  -- failed before skipped: the cap keeps the failed
 LIMIT %(limit)s;

-- name: explain_history --
-- What later runs did to one ledger entry's row, oldest first (migration 0010's history: updated
-- in place, marked deleted at the source, restored), with the run's mode (a sync or a full run).
SELECT h.migration_id AS run_id, m.mode AS run_mode, h.action, h.at, h.version_before, h.version_after, h.before
  FROM migration_record_history h JOIN migrations m ON m.id = h.migration_id
 WHERE h.record_id = %(record_id)s
 ORDER BY h.id;

-- name: explain_story --
-- Every ledger entry of one source row (every source it came from), with its run.
SELECT r.*, m.status AS run_status, m.dry_run AS run_dry_run
  FROM migration_records r JOIN migrations m ON m.id = r.migration_id
 WHERE r.tenant_id = %(tenant_id)s AND r.kind = %(kind)s AND r.source_id = %(source_id)s
 ORDER BY r.source;

-- === versions, updates in place, soft deletes (issue 9, migration 0010; engine_core/ledger.py) ===

-- name: ledger_entry_for_update --
-- The version fence: a sighting of a written row locks its entry before it compares versions, so
-- of two workers writing the same changed row at once the second waits and then finds the new
-- version already here (one update, one history row).
SELECT id, migration_id, action, record_type, record_id, source_version, deleted_at_source, dangling, reason
  FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s AND source_id = %(source_id)s
   FOR UPDATE;

-- name: ledger_entry_written --
-- After an update in place (or a restore): the entry holds the version now in the product row,
-- is no longer deleted at the source, and keeps the new version's dangling references. Its
-- migration_id stays the run that claimed it; the change is in migration_record_history.
UPDATE migration_records
   SET source_version = %(source_version)s, deleted_at_source = NULL,
       dangling = %(dangling)s, reason = %(reason)s
 WHERE id = %(id)s;

-- name: ledger_history --
INSERT INTO migration_record_history (record_id, migration_id, action, version_before, version_after, before)
VALUES (%(record_id)s, %(run_id)s, %(action)s, %(version_before)s, %(version_after)s, %(before)s);

-- name: ledger_mark_deleted --
-- Soft delete, once: only entries not already marked change (so a second detection of the same
-- deletion adds nothing), each with a `deleted` history row; returns what the product rows are.
-- A placeholder left to the catch-up's walk (its reason says `rows.WAITS_FOR_WALK`) says it was
-- deleted before that walk took it over (`rows.GONE_BEFORE_WALK`): nothing waits for it now.
WITH marked AS (
    UPDATE migration_records
       SET deleted_at_source = COALESCE(%(at)s::timestamptz, now()),
           reason = CASE WHEN action = 'skipped' AND position(%(waiting)s IN reason) > 0
                         THEN %(gone)s ELSE reason END
     WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
       AND source_id = ANY(%(source_ids)s::text[]) AND deleted_at_source IS NULL
    RETURNING id, action, record_type, record_id, source_version, deleted_at_source
), noted AS (
    INSERT INTO migration_record_history (record_id, migration_id, action, version_before, version_after)
    SELECT id, %(run_id)s, 'deleted', source_version, source_version FROM marked
)
SELECT id, action, record_type, record_id, deleted_at_source FROM marked;

-- name: ledger_would_delete --
-- A dry run's mark_deleted: how many entries it would mark, nothing written.
SELECT count(*) AS n FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND source_id = ANY(%(source_ids)s::text[]) AND deleted_at_source IS NULL;

-- name: ledger_versions --
-- Where each of these source ids stands in the ledger, whatever its action, and for which run.
SELECT source_id, source_version, action, deleted_at_source, migration_id FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND source_id = ANY(%(source_ids)s::text[]);

-- name: ledger_index --
-- Every entry of one ledger kind with its version and soft-delete mark (a catch-up's or verify's
-- comparison with the source's id listing); placeholders only when asked for.
SELECT source_id, source_version, deleted_at_source FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND (%(placeholders)s OR action IN ('created', 'matched'));

-- name: updated_by_run --
-- A retried task's rows that its run already changed in place (`ledger.updated_by_run`).
SELECT DISTINCT r.source_id
  FROM migration_records r JOIN migration_record_history h ON h.record_id = r.id
 WHERE r.tenant_id = %(tenant_id)s AND r.source = %(source)s AND r.kind = %(kind)s
   AND r.source_id = ANY(%(source_ids)s::text[])
   AND h.migration_id = %(run_id)s AND h.action IN ('updated', 'restored');

-- name: history_counts --
-- What a run changed, per ledger kind and change (updated, deleted, restored): the rollup's
-- "updated" is checked against these, "deleted at source" and "restored" are these.
SELECT r.kind, h.action, count(*) AS n
  FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id
 WHERE h.migration_id = %(run_id)s
 GROUP BY r.kind, h.action ORDER BY r.kind, h.action;

-- name: verify_ledger --
-- Every entry of one ledger kind, placeholders included, with where the product holds it
-- (`verify`: the proof from the source compares these with the source's ids and the product's rows).
SELECT source_id, action, reason, record_type, record_id, source_version AS version, deleted_at_source AS deleted
  FROM migration_records
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s;

-- name: verify_unreadable --
-- One ledger kind's rows kept without a readable id (migration 0013), one per row, by their raw
-- key ("abc sha256:...", "sha256:..." for a row served without an id): what the proof's listing
-- serves such a row under (`mapping.unreadable_key`), so each is matched to its own record.
SELECT raw_key AS source_id
  FROM migration_unreadable
 WHERE tenant_id = %(tenant_id)s AND source = %(source)s AND kind IN (%(kind)s, %(kind)s || '_archived');

-- name: latest_status_per_tenant --
-- Each of these tenants' latest (not dry) run of a source and its status (the sync schedule asks
-- for the tenants whose latest run succeeded).
SELECT DISTINCT ON (tenant_id) tenant_id, status FROM migrations
 WHERE source = %(source)s AND tenant_id = ANY(%(tenants)s::text[]) AND NOT dry_run
 ORDER BY tenant_id, id DESC;

-- name: run_cost --
-- What a run spent at the source: the requests and tokens its tasks counted in their stats
-- (`migrate run` / `migrate sync` print it beside the result; a sync's cost against a full run's).
SELECT COALESCE(sum((stats->>'requests')::bigint), 0) AS requests,
       COALESCE(sum((stats->>'tokens')::bigint), 0) AS tokens
  FROM migration_tasks WHERE migration_id = %(run_id)s;

-- name: catchup_unseen_skipped --
-- A ledger kind's skipped rows the catch-up's listing did not serve (a sync listing only changes).
-- A set difference, as `catchup_unseen_live`.
SELECT source_id FROM (
       SELECT r.source_id FROM migration_records r
        WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = %(k)s AND r.action = 'skipped'
       EXCEPT
       SELECT i.source_id FROM migration_inventory i WHERE i.migration_id = %(r)s AND i.kind = %(k)s) unseen
 ORDER BY source_id;

-- name: catchup_unseen_live --
-- A ledger kind's entries not marked deleted that the catch-up's inventory did not see: written
-- rows, and skipped or failed ones too (a row the source deleted is marked whatever its outcome).
-- A set difference, each side read once (a source id is once per kind in the ledger and in the
-- inventory). Not NOT EXISTS: with the inventory not yet analyzed in a run, Postgres may plan that
-- as a nested loop comparing each entry with every inventory row of its kind (135-220 ms for a kind
-- of 900-1,500 rows, in 4 runs of 7 on the small account; 1-4 ms as a set difference).
SELECT source_id FROM (
       SELECT r.source_id FROM migration_records r
        WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = %(k)s
          AND r.action IN ('created', 'matched', 'skipped', 'failed')
          AND r.deleted_at_source IS NULL
       EXCEPT
       SELECT i.source_id FROM migration_inventory i WHERE i.migration_id = %(r)s AND i.kind = %(k)s) unseen
 ORDER BY source_id;

-- name: inventory_remember_and_compare --
-- Record a page's ids as seen by this run's inventory and read their ledger entries, in one
-- statement: one round trip a page; both happen or neither.
WITH seen AS (INSERT INTO migration_inventory (migration_id, kind, source_id)
              SELECT %(r)s, %(k)s, unnest(%(ids)s::text[]) ON CONFLICT DO NOTHING)
SELECT source_id, action, source_version, deleted_at_source FROM migration_records
 WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND source_id = ANY(%(ids)s::text[]);

-- name: inventory_seen --
-- Which of these (ledger kind, source id) pairs this run's inventory holds: served by its catch-up's
-- listing (`inventory_ledger.unlisted`: a parent the whole walk did not serve is gone) - or, as
-- far as anyone can tell, may have been: a row of the kind without a readable id the run recorded
-- (migration_unreadable) may be any of them. `served`: the inventory holds the pair itself.
SELECT want.kind, want.source_id, served
  FROM unnest(%(kinds)s::text[], %(source_ids)s::text[]) AS want(kind, source_id),
       LATERAL (SELECT EXISTS (SELECT 1 FROM migration_inventory i
                                WHERE i.migration_id = %(r)s AND i.kind = want.kind
                                  AND i.source_id = want.source_id) AS served) s
 WHERE served
    OR EXISTS (SELECT 1 FROM migration_unreadable u WHERE u.migration_id = %(r)s AND u.kind = want.kind);

-- name: ledger_waiting_counts --
-- A run's placeholders still waiting for its catch-up's walk, per ledger kind (the rollup's run-end check).
SELECT kind, count(*) AS n FROM migration_records
 WHERE migration_id = %(run_id)s AND action = 'skipped' AND deleted_at_source IS NULL
   AND position(%(waiting)s IN reason) > 0
 GROUP BY kind ORDER BY kind;

-- name: run_source_retries --
-- A run's tasks released after a failure of the source and not finished (`source_retries`): how many,
-- since when, the latest error, the soonest retry, and the run's last task that succeeded (none
-- since the first of them: every task that asked the source failed). `not_source`: errors that are
-- not the source's (LIKE patterns). `first_started`: when the first of them first started (a retry's
-- release moves `updated_at`, not `started_at`).
SELECT count(*) AS tasks, min(t.updated_at) AS since, min(t.started_at) AS first_started,
       (array_agg(t.error ORDER BY t.updated_at DESC))[1] AS last_error,
       min(t.not_before) FILTER (WHERE t.status = 'pending') AS next_try,
       (SELECT max(o.finished_at) FROM migration_tasks o
         WHERE o.migration_id = %(run_id)s AND o.status = 'succeeded') AS last_success
  FROM migration_tasks t
 WHERE t.migration_id = %(run_id)s AND t.status IN ('pending', 'running') AND t.error IS NOT NULL
   AND NOT t.error LIKE ANY(%(not_source)s::text[]);

-- name: placeholders_of_run --
-- A window's rows the run holds as placeholders (skipped or failed) before the window writes them:
-- by source id, and those without a readable id by raw key (migration 0013); only this run's, so a
-- row another run left is none of the run's own counts.
SELECT source_id AS key, action, reason FROM migration_records
 WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND source_id = ANY(%(ids)s::text[])
   AND migration_id = %(r)s AND action IN ('skipped', 'failed')
UNION ALL
SELECT 'raw:' || raw_key, 'failed', reason FROM migration_unreadable
 WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND raw_key = ANY(%(raws)s::text[])
   AND migration_id = %(r)s;

-- name: ledger_waiting_at --
-- Which of these source ids of one ledger kind the ledger holds as skipped, waiting for the catch-up's
-- walk (their reason says so: `write.WAITS_FOR_WALK`), and at which version they were listed then.
SELECT source_id, source_version FROM migration_records
 WHERE tenant_id = %(t)s AND source = %(s)s AND kind = %(k)s AND source_id = ANY(%(ids)s::text[])
   AND action = 'skipped' AND source_version IS NOT NULL AND position(%(waiting)s IN reason) > 0;

-- name: inventory_forget_older --
-- The inventories of the tenant's finished runs (every run but this one that has ended): nothing reads them.
DELETE FROM migration_inventory i USING migrations m
 WHERE i.migration_id = m.id AND m.tenant_id = %(t)s AND m.source = %(s)s AND m.id <> %(r)s
   AND m.status IN ('succeeded', 'failed', 'stopped');

-- name: deals_mail_held --
-- Per deal (source id) the ledger holds, the mail messages the product holds under its record.
SELECT r.source_id, count(e.id) AS n FROM migration_records r
  LEFT JOIN crm.emails e ON e.deal_id = r.record_id AND e.tenant_id = r.tenant_id
 WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = 'deals'
   AND r.source_id = ANY(%(ids)s::text[])
 GROUP BY r.source_id;

-- name: takeable_placeholders --
-- Skipped placeholders of these kinds (not deleted at the source) that kept their parents
-- (migration 0019) and whose every parent has a written (created/matched) entry now: rows the
-- engine can still take. With `missing_of`: only those that missed a parent of that ledger kind;
-- with `id`: only the row of that source id.
SELECT r.kind, r.source_id, r.parents
  FROM migration_records r
 WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.kind = ANY(%(kinds)s::text[]) AND r.action = 'skipped'
   AND r.deleted_at_source IS NULL AND r.parents IS NOT NULL
   AND (%(id)s::text IS NULL OR r.source_id = %(id)s::text)
   AND (%(missing_of)s::text IS NULL OR EXISTS (
        SELECT 1 FROM jsonb_array_elements(r.parents) p
         WHERE (p->>'missing')::boolean AND p->'kinds' ? %(missing_of)s::text))
   AND NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(r.parents) p
         WHERE NOT EXISTS (
               SELECT 1 FROM migration_records w
                WHERE w.tenant_id = r.tenant_id AND w.source = r.source AND w.source_id = p->>'id'
                  AND w.kind IN (SELECT jsonb_array_elements_text(p->'kinds'))
                  AND w.action IN ('created', 'matched')))
 ORDER BY r.kind, r.source_id;

-- name: owed_links --
-- A tenant's written entries holding links owed to one of `kinds` (migration 0020; `owed_links.fill`),
-- `limit` of them after the id `after`.
-- The first predicate is the partial index's: a tenant that owes nothing costs one index probe.
SELECT id, action, record_type, record_id, dangling
  FROM migration_records
 WHERE dangling @> '[{"owed": true}]' AND tenant_id = %(tenant_id)s AND source = %(source)s
   AND action IN ('created', 'matched') AND record_id IS NOT NULL
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(dangling) d
                WHERE d @> '{"owed": true}' AND d->>'parent_kind' = ANY(%(kinds)s))
   AND id > %(after)s
 ORDER BY id LIMIT %(limit)s;

-- name: keep_owed --
-- The references still dangling or owed after a fill, and the reason they give (NULL: none left).
UPDATE migration_records r SET dangling = u.dangling, reason = u.reason
  FROM jsonb_to_recordset(%(rows)s) AS u(id bigint, dangling jsonb, reason text)
 WHERE r.id = u.id;

-- name: owed_of_kind --
-- One ledger kind's written entries that still owe a link (verify: not clean while links are owed).
SELECT source_id, d->>'parent_kind' AS parent_kind
  FROM migration_records, jsonb_array_elements(dangling) d
 WHERE dangling @> '[{"owed": true}]' AND tenant_id = %(tenant_id)s AND source = %(source)s AND kind = %(kind)s
   AND action IN ('created', 'matched') AND d @> '{"owed": true}';

-- name: skipped_naming --
-- A tenant's skipped rows (not found deleted at the source) whose reason holds any of these words:
-- the rows skipped for a parent served by a list their run did not take (`skip_reason.UNTAKEN`).
SELECT count(*) AS n
  FROM migration_records
 WHERE tenant_id = %(t)s AND source = %(s)s AND action = 'skipped' AND deleted_at_source IS NULL
   AND EXISTS (SELECT 1 FROM unnest(%(words)s::text[]) w WHERE position(w IN COALESCE(reason, '')) > 0);

-- name: skipped_for_parent --
-- A tenant's skipped rows that kept this parent as missing (migration 0019's `parents`), per kind.
SELECT r.kind, count(*) AS n
  FROM migration_records r
 WHERE r.tenant_id = %(t)s AND r.source = %(s)s AND r.action = 'skipped' AND r.deleted_at_source IS NULL
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(r.parents) p
                WHERE p->>'id' = %(id)s::text AND (p->>'missing')::boolean AND p->'kinds' ? %(k)s::text)
 GROUP BY r.kind ORDER BY r.kind;
