-- The application queues' statements, each named and called through sync.queues.store.
-- %(now)s is the caller's clock when it has one (tests drive it) and NULL for the database's
-- own time; every statement reads it through coalesce(%(now)s, now()) (a fenced one inside
-- job_fence_v1, the fence of an attempt's writes, written once in
-- 0001_baseline.sql).

-- name: get_queue
SELECT * FROM job_queues WHERE name = %(name)s;

-- name: list_queues
SELECT * FROM job_queues ORDER BY name;

-- name: lock_queue
-- A declaration or deletion holds the queue's row while it checks the queue's jobs, so two
-- operators changing one queue are serialized.
SELECT * FROM job_queues WHERE name = %(name)s FOR UPDATE;

-- name: count_pending
-- Jobs that still hold work for the queue's handler: its policy may change only at zero.
SELECT count(*) AS pending FROM jobs
 WHERE origin_queue = %(name)s AND status IN ('queued', 'retrying', 'active');

-- name: dead_letter_users
SELECT name FROM job_queues WHERE dead_letter = %(name)s ORDER BY name;

-- name: upsert_queue
-- Creates the queue or changes it to match the declaration. Invariant: the dead-letter queue
-- exists (the foreign key refuses it otherwise).
INSERT INTO job_queues (name, policy, retry_limit, retry_delay, retry_ceiling, expire,
                        dead_letter, retention, priority, priority_step, global_concurrency,
                        rate_limit, rate_period)
VALUES (%(name)s, %(policy)s, %(retry_limit)s, %(retry_delay)s, %(retry_ceiling)s, %(expire)s,
        %(dead_letter)s, %(retention)s, %(priority)s, %(priority_step)s,
        %(global_concurrency)s, %(rate_limit)s, %(rate_period)s)
ON CONFLICT (name) DO UPDATE
   SET policy = EXCLUDED.policy, retry_limit = EXCLUDED.retry_limit,
       retry_delay = EXCLUDED.retry_delay, retry_ceiling = EXCLUDED.retry_ceiling,
       expire = EXCLUDED.expire, dead_letter = EXCLUDED.dead_letter,
       retention = EXCLUDED.retention, priority = EXCLUDED.priority,
       priority_step = EXCLUDED.priority_step,
       global_concurrency = EXCLUDED.global_concurrency, rate_limit = EXCLUDED.rate_limit,
       rate_period = EXCLUDED.rate_period, updated_at = now()
RETURNING *;

-- name: delete_queue_jobs
-- Only called with the queue locked and no pending job of it left.
DELETE FROM jobs WHERE queue = %(name)s;

-- name: delete_queue
DELETE FROM job_queues WHERE name = %(name)s;

-- name: send_job
-- Invariants in send_job_v2 (0004): one pending job per singleton slot, one job per cron tick.
SELECT * FROM send_job_v2(%(queue)s, %(payload)s, %(key)s, %(now)s::timestamptz,
                          %(delay)s::double precision, %(at)s::timestamptz, NULL,
                          %(priority)s::smallint);

-- name: send_jobs
-- Many jobs for one queue in one statement, each through send_job_v2 in the order given, so
-- each sees the ones before it (on an exclusive queue, a payload after the first gets the
-- first one's job). The same invariants as send_job.
SELECT s.job_id, s.outcome
  FROM unnest(%(payloads)s::jsonb[]) WITH ORDINALITY AS p(payload, n)
 CROSS JOIN LATERAL send_job_v2(%(queue)s, p.payload, %(key)s, %(now)s::timestamptz,
                                %(delay)s::double precision, %(at)s::timestamptz, NULL,
                                %(priority)s::smallint) AS s
 ORDER BY p.n;

-- name: get_job
SELECT * FROM jobs WHERE id = %(job_id)s;

-- name: list_jobs
SELECT * FROM jobs
 WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: job_attempts
-- The attempts that ended, then the one running (read from the job's row), the first first.
SELECT job_id, attempt, queue, started_at, finished_at, outcome, error
  FROM (SELECT a.id AS seq, a.job_id, a.attempt, a.queue, a.started_at, a.finished_at,
               a.outcome, a.error
          FROM job_attempts a WHERE a.job_id = %(job_id)s
        UNION ALL
        SELECT NULL, j.id, j.attempts, j.queue, j.started_at, NULL, NULL, NULL
          FROM jobs j WHERE j.id = %(job_id)s AND j.status = 'active') attempts
 ORDER BY seq NULLS LAST;

-- name: claim_jobs
-- Invariants in claim_jobs_v5 (0005): one claim per job, a fencing token per attempt, an
-- expired attempt taken back by a claim, priorities, and a queue's fleet-wide limits. The
-- queue's retry terms come along, so the end of the attempt is decided with the declaration
-- it ran under. Only the columns a claimed job is made of: a batch handler's claim returns
-- a hundred rows, and each column is parsed in the worker.
SELECT c.id, c.queue, c.origin_queue, c.payload, c.key, c.status, c.attempts, c.run_after,
       c.created_at, c.started_at, c.finished_at, c.expires_at, c.error, c.tick,
       c.processed_units, c.total_units, c.priority, c.lease_owner,
       q.retry_limit, q.retry_delay, q.retry_ceiling, q.expire
  FROM claim_jobs_v5(%(queues)s::text[], %(limit)s, %(lease)s, %(now)s::timestamptz) c
  JOIN job_queues q ON q.name = c.origin_queue;

-- name: complete_attempt
-- The handler returned. Fenced by job_fence_v1 (0001_baseline.sql): applied
-- only while the job is active under this attempt's token and the attempt has not expired; a
-- stale attempt's end matches nothing.
WITH done AS (
    UPDATE jobs
       SET status = 'completed', finished_at = coalesce(%(now)s, now()), expires_at = NULL,
           deadline_at = NULL
     WHERE job_fence_v1(jobs, %(job_id)s, %(lease_owner)s, %(now)s)
    RETURNING id, attempts, queue, started_at, finished_at, lease_owner
)
INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome, lease_owner)
SELECT id, attempts, queue, started_at, finished_at, 'completed', lease_owner FROM done
RETURNING job_id;

-- name: complete_attempts
-- Many handlers returned: each job completed in one statement (a worker's lanes batch their
-- completions). Fenced per job like complete_attempt; the ids of the jobs it completed.
WITH ended (id, lease_owner) AS (
    SELECT * FROM unnest(%(job_ids)b::bigint[], %(lease_owners)b::uuid[])
), done AS (
    UPDATE jobs j
       SET status = 'completed', finished_at = coalesce(%(now)s, now()), expires_at = NULL,
           deadline_at = NULL
      FROM ended e
     WHERE job_fence_v1(j, e.id, e.lease_owner, %(now)s)
    RETURNING j.id, j.attempts, j.queue, j.started_at, j.finished_at, j.lease_owner
)
INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome, lease_owner)
SELECT id, attempts, queue, started_at, finished_at, 'completed', lease_owner FROM done
RETURNING job_id;

-- name: retry_attempt
-- The handler raised and the job has attempts left: retrying, due after the delay. Fenced
-- like complete_attempt.
WITH done AS (
    UPDATE jobs
       SET status = 'retrying', error = %(error)s, expires_at = NULL, deadline_at = NULL,
           run_after = coalesce(%(now)s, now()) + make_interval(secs => %(delay)s)
     WHERE job_fence_v1(jobs, %(job_id)s, %(lease_owner)s, %(now)s)
    RETURNING id, attempts, queue, started_at, lease_owner
)
INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome, error,
                          lease_owner)
SELECT id, attempts, queue, started_at, coalesce(%(now)s, now()), 'failed', %(error)s,
       lease_owner
  FROM done
RETURNING job_id;

-- name: bury_attempt
-- The handler raised and the job's attempts are spent: dead, in its dead-letter queue (or its
-- own). Fenced like complete_attempt; the dead job comes back for the on_dead hook, which is
-- called only when this matched, so once.
WITH done AS (
    UPDATE jobs j
       SET status = 'dead', error = %(error)s, expires_at = NULL, deadline_at = NULL,
           finished_at = coalesce(%(now)s, now()), queue = coalesce(q.dead_letter, q.name)
      FROM job_queues q
     WHERE q.name = j.origin_queue
       AND job_fence_v1(j, %(job_id)s, %(lease_owner)s, %(now)s)
    RETURNING j.*
), ended AS (
    INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome, error,
                              lease_owner)
    SELECT id, attempts, origin_queue, started_at, finished_at, 'failed', %(error)s,
           lease_owner
      FROM done
)
SELECT * FROM done;

-- name: hand_back_attempt
-- Graceful shutdown: an attempt stopped by it (or claimed and never started) goes back to its
-- queue, due now, without spending an attempt. Fenced like complete_attempt.
UPDATE jobs
   SET status = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'queued' END,
       attempts = attempts - 1, run_after = coalesce(%(now)s, now()), expires_at = NULL,
       deadline_at = NULL
 WHERE job_fence_v1(jobs, %(job_id)s, %(lease_owner)s, %(now)s)
RETURNING id, pg_notify(notify_channel(), 'job:' || origin_queue) AS woke;

-- name: report_progress
-- A handler's progress. Fenced like complete_attempt: a stale attempt reports nothing.
UPDATE jobs
   SET processed_units = %(processed)s, total_units = coalesce(%(total)s, total_units)
 WHERE job_fence_v1(jobs, %(job_id)s, %(lease_owner)s, %(now)s)
RETURNING id;

-- name: renew_job_lease
-- The lease keeper extends an attempt's lease, never past its deadline (the start plus the
-- queue's expire). Invariant: only the holder's token renews, and only while the lease is
-- still valid by the database's clock (job_fence_v1 at now()); nothing back means the lease is
-- lost (or the attempt reached its expiry).
UPDATE jobs
   SET expires_at = least(now() + %(lease)s, deadline_at)
 WHERE job_fence_v1(jobs, %(job_id)s, %(lease_owner)s, NULL) AND deadline_at > now()
RETURNING id;

-- name: read_job_control
-- The lease keeper's control read: cancelled while it ran (the token is still ours), still
-- ours and active, or lost.
SELECT status, lease_owner = %(lease_owner)s AS ours FROM jobs WHERE id = %(job_id)s;

-- name: renew_job_leases
-- renew_job_lease for many attempts in one statement (the keeper holds the leases of whole
-- batches and of many lanes at once), each with its own lease length. The same invariant, per
-- attempt: only the holder's token renews, only while its lease is valid by the database's
-- clock and before its deadline. The attempts renewed come back; one missing is lost.
UPDATE jobs j
   SET expires_at = least(now() + make_interval(secs => h.seconds), j.deadline_at)
  FROM unnest(%(job_ids)b::bigint[], %(lease_owners)b::uuid[], %(seconds)b::float8[])
       AS h(id, owner, seconds)
 WHERE job_fence_v1(j, h.id, h.owner, NULL) AND j.deadline_at > now()
RETURNING j.id, j.lease_owner;

-- name: read_job_controls
-- read_job_control for many attempts in one statement; an attempt whose job is gone comes
-- back with no status (lost).
SELECT h.id, h.owner, j.status, j.lease_owner = h.owner AS ours
  FROM unnest(%(job_ids)b::bigint[], %(lease_owners)b::uuid[]) AS h(id, owner)
  LEFT JOIN jobs j ON j.id = h.id;

-- name: cancel_job
-- Cancels a queued, retrying or active job at once; an active attempt is recorded as
-- cancelled, and its holder learns it from its control read (the token stays on the row, so
-- the holder can tell a cancel from a lost lease). The job's status before comes back too, so
-- a job that cannot be cancelled is named with it.
WITH old AS (
    SELECT id, status, attempts, queue, started_at, lease_owner
      FROM jobs WHERE id = %(job_id)s FOR UPDATE
), done AS (
    UPDATE jobs j
       SET status = 'cancelled', finished_at = coalesce(%(now)s, now()), expires_at = NULL,
           deadline_at = NULL
      FROM old
     WHERE j.id = old.id AND old.status IN ('queued', 'retrying', 'active')
    RETURNING j.*
), ended AS (
    INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome, error,
                              lease_owner)
    SELECT old.id, old.attempts, old.queue, old.started_at, coalesce(%(now)s, now()),
           'cancelled', 'cancelled while it ran', old.lease_owner
      FROM old JOIN done ON done.id = old.id
     WHERE old.status = 'active'
)
SELECT old.status AS previous, done.* FROM old LEFT JOIN done ON done.id = old.id;

-- name: make_retrying_due
-- An operator's retry of a retrying job: due now.
UPDATE jobs SET run_after = coalesce(%(now)s, now())
 WHERE id = %(job_id)s AND status = 'retrying'
RETURNING *, pg_notify(notify_channel(), 'job:' || origin_queue) AS woke;

-- name: requeue_job
-- A dead or cancelled job back to the queue it was sent to, queued now with a fresh set of
-- attempts. Invariant: the singleton index still decides; a slot held by another pending job
-- raises a unique violation, and the caller names that job.
UPDATE jobs j
   SET queue = j.origin_queue, status = 'queued', attempts = 0,
       run_after = coalesce(%(now)s, now()), finished_at = NULL, expires_at = NULL,
       deadline_at = NULL,
       slot = CASE WHEN q.policy = 'exclusive' THEN coalesce(j.key, '') END
  FROM job_queues q
 WHERE q.name = j.origin_queue AND j.id = %(job_id)s AND j.status IN ('dead', 'cancelled')
RETURNING j.*, pg_notify(notify_channel(), 'job:' || j.origin_queue) AS woke;

-- name: slot_holder
-- The pending job holding a slot of an exclusive queue, if any.
SELECT j.id FROM jobs j JOIN job_queues q ON q.name = j.origin_queue
 WHERE j.origin_queue = %(queue)s AND q.policy = 'exclusive'
   AND j.slot = coalesce(%(key)s, '') AND j.status IN ('queued', 'retrying', 'active');

-- name: dead_jobs
SELECT id FROM jobs WHERE queue = %(queue)s AND status = 'dead' ORDER BY id;

-- name: upsert_schedule
-- One schedule per queue; scheduling again replaces it but keeps the tick fired last.
-- Invariant: scheduling again with the same cron keeps the first tick not fired yet, so a tick
-- that came while no worker ran still fires; only a changed cron starts at the next tick given.
INSERT INTO job_schedules (queue, cron, payload, next_tick)
VALUES (%(queue)s, %(cron)s, %(payload)s, %(next_tick)s)
ON CONFLICT (queue) DO UPDATE
   SET cron = EXCLUDED.cron, payload = EXCLUDED.payload,
       next_tick = CASE WHEN job_schedules.cron = EXCLUDED.cron THEN job_schedules.next_tick
                        ELSE EXCLUDED.next_tick END,
       updated_at = now()
RETURNING *;

-- name: delete_schedule
DELETE FROM job_schedules WHERE queue = %(queue)s RETURNING queue;

-- name: list_schedules
SELECT * FROM job_schedules ORDER BY queue;

-- name: due_schedules
-- Schedules whose first unfired tick has come; firing each is fire_schedule_v1's job.
SELECT queue, cron, next_tick FROM job_schedules
 WHERE next_tick <= coalesce(%(now)s, now()) ORDER BY queue;

-- name: fire_schedule
-- Invariant in fire_schedule_v1: a tick fires once across all workers.
SELECT fire_schedule_v1(%(queue)s, %(expected)s, %(tick)s, %(next_tick)s,
                        %(now)s::timestamptz) AS job_id;

-- name: wake_queue
-- Room came back in a queue with a fleet-wide concurrency limit (a job of it ended): the lanes
-- of that queue on every worker claim again now, not at their next poll.
SELECT pg_notify(notify_channel(), 'job:' || %(queue)s);

-- name: use_schema
-- The async API's connections come from the application's pool: each of its transactions
-- starts by putting the queues' schema on its search_path, for that transaction only (nothing
-- is left on the connection, so this holds behind a transaction pooler too).
SELECT set_config('search_path', %(schema)s, true);

-- name: current_schema
-- The schema of the queues' tables (the first of the pool's search_path), which the statements
-- run on a caller's own connection name.
SELECT current_schema() AS schema;

-- name: database_now
SELECT now() AS now;

-- name: queue_stats
-- Per queue: jobs waiting, running, retrying and dead, and the earliest due time among the
-- waiting ones that are due. Reads only jobs that are not completed or cancelled.
SELECT q.name, q.policy,
       count(j.id) FILTER (WHERE j.status = 'queued') AS queued,
       count(j.id) FILTER (WHERE j.status = 'active') AS active,
       count(j.id) FILTER (WHERE j.status = 'retrying') AS retrying,
       count(j.id) FILTER (WHERE j.status = 'dead') AS dead,
       min(j.run_after) FILTER (WHERE j.status IN ('queued', 'retrying')
                                  AND j.run_after <= coalesce(%(now)s, now())) AS oldest_due_at
  FROM job_queues q
  LEFT JOIN jobs j ON j.queue = q.name AND j.status IN ('queued', 'active', 'retrying', 'dead')
 GROUP BY q.name, q.policy
 ORDER BY q.name;

-- name: prune_jobs
-- Retention: finished jobs older than their queue's retention go, with their attempts, in
-- bounded batches.
DELETE FROM jobs WHERE id IN (
    SELECT j.id FROM jobs j JOIN job_queues q ON q.name = j.queue
     WHERE j.status IN ('completed', 'dead', 'cancelled')
       AND j.finished_at + make_interval(secs => q.retention) < coalesce(%(now)s, now())
     LIMIT %(limit)s)
RETURNING id;

-- name: set_worker_lanes
-- What a worker serves of the application queues, shown by `connector-sync workers`. Only
-- the incarnation that owns the row writes it.
UPDATE workers SET lanes = %(lanes)s WHERE id = %(worker_id)s AND incarnation = %(incarnation)s;

-- name: lanes_online
-- Lanes per queue among live workers (heartbeat within stale_seconds, not stopped).
SELECT l.key AS queue, sum(l.value::integer)::integer AS lanes
  FROM workers w, jsonb_each_text(w.lanes) l
 WHERE w.stopped_at IS NULL AND w.lanes IS NOT NULL
   AND w.heartbeat_at >= now() - make_interval(secs => %(stale_seconds)s)
 GROUP BY l.key;
