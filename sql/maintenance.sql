-- Named statements of the workers' maintenance: the durable marker that lets one worker of the
-- fleet run a periodic task per interval, and the retention pass (sync/worker/services/cleaner.py),
-- called through sync/store/maintenance.py. Same form as queries.sql: `-- name:`, the
-- invariant it protects, one statement.
--
-- Every retention statement deletes one bounded batch and commits (the pool's connections are
-- autocommit), so no lock is held past one short statement; with `delete` false it deletes
-- nothing and counts what it would delete (`prune --dry-run`), and a NULL `limit` counts them
-- all at once. Each DELETE re-checks, on the row it deletes, the condition that made the row
-- deletable: a row that a concurrent statement changed (a run retried, a budget blocked again,
-- a worker that beat, a record seen again) is re-read at its new version and kept.


-- name: claim_maintenance
-- Takes a periodic task for this worker if no worker took it within `every`. Invariant: once
-- per interval across the fleet. The row lock of ON CONFLICT serializes concurrent claims, and
-- each re-evaluates the WHERE against the version the winner committed, so exactly one of N
-- workers asking at the same moment gets a row back; the others skip the task. Returns the
-- claim's time, the token that finish_maintenance takes.
INSERT INTO maintenance_runs (task, last_run_at, worker_id)
VALUES (%(task)s, now(), %(worker_id)s)
ON CONFLICT (task) DO UPDATE
   SET last_run_at = now(), worker_id = EXCLUDED.worker_id, finished_at = NULL, result = NULL
 WHERE maintenance_runs.last_run_at <= now() - %(every)s::interval
RETURNING last_run_at;

-- name: finish_maintenance
-- Records what a pass of a task did. Invariant: only the latest claim records its result; a
-- pass that outlived its interval and was claimed again meanwhile writes nothing.
UPDATE maintenance_runs
   SET finished_at = now(), result = %(result)s
 WHERE task = %(task)s AND last_run_at = %(claimed_at)s;

-- name: prune_runs_batch
-- One bounded step of the retention of finished runs: walks the next `limit` runs that
-- finished before now() - `older_than`, in (finished_at, id) order after the position given
-- (connection_runs_retention), and deletes those that are not among the `keep` newest runs of
-- their connection; their attempts and checkpoints go with them (ON DELETE CASCADE).
-- Invariants: a run that has not finished (waiting, queued, running) is never deleted,
-- whatever its age, and the DELETE re-checks its status and finished_at on the row, so a run an
-- operator retries meanwhile stays; the `keep` newest runs of a connection are never deleted;
-- runs of a deleted connection (connection_id NULL) have no connection to keep them and go by
-- age alone. Each run is walked once per pass: the kept ones are not read again by the next
-- batch. Returns how many runs it walked, the position of the last one, and how many runs and
-- attempts it deleted (or, without `delete`, would delete).
WITH walked AS (
    SELECT r.id, r.finished_at, r.connection_id, r.status
      FROM connection_runs r
     WHERE r.finished_at IS NOT NULL
       AND r.finished_at < now() - %(older_than)s::interval
       AND r.finished_at >= %(after_finished_at)s::timestamptz
       AND (r.finished_at, r.id) > (%(after_finished_at)s::timestamptz, %(after_id)s::bigint)
     ORDER BY r.finished_at, r.id
     LIMIT %(limit)s
), doomed AS (
    SELECT w.id FROM walked w
     WHERE w.status IN ('succeeded', 'partial', 'failed', 'cancelled')
       AND (w.connection_id IS NULL
            OR (SELECT count(*) FROM (SELECT 1 FROM connection_runs n
                                       WHERE n.connection_id = w.connection_id AND n.id > w.id
                                       LIMIT %(keep)s) newer) >= %(keep)s)
), gone AS (
    DELETE FROM connection_runs r
     USING doomed d
     WHERE %(delete)s AND r.id = d.id
       AND r.status IN ('succeeded', 'partial', 'failed', 'cancelled')
       AND r.finished_at < now() - %(older_than)s::interval
    RETURNING r.id
), counted AS (
    SELECT id FROM gone
    UNION ALL
    SELECT id FROM doomed WHERE NOT %(delete)s
), last AS (
    SELECT finished_at, id FROM walked ORDER BY finished_at DESC, id DESC LIMIT 1
)
SELECT (SELECT count(*) FROM walked) AS walked,
       (SELECT finished_at FROM last) AS last_finished_at,
       (SELECT id FROM last) AS last_id,
       (SELECT count(*) FROM counted) AS runs,
       (SELECT count(*) FROM run_attempts a WHERE a.run_id IN (SELECT id FROM counted))
           AS attempts;

-- name: prune_workers_batch
-- Deletes one bounded batch of workers that stopped, or went silent without recording a stop
-- (a crash), longer than `older_than` ago. Invariant: a live worker's row is never deleted; the
-- DELETE re-checks the time on the row, so a worker that beats or starts again meanwhile stays.
-- A worker that was frozen for that long writes its row again with its next heartbeat.
WITH doomed AS (
    SELECT id FROM workers
     WHERE coalesce(stopped_at, heartbeat_at) < now() - %(older_than)s::interval
     ORDER BY id
     LIMIT %(limit)s
), gone AS (
    DELETE FROM workers w
     USING doomed d
     WHERE %(delete)s AND w.id = d.id
       AND coalesce(w.stopped_at, w.heartbeat_at) < now() - %(older_than)s::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;

-- name: prune_rate_budgets_batch
-- Deletes one bounded batch of rate budgets whose block has ended. Invariant: a budget still
-- blocked is never deleted (the DELETE re-checks blocked_until on the row, so a budget blocked
-- again meanwhile stays); an ended block is worth nothing, since the claim, the control read and
-- block_rate_budget all treat it as absent.
WITH doomed AS (
    SELECT key FROM rate_budgets
     WHERE blocked_until < now()
     ORDER BY key
     LIMIT %(limit)s
), gone AS (
    DELETE FROM rate_budgets b
     USING doomed d
     WHERE %(delete)s AND b.key = d.key AND b.blocked_until < now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;

-- name: prune_seen_keys_batch
-- Deletes one bounded batch of seen keys of runs that have ended (or were deleted). Invariant:
-- a run that waits in the queue or runs keeps its keys, which its next attempt's tombstone pass
-- counts; only the run's own worker clears them when it ends (clear_seen_keys), and this
-- collects what a worker that died left behind.
WITH doomed AS (
    SELECT k.ctid AS row FROM run_seen_keys k
     WHERE NOT EXISTS (SELECT 1 FROM connection_runs r
                        WHERE r.id = k.run_id AND r.status IN ('queued', 'running'))
     LIMIT %(limit)s
), gone AS (
    -- By tuple id (a Tid Scan): the batch costs its own rows, not a scan of the table.
    DELETE FROM run_seen_keys k
     WHERE %(delete)s AND k.ctid = ANY (ARRAY(SELECT row FROM doomed))
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;

-- name: prune_tombstones_batch
-- Deletes one bounded batch of records tombstoned longer than `older_than` ago, oldest first
-- (records_tombstoned). Invariant: a live record is never deleted, and the DELETE re-checks
-- deleted_at on the row, so a record a running sync saw again meanwhile (deleted_at cleared)
-- stays. A record that comes back upstream after its tombstone was deleted is written anew.
WITH doomed AS (
    SELECT ctid AS row FROM records
     WHERE deleted_at < now() - %(older_than)s::interval
     ORDER BY deleted_at
     LIMIT %(limit)s
), gone AS (
    -- By tuple id (a Tid Scan): the batch costs its own rows, however many tombstones there
    -- are. A row updated meanwhile has a new tuple id and is not deleted.
    DELETE FROM records r
     WHERE %(delete)s AND r.ctid = ANY (ARRAY(SELECT row FROM doomed))
       AND r.deleted_at < now() - %(older_than)s::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;

-- name: prune_http_cache_batch
-- Deletes one bounded batch of ETag cache entries nobody asked for in `older_than`, the least
-- recently used first (http_cache_unused): responses to URLs that are never asked again (a
-- listing whose query changes with every sync, a repository no longer synced). Invariant: the
-- DELETE re-checks used_at on the row, so an entry a sync looked up or stored meanwhile stays.
-- An entry deleted too early costs one full response instead of a 304, nothing more.
WITH doomed AS (
    SELECT ctid AS row FROM http_cache
     WHERE used_at < now() - %(older_than)s::interval
     ORDER BY used_at
     LIMIT %(limit)s
), gone AS (
    -- By tuple id (a Tid Scan): the batch costs its own rows, however large the cache is.
    DELETE FROM http_cache c
     WHERE %(delete)s AND c.ctid = ANY (ARRAY(SELECT row FROM doomed))
       AND c.used_at < now() - %(older_than)s::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;

-- name: prune_jobs_batch
-- Deletes one bounded batch of finished application jobs (completed, dead, cancelled) that
-- finished longer ago than the retention of the queue they are in, oldest first per queue
-- (jobs_finished), with their attempts (ON DELETE CASCADE). It is the rule the lanes apply
-- (prune_jobs in sql/queues.sql), run here too so that jobs are pruned, and counted by
-- `prune --dry-run`, whether or not a worker runs lanes. A dead job lives in its dead-letter
-- queue, so that queue's retention keeps it. Invariants: a job that is queued, retrying or
-- active is never deleted; the DELETE re-checks status and age on the row, so a job redriven
-- meanwhile stays. Returns the jobs met, deleted, and the attempts of the jobs it deleted (or,
-- without `delete`, would delete).
WITH doomed AS (
    SELECT d.id FROM job_queues q
     CROSS JOIN LATERAL (
         SELECT j.id FROM jobs j
          WHERE j.queue = q.name AND j.status IN ('completed', 'dead', 'cancelled')
            AND j.finished_at < now() - make_interval(secs => q.retention)
          ORDER BY j.finished_at
          LIMIT %(limit)s) d
     LIMIT %(limit)s
), gone AS (
    DELETE FROM jobs j
     USING job_queues q
     WHERE %(delete)s AND j.id = ANY (ARRAY(SELECT id FROM doomed)) AND q.name = j.queue
       AND j.status IN ('completed', 'dead', 'cancelled')
       AND j.finished_at < now() - make_interval(secs => q.retention)
    RETURNING j.id
), counted AS (
    SELECT id FROM gone
    UNION ALL
    SELECT id FROM doomed WHERE NOT %(delete)s
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted,
       (SELECT count(*) FROM job_attempts a WHERE a.job_id IN (SELECT id FROM counted))
           AS attempts;

-- name: prune_ingestions_batch
-- Deletes one bounded batch of finished ingestions (ready, skipped, failed, cancelled) that
-- finished longer than `older_than` ago, oldest first (ingestions_finished). The documents
-- and chunks they made are data, not history, and stay. Invariants: an ingestion that is
-- queued or running is never deleted; nor is an archive while one of its member files is
-- queued or running (the member's row names it); the DELETE re-checks status and age on the
-- row, so an ingestion queued again meanwhile stays.
WITH doomed AS (
    SELECT i.id FROM ingestions i
     WHERE i.status IN ('ready', 'skipped', 'failed', 'cancelled')
       AND i.finished_at < now() - %(older_than)s::interval
       -- Asked only of the archives met (a subplan under OR, never an anti-join of every
       -- finished row), so the walk stays the next `limit` rows of the index.
       AND (i.kind <> 'archive'
            OR NOT EXISTS (SELECT 1 FROM ingestions m
                            WHERE m.archive_id = i.id AND m.status IN ('queued', 'running')))
     ORDER BY i.finished_at, i.id
     LIMIT %(limit)s
), gone AS (
    -- An array of ids: one primary-key probe each, whatever the plan of a join would be.
    DELETE FROM ingestions i
     WHERE %(delete)s AND i.id = ANY (ARRAY(SELECT id FROM doomed))
       AND i.status IN ('ready', 'skipped', 'failed', 'cancelled')
       AND i.finished_at < now() - %(older_than)s::interval
    RETURNING 1
)
SELECT (SELECT count(*) FROM doomed) AS found, (SELECT count(*) FROM gone) AS deleted;
