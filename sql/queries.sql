-- Named queries. Each block starts with `-- name: <name>`, then comment lines stating what it
-- does and the invariant it protects, then one statement. Python calls them by name
-- (sync/store/queries.py); none is assembled from input. Names resolve through the connection's
-- search_path, which is the configured schema.
--
-- "Fenced" means the statement writes only while the run row still names this claim's lease
-- owner, is running and its lease is live; it locks that row until commit, so no claim can
-- take the run between the check and the write. A stale worker's fenced write matches nothing.
-- The fence is written once, as run_fence_v1(run_row, run_id, lease_owner) (see
-- 0001_baseline.sql), which the planner inlines into the four conditions it stands
-- for; each fenced statement below says it with that function and takes the row lock itself.
-- The functions called here are versioned (claim_run_v3, ...): see "Upgrading" in
-- docs/operations.md.


-- name: enqueue_run
-- Queues a sync of an active connection, or returns the run already queued/running for it;
-- wakes one worker that can run it, none if the new run is parked behind a busy lane (see
-- enqueue_run_v3() in 0001_baseline.sql). Invariant: one queued/running run per connection.
SELECT * FROM enqueue_run_v3(%(connection_id)s, %(workspace_id)s, %(trigger)s, %(max_attempts)s);

-- name: claim_run
-- Claims the oldest claimable run this worker can execute (see claim_run_v3() in
-- 0001_baseline.sql: a sync only of a provider in `providers`, walking only the index of
-- unparked runs, so runs queued behind a busy lane cost the claim nothing) and returns it with
-- what the executor needs of its connection and its tables' cursors (claimed_run_extras_v1()
-- in 0001_baseline.sql), in one round trip. Invariant (claim_run_v3's): two runs of one lane
-- never hold live leases at once, re-checked under the workspace lock. `wakeable`: this worker
-- listens on its own channel; an empty claim marks it idle so that one enqueue wakes it alone.
-- Committed asynchronously: a claim lost in a crash of Postgres loses nothing (the run is
-- queued again, and its worker's fenced writes fail); the first durable write of the run makes
-- the claim durable too (see "Durability" in docs/architecture.md).
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT r.*, x.*
  FROM async, claim_run_v3(%(worker_id)s, %(lease)s, %(providers)s::text[], %(wakeable)s) r
  LEFT JOIN LATERAL claimed_run_extras_v1(r.connection_id) x ON true;

-- name: renew_lease
-- Extends the lease of a run this claim still owns, and notes it on the attempt's history row.
-- Zero rows: the lease is lost (it expired, or another worker claimed the run) and the worker
-- must stop the run at once. An expired lease is never revived: the limiter already treats it
-- as free.
WITH renewed AS (
    UPDATE connection_runs
       SET lease_expires_at = now() + %(lease)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING lease_owner, lease_expires_at
), noted AS (
    UPDATE run_attempts a SET lease_expires_at = renewed.lease_expires_at
      FROM renewed
     WHERE a.lease_owner = renewed.lease_owner
)
SELECT lease_expires_at FROM renewed;

-- name: read_run_control
-- What the lease keeper polls: no row means the lease is lost; cancel_requested means stop.
SELECT r.cancel_requested_at IS NOT NULL AS cancel_requested
  FROM connection_runs r
 WHERE run_fence_v1(r, %(run_id)s, %(lease_owner)s);

-- name: block_rate_budget
-- Records that a rate budget is spent until a time. Never shortens a block already recorded.
-- Not fenced: what a provider said about a shared budget is true whoever heard it.
INSERT INTO rate_budgets (key, blocked_until, reason)
VALUES (%(key)s, %(blocked_until)s, %(reason)s)
ON CONFLICT (key) DO UPDATE
   SET blocked_until = greatest(rate_budgets.blocked_until, EXCLUDED.blocked_until),
       reason = EXCLUDED.reason, updated_at = now();

-- name: rate_budget_until
-- When a shared rate budget is free again, if a provider said it is spent. Asked before every
-- request any job sends to a provider, so that once one worker hears of a window no request of
-- the budget leaves any worker before it ends.
SELECT blocked_until FROM rate_budgets WHERE key = %(key)s AND blocked_until > now();

-- name: lock_credentials
-- Locks a connection's row for a credential refresh, once this claim is known to still hold
-- its run (fenced; the run row stays share-locked, so the save below cannot lose the lease):
-- two runs never spend one single-use refresh token, and a stale worker never refreshes.
WITH fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
)
SELECT c.credentials FROM connections c, fence
 WHERE c.id = %(connection_id)s
   FOR UPDATE OF c;

-- name: lock_connection_credentials
-- The API's side of the same lock, for a user giving a connection new credentials or
-- repairing it.
SELECT credentials, provider, config, workspace_id, status, budget_key FROM connections
 WHERE id = %(connection_id)s
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
   AND status <> 'deleting'
   FOR UPDATE;

-- name: save_credentials
-- Stores re-encrypted credentials, and the budget they draw on, under the lock taken above. A
-- disconnected connection that gets new credentials is active again.
UPDATE connections
   SET credentials = %(credentials)s, budget_key = %(budget_key)s, updated_at = now(),
       status = CASE WHEN status = 'disconnected' AND %(reconnect)s THEN 'active' ELSE status END
 WHERE id = %(connection_id)s
RETURNING *;

-- name: finish_run
-- Seals a run and writes its attempt's own counts on the attempt's history row (see
-- finish_run_v4() in 0001_baseline.sql), waking one worker only if the finish made a
-- run claimable (the lane's next sync, a purge waiting for this run). Fenced: a stale owner's
-- finish matches nothing and returns false.
SELECT f.id IS NOT NULL AS sealed
  FROM finish_run_v4(%(run_id)s, %(lease_owner)s, %(status)s, %(results)s, %(attempt_results)s,
                     %(error)s, %(processed_units)s, %(disconnect)s) f;

-- name: finish_and_claim
-- The worker loop's one round trip between two runs: seals the run it just executed, then
-- claims the next (see finish_and_claim_v4()), waking another worker only for a run this one
-- did not take itself. Returns whether the finish sealed, and the claimed run (all NULL when
-- there is none) with the same extras as claim_run (claimed_run_extras_v1()).
SELECT f.sealed, (f.claimed).*, x.*
  FROM finish_and_claim_v4(%(run_id)s, %(lease_owner)s, %(status)s, %(results)s,
                           %(attempt_results)s, %(error)s, %(processed_units)s, %(disconnect)s,
                           %(worker_id)s, %(lease)s, %(providers)s::text[], %(wakeable)s) f
  LEFT JOIN LATERAL claimed_run_extras_v1((f.claimed).connection_id) x ON true;

-- name: requeue_run
-- Hands a failed attempt's run back to the queue as the same row, due after the delay, keeping
-- its attempts and per-table results (the run's totals; the attempt's history row gets its own
-- counts). Re-checks the world in the same statement: if the connection is no longer active (a
-- sync) or a cancel was requested, the run ends cancelled instead. Fenced. Returns the status
-- the run ended in, or no row when the lease is lost.
WITH run AS (
    SELECT r.id,
           r.cancel_requested_at IS NULL
           AND (r.kind = 'purge'
                OR EXISTS (SELECT 1 FROM connections c
                            WHERE c.id = r.connection_id AND c.status = 'active')) AS may_retry
      FROM connection_runs r
     WHERE run_fence_v1(r, %(run_id)s, %(lease_owner)s)
       FOR NO KEY UPDATE
), moved AS (
    UPDATE connection_runs r
       SET status = CASE WHEN run.may_retry THEN 'queued' ELSE 'cancelled' END,
           queued_at = CASE WHEN run.may_retry
                            THEN now() + make_interval(secs => %(delay_seconds)s)
                            ELSE r.queued_at END,
           finished_at = CASE WHEN run.may_retry THEN NULL ELSE now() END,
           lease_owner = NULL, lease_expires_at = NULL,
           results = %(results)s, error = %(error)s
      FROM run
     WHERE r.id = run.id
    RETURNING r.status
), attempt AS (
    UPDATE run_attempts a
       SET finished_at = clock_timestamp(), error = %(error)s, results = %(attempt_results)s,
           outcome = CASE WHEN moved.status = 'queued' THEN 'retry' ELSE 'cancelled' END
      FROM moved
     WHERE a.lease_owner = %(lease_owner)s
), woken AS (
    SELECT pg_notify(notify_channel(), 'finished') FROM moved
)
SELECT moved.status, (SELECT count(*) FROM woken) AS woken FROM moved;

-- name: wait_for_rate_limit
-- Waiting is not failing: hands a rate-limited run back to the queue, due when the provider's
-- budget is free again, without spending an attempt (attempts - 1, as a hand-back), and counts
-- the wait on the run; the attempt's history row says what it waited for and until when. The
-- caller has checked the run's deadline. Re-checks the world like requeue_run: a connection no
-- longer active or a cancel request ends the run cancelled instead. Fenced.
WITH run AS (
    SELECT r.id,
           r.cancel_requested_at IS NULL
           AND EXISTS (SELECT 1 FROM connections c
                        WHERE c.id = r.connection_id AND c.status = 'active') AS may_retry,
           now() + make_interval(secs => %(delay_seconds)s) AS until
      FROM connection_runs r
     WHERE run_fence_v1(r, %(run_id)s, %(lease_owner)s)
       FOR NO KEY UPDATE
), moved AS (
    UPDATE connection_runs r
       SET status = CASE WHEN run.may_retry THEN 'queued' ELSE 'cancelled' END,
           attempts = CASE WHEN run.may_retry THEN r.attempts - 1 ELSE r.attempts END,
           waits = r.waits + CASE WHEN run.may_retry THEN 1 ELSE 0 END,
           queued_at = CASE WHEN run.may_retry THEN run.until ELSE r.queued_at END,
           waiting_for = CASE WHEN run.may_retry THEN %(waiting_for)s ELSE NULL END,
           waiting_until = CASE WHEN run.may_retry THEN run.until ELSE NULL END,
           finished_at = CASE WHEN run.may_retry THEN NULL ELSE now() END,
           lease_owner = NULL, lease_expires_at = NULL,
           results = %(results)s, error = %(error)s
      FROM run
     WHERE r.id = run.id
    RETURNING r.status, r.waiting_until
), attempt AS (
    UPDATE run_attempts a
       SET finished_at = clock_timestamp(), error = %(error)s, results = %(attempt_results)s,
           outcome = CASE WHEN moved.status = 'queued' THEN 'rate_limited' ELSE 'cancelled' END,
           waiting_for = %(waiting_for)s, waiting_until = moved.waiting_until
      FROM moved
     WHERE a.lease_owner = %(lease_owner)s
), woken AS (
    SELECT pg_notify(notify_channel(), 'finished') FROM moved
)
SELECT moved.status, (SELECT count(*) FROM woken) AS woken FROM moved;

-- name: hand_back_run
-- Graceful shutdown: returns the run to the queue at once without spending an attempt, keeping
-- the per-table results gathered so far (the attempt's history row gets its own). Fenced.
WITH moved AS (
    UPDATE connection_runs
       SET status = 'queued', attempts = attempts - 1, queued_at = now(),
           lease_owner = NULL, lease_expires_at = NULL, results = %(results)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), attempt AS (
    UPDATE run_attempts
       SET finished_at = clock_timestamp(), outcome = 'handed_back',
           results = %(attempt_results)s
     WHERE lease_owner = %(lease_owner)s AND EXISTS (SELECT 1 FROM moved)
), woken AS (
    SELECT pg_notify(notify_channel(), 'enqueued') FROM moved
)
SELECT (SELECT count(*) FROM moved) AS moved, (SELECT count(*) FROM woken) AS woken;

-- name: save_results
-- Stores the per-table results gathered so far, so a crash or cancel keeps them: the run's
-- totals on the run, this attempt's own counts on its history row. Fenced.
WITH saved AS (
    UPDATE connection_runs
       SET results = %(results)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), attempt AS (
    UPDATE run_attempts SET results = %(attempt_results)s
     WHERE lease_owner = %(lease_owner)s AND EXISTS (SELECT 1 FROM saved)
)
SELECT id FROM saved;

-- name: cancel_run
-- A queued run is cancelled at once; a running one gets cancel_requested_at and its worker ends
-- it. A purge cannot be cancelled (its connection is already half gone).
WITH target AS (
    UPDATE connection_runs
       SET status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
           finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,
           cancel_requested_at = coalesce(cancel_requested_at, now()),
           error = CASE WHEN status = 'queued'
                        THEN jsonb_build_object('kind', 'cancelled',
                                                'message', 'cancelled before it started')
                        ELSE error END
     WHERE id = %(run_id)s
       AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
       AND kind = 'sync' AND status IN ('queued', 'running')
    RETURNING *
)
SELECT * FROM target;

-- name: retry_run
-- An operator's retry of a dead-lettered (failed) or cancelled run: the same row goes back to the
-- queue with a fresh allowance of attempts, and every table that did not succeed is read again.
-- Refused (no row) unless the run failed or was cancelled and, for a sync, its connection is still
-- active; the unique index refuses it while the connection has another active run.
UPDATE connection_runs r
   SET status = 'queued', queued_at = now(), finished_at = NULL, error = NULL,
       cancel_requested_at = NULL, max_attempts = r.attempts + %(max_attempts)s,
       trigger = 'retry',
       results = (SELECT coalesce(jsonb_object_agg(
                             t.name, CASE WHEN t.result ->> 'status' = 'succeeded' THEN t.result
                                          ELSE t.result || '{"status": "pending"}' END), '{}')
                    FROM jsonb_each(r.results) AS t(name, result))
 WHERE r.id = %(run_id)s
   AND (%(workspace_id)s::bigint IS NULL OR r.workspace_id = %(workspace_id)s)
   AND r.status IN ('failed', 'cancelled')
   AND (r.kind = 'purge'
        OR EXISTS (SELECT 1 FROM connections c
                    WHERE c.id = r.connection_id AND c.status = 'active'))
RETURNING *;

-- name: enqueue_due_schedules
-- Enqueues a run for each due active connection and advances its next_run_at from now, not from
-- the old value: a connection six hours overdue on a 15-minute schedule gets one run. A due
-- connection that already has an active run skips this tick. SKIP LOCKED lets any number of
-- workers run this at once.
WITH due AS (
    SELECT id FROM connections
     WHERE status = 'active' AND next_run_at <= now()
     ORDER BY next_run_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
), advanced AS (
    UPDATE connections c
       SET next_run_at = now() + c.schedule_every
      FROM due
     WHERE c.id = due.id
    RETURNING c.id, c.workspace_id, c.provider, c.budget_key
), queued AS (
    INSERT INTO connection_runs (connection_id, workspace_id, provider, budget_key, kind,
                                 status, trigger, max_attempts)
    SELECT id, workspace_id, provider, budget_key, 'sync', 'queued', 'schedule', %(max_attempts)s
      FROM advanced
    ON CONFLICT (connection_id) WHERE status IN ('queued', 'running') DO NOTHING
    RETURNING id
), woken AS (
    SELECT pg_notify(notify_channel(), 'enqueued') WHERE EXISTS (SELECT 1 FROM queued)
)
SELECT (SELECT count(*) FROM advanced) AS due, (SELECT count(*) FROM queued) AS queued,
       (SELECT count(*) FROM woken) AS woken;

-- name: write_record_batch
-- Writes one batch of a table's records and, in the same transaction, the checkpoint of the
-- slice (table and partition) they belong to: its read position, counts and whether it is done.
-- A position therefore never commits before the records it covers. Unchanged rows are filtered
-- out by comparing content hashes in one indexed join *before* the upsert, so they are never
-- locked, rewritten or logged. New, changed, tombstoned-then-seen-again rows and rows read from
-- another partition are upserted; the keys of unchanged rows go to run_seen_keys (per run) for
-- the tombstone anti-join. An unchanged row that an earlier complete listing missed only has its
-- mark cleared: it counts as unchanged and keeps its updated_at, since its data did not change
-- (the upsert and the clearing touch disjoint rows). Fenced by the progress update of
-- the run row. The arrays travel in binary (the `b` placeholders): text-format quoting of a
-- thousand 1 KB strings costs more than the rest of the write. The lookup is a LATERAL probe
-- with LIMIT 1, so it stays one index probe per incoming key whatever the statistics say.
WITH async AS (
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    UPDATE connection_runs
       SET processed_units = processed_units + cardinality(%(external_ids)b::text[]),
           progress = %(progress)s, total_units = %(total_units)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), incoming AS (
    SELECT i.external_id, i.data, i.content_hash
      FROM unnest(%(external_ids)b::text[], %(datas)b::text[], %(hashes)b::bytea[])
           AS i(external_id, data, content_hash)
), compared AS (
    SELECT i.external_id, i.data, i.content_hash,
           coalesce(s.content_hash = i.content_hash AND s.deleted_at IS NULL
                    AND s.partition IS NOT DISTINCT FROM %(partition)s::text, false)
           AS unchanged,
           s.missed_by IS NOT NULL AS missed, s.ctid AS stored_at
      FROM incoming i
      LEFT JOIN LATERAL (
          SELECT ctid, content_hash, deleted_at, missed_by, partition FROM records
           WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
             AND external_id = i.external_id
           LIMIT 1
      ) s ON true
), written AS (
    INSERT INTO records AS r (connection_id, table_name, external_id, data, content_hash,
                              written_by, partition)
    SELECT %(connection_id)s, %(table_name)s, external_id, data::jsonb, content_hash,
           %(lease_owner)s, %(partition)s::text
      FROM compared
     WHERE NOT unchanged AND EXISTS (SELECT 1 FROM fence)
    ON CONFLICT (connection_id, table_name, external_id) DO UPDATE
       SET data = EXCLUDED.data, content_hash = EXCLUDED.content_hash, updated_at = now(),
           deleted_at = NULL, written_by = EXCLUDED.written_by,
           partition = EXCLUDED.partition, missed_by = NULL
    RETURNING 1
), cleared AS (
    -- By the row addresses the probes above found, in this statement's snapshot, for this
    -- connection's table: a TID scan, one heap fetch per marked row whatever the statistics
    -- say. By key, the planner could not see how many keys the array held, and on statistics
    -- taken before the connection's rows came it read every row of the connection's table to
    -- clear none (a first sync slowed with every batch it wrote). The rows are this run's to write
    -- (the fence), so no other transaction moves them between the probe and this update.
    UPDATE records r
       SET missed_by = NULL
     WHERE r.ctid = ANY (ARRAY(SELECT stored_at FROM compared WHERE unchanged AND missed))
       AND r.missed_by IS NOT NULL
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1
), seen AS (
    INSERT INTO run_seen_keys (run_id, table_name, external_id)
    SELECT %(run_id)s, %(table_name)s, external_id
      FROM compared
     WHERE unchanged AND %(track_seen)s AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1
), checkpoint AS (
    INSERT INTO run_checkpoints AS c (run_id, table_name, partition, position, done, resync,
                                      pages, records, total, total_estimated, seen,
                                      first_attempt)
    SELECT %(run_id)s, %(table_name)s, %(slice)s, %(position)s, %(done)s, %(resync)s,
           %(pages)s, cardinality(%(external_ids)b::text[]), %(total)s, %(total_estimated)s,
           (SELECT count(*) FROM seen),
           (SELECT a.id FROM run_attempts a WHERE a.lease_owner = %(lease_owner)s)
      FROM fence
    ON CONFLICT (run_id, table_name, partition) DO UPDATE
       SET position = EXCLUDED.position, done = EXCLUDED.done,
           resync = c.resync OR EXCLUDED.resync, pages = EXCLUDED.pages,
           records = c.records + EXCLUDED.records, total = coalesce(EXCLUDED.total, c.total),
           total_estimated = CASE WHEN EXCLUDED.total IS NULL THEN c.total_estimated
                                  ELSE EXCLUDED.total_estimated END,
           seen = c.seen + EXCLUDED.seen, updated_at = now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM async) AS async,
       (SELECT count(*) FROM written) AS upserted,
       (SELECT count(*) FROM seen) AS seen,
       (SELECT count(*) FROM checkpoint) AS checkpointed,
       (SELECT count(*) FROM cleared) AS cleared,
       (SELECT count(*) FROM compared WHERE unchanged) AS unchanged;

-- name: records_stored
-- Whether the connection holds any row of the table, tombstones included: a table that holds
-- none has its batches appended with COPY (append_records). Only a hint: an append that meets a
-- stored key fails whole and the batch is upserted instead, so no row is ever written twice.
SELECT EXISTS (
    SELECT 1 FROM records
     WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
) AS stored;

-- name: open_record_append
-- The fenced half of a batch appended with COPY (append_records follows in the same
-- transaction): the run's progress and the slice's checkpoint, as write_record_batch saves them
-- for a batch of new rows. The fence's row lock is held until the COPY commits, so a worker
-- that took the run over cannot see the checkpoint without the records it covers, nor the
-- records of a lease that is no longer held.
WITH async AS (
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    UPDATE connection_runs
       SET processed_units = processed_units + %(count)s,
           progress = %(progress)s, total_units = %(total_units)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), checkpoint AS (
    INSERT INTO run_checkpoints AS c (run_id, table_name, partition, position, done, resync,
                                      pages, records, total, total_estimated, first_attempt)
    SELECT %(run_id)s, %(table_name)s, %(slice)s, %(position)s, %(done)s, %(resync)s,
           %(pages)s, %(count)s, %(total)s, %(total_estimated)s,
           (SELECT a.id FROM run_attempts a WHERE a.lease_owner = %(lease_owner)s)
      FROM fence
    ON CONFLICT (run_id, table_name, partition) DO UPDATE
       SET position = EXCLUDED.position, done = EXCLUDED.done,
           resync = c.resync OR EXCLUDED.resync, pages = EXCLUDED.pages,
           records = c.records + EXCLUDED.records, total = coalesce(EXCLUDED.total, c.total),
           total_estimated = CASE WHEN EXCLUDED.total IS NULL THEN c.total_estimated
                                  ELSE EXCLUDED.total_estimated END,
           updated_at = now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM async) AS async,
       (SELECT count(*) FROM checkpoint) AS checkpointed;

-- name: append_records
-- A batch of rows none of which is stored yet, as COPY writes them: parsed and appended, with no
-- probe of the stored hash and no speculative insertion per row. The primary key still holds:
-- one stored key (a row read twice, on two pages that shifted between reads) fails the whole
-- COPY, and the batch is written by write_record_batch instead. Only after open_record_append
-- in the same transaction, which fences it.
COPY records (connection_id, table_name, external_id, data, content_hash, written_by, partition)
FROM STDIN;

-- name: save_checkpoint
-- A slice's checkpoint with no batch to ride on: its position or its end, when every record it
-- covers was written by the batches before (the caller waits for the one in flight). Fenced.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    UPDATE connection_runs
       SET progress = %(progress)s, total_units = %(total_units)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), checkpoint AS (
    INSERT INTO run_checkpoints AS c (run_id, table_name, partition, position, done, resync,
                                      pages, total, total_estimated, first_attempt)
    SELECT %(run_id)s, %(table_name)s, %(slice)s, %(position)s, %(done)s, %(resync)s,
           %(pages)s, %(total)s, %(total_estimated)s,
           (SELECT a.id FROM run_attempts a WHERE a.lease_owner = %(lease_owner)s)
      FROM fence
    ON CONFLICT (run_id, table_name, partition) DO UPDATE
       SET position = EXCLUDED.position, done = EXCLUDED.done,
           resync = c.resync OR EXCLUDED.resync, pages = EXCLUDED.pages,
           total = coalesce(EXCLUDED.total, c.total),
           total_estimated = CASE WHEN EXCLUDED.total IS NULL THEN c.total_estimated
                                  ELSE EXCLUDED.total_estimated END,
           updated_at = now()
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM async) AS async,
       (SELECT count(*) FROM checkpoint) AS checkpointed;

-- name: run_checkpoints
-- Where an earlier attempt of this run left each slice of its tables. Read when an attempt
-- starts on a run that has written before (processed_units > 0).
SELECT table_name, partition, position, done, resync, pages, records, total, total_estimated,
       seen
  FROM run_checkpoints WHERE run_id = %(run_id)s;

-- name: check_seen_keys
-- Whether the seen keys this run saved for a table are all still there (see
-- seen_keys_intact_v1() in 0001_baseline.sql): run_seen_keys is unlogged, and a
-- crash restart of Postgres empties it.
SELECT seen_keys_intact_v1(%(run_id)s, %(table_name)s) AS intact;

-- name: reset_table_checkpoints
-- Forgets how far this run read a table (or one partition of it), so it is read again from its
-- start and only what that read sees counts for its tombstones: its seen keys were lost, or the
-- connector gives no position to resume from. The table's seen keys go with a whole table; a
-- partition's stay (they can only keep rows, never tombstone one). Fenced.
WITH fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), checkpoints AS (
    DELETE FROM run_checkpoints
     WHERE run_id = %(run_id)s AND table_name = %(table_name)s
       AND (%(partition)s::text IS NULL OR partition = %(partition)s::text)
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1
), keys AS (
    DELETE FROM run_seen_keys
     WHERE run_id = %(run_id)s AND table_name = %(table_name)s AND %(partition)s::text IS NULL
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM checkpoints) AS slices,
       (SELECT count(*) FROM keys) AS keys;

-- name: tombstone_ids
-- Tombstones rows known deleted upstream: reported by an incremental table, or confirmed one by
-- one by the connector of a table whose listing can shift. Fenced; committed asynchronously
-- like every intermediate write of a run. Returns the rows tombstoned per partition.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), found AS (
    -- The live rows of these keys: one index probe per key (LATERAL, LIMIT 1) whatever the
    -- statistics say, then updated by address (a TID scan). By key, on statistics taken before
    -- a new connection's rows came, the planner read every row of the connection's table for
    -- a few keys. The rows are this run's to write (the fence), so nothing moves them between
    -- the probe and the update.
    SELECT s.ctid AS stored_at
      FROM unnest(%(external_ids)b::text[]) AS k(external_id)
      CROSS JOIN LATERAL (
          SELECT ctid FROM records
           WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
             AND external_id = k.external_id AND deleted_at IS NULL
           LIMIT 1
      ) s
), gone AS (
    UPDATE records
       SET deleted_at = now(), updated_at = now(), written_by = %(lease_owner)s
     WHERE ctid = ANY (ARRAY(SELECT stored_at FROM found)) AND deleted_at IS NULL
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING coalesce(partition, '') AS part
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM async) AS async,
       (SELECT coalesce(jsonb_object_agg(part, n), '{}')
          FROM (SELECT part, count(*) AS n FROM gone GROUP BY part) counted) AS tombstoned;

-- name: mark_missing
-- A table whose listing can shift, and whose connector could not confirm these deletions one by
-- one: a key must be missing from two complete listings before it is tombstoned. Rows an
-- earlier run's complete listing already missed are tombstoned; the others are marked missed by
-- this run (a listing that shows them again clears the mark). Fenced.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), found AS (
    -- The live rows of these keys, by address, as in tombstone_ids.
    SELECT s.ctid AS stored_at
      FROM unnest(%(external_ids)b::text[]) AS k(external_id)
      CROSS JOIN LATERAL (
          SELECT ctid FROM records
           WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
             AND external_id = k.external_id AND deleted_at IS NULL
           LIMIT 1
      ) s
), gone AS (
    UPDATE records
       SET deleted_at = now(), updated_at = now(), written_by = %(lease_owner)s
     WHERE ctid = ANY (ARRAY(SELECT stored_at FROM found)) AND deleted_at IS NULL
       AND missed_by IS NOT NULL AND missed_by <> %(run_id)s
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING coalesce(partition, '') AS part
), marked AS (
    UPDATE records
       SET missed_by = %(run_id)s, written_by = %(lease_owner)s
     WHERE ctid = ANY (ARRAY(SELECT stored_at FROM found)) AND deleted_at IS NULL
       AND missed_by IS NULL
       AND EXISTS (SELECT 1 FROM fence)
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM async) AS async,
       (SELECT coalesce(jsonb_object_agg(part, n), '{}')
          FROM (SELECT part, count(*) AS n FROM gone GROUP BY part) counted) AS tombstoned,
       (SELECT count(*) FROM marked) AS marked;

-- name: tombstone_unseen
-- One bounded step of a table's tombstone pass, after the table (or some of its partitions) was
-- read completely in this run (see tombstone_unseen_v2() in 0001_baseline.sql).
-- Fenced.
SELECT * FROM tombstone_unseen_v2(%(run_id)s, %(lease_owner)s, %(connection_id)s, %(table_name)s,
                                     %(partitions)s, %(after)s, %(limit)s);

-- name: unseen_rows
-- One bounded step of the same candidates, read only, for a table whose listing can shift: its
-- connector confirms them before anything is tombstoned (see unseen_rows_v2()).
SELECT * FROM unseen_rows_v2(%(run_id)s, %(lease_owner)s, %(connection_id)s, %(table_name)s,
                             %(partitions)s, %(after)s, %(limit)s);

-- name: complete_table
-- The end of a table's tombstone pass, after its last step (see complete_table_v1() in
-- 0001_baseline.sql): stamps each partition read completely in this run, and
-- last_full_sync_at when every partition was; drops the table's seen keys. Fenced; committed
-- asynchronously like every intermediate write of a run.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT complete_table_v1(%(run_id)s, %(lease_owner)s, %(connection_id)s, %(table_name)s,
                         %(partitions)s::text[], %(stamp)s) AS fenced
  FROM async;

-- name: end_table
-- The end of a table read completely in this run, in one round trip when its rows fit in one
-- tombstone step (see end_table_v1() in 0001_baseline.sql): the seen-key check, the
-- first tombstone step over `partitions` (NULL: the whole table), and the stamp of the complete
-- passes of `whole` once that step reached the end. Fenced; never tombstones by lost seen keys.
SELECT * FROM end_table_v1(%(run_id)s, %(lease_owner)s, %(connection_id)s, %(table_name)s,
                           %(partitions)s, %(whole)s::text[], %(stamp)s, %(limit)s);

-- name: table_partitions
-- The partitions of a table as the last sync listed them, and those that answered 404 since
-- which run (absent_partitions: partition -> run id), to find the partitions that are gone.
SELECT coalesce(partitions, '{}') AS partitions, coalesce(absent_partitions, '{}') AS absent
  FROM table_state
 WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s;

-- name: tombstone_partitions
-- One bounded step tombstoning the live rows of partitions that are gone (see
-- tombstone_partitions_v1() in 0001_baseline.sql). Fenced.
SELECT * FROM tombstone_partitions_v1(%(run_id)s, %(lease_owner)s, %(connection_id)s,
                                      %(table_name)s, %(partitions)s, %(after)s, %(limit)s);

-- name: save_partitions
-- The listing of a table's partitions as this run saw it, and which answered 404 since which
-- run. Written only after the rows of the partitions that are gone were tombstoned, so a crash
-- in between finds them gone again rather than forgetting them. A gone partition loses its
-- cursor and its complete pass: one that comes back is read whole. Fenced; committed
-- asynchronously like every intermediate write of a run.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
)
INSERT INTO table_state AS s (connection_id, table_name, partitions, absent_partitions)
SELECT %(connection_id)s, %(table_name)s, %(listed)s::text[], %(absent)s::jsonb
  FROM fence, async
ON CONFLICT (connection_id, table_name) DO UPDATE
   SET partitions = EXCLUDED.partitions,
       absent_partitions = EXCLUDED.absent_partitions,
       cursor = CASE WHEN jsonb_typeof(s.cursor) = 'object' THEN s.cursor - %(gone)s::text[]
                     ELSE s.cursor END,
       complete_passes = s.complete_passes - %(gone)s::text[],
       updated_at = now()
RETURNING 1 AS fenced;

-- name: queue_file_ingestions
-- The end of a files table's sync, fenced by the run (run_fence_v1; the run
-- row stays share-locked until commit, so no claim takes the run meanwhile): every live file
-- whose record's content hash differs from the one last queued (file_sources) gets a queued
-- ingestion (or updates the pending one, whose finish then sees the record moved on); an
-- unchanged file gets none. A tombstoned file's documents (and so their chunks) are deleted,
-- its queued ingestions cancelled and its running one asked to stop.
WITH fence AS (
    SELECT r.workspace_id FROM connection_runs r
     WHERE run_fence_v1(r, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), changed AS (
    SELECT rec.external_id, rec.content_hash
      FROM fence, records rec
      LEFT JOIN file_sources s
             ON s.connection_id = rec.connection_id AND s.table_name = rec.table_name
            AND s.external_id = rec.external_id
     WHERE rec.connection_id = %(connection_id)s AND rec.table_name = %(table_name)s
       AND rec.deleted_at IS NULL
       AND s.content_hash IS DISTINCT FROM rec.content_hash
), remembered AS (
    INSERT INTO file_sources (connection_id, table_name, external_id, content_hash)
    SELECT %(connection_id)s, %(table_name)s, c.external_id, c.content_hash FROM changed c
    ON CONFLICT (connection_id, table_name, external_id) DO UPDATE
       SET content_hash = EXCLUDED.content_hash, queued_at = now()
), queued AS (
    INSERT INTO ingestions (workspace_id, source, connection_id, table_name, external_id,
                            source_hash, max_attempts)
    SELECT f.workspace_id, 'file', %(connection_id)s, %(table_name)s, c.external_id,
           c.content_hash, %(max_attempts)s
      FROM changed c, fence f
    ON CONFLICT (source_key, member_path)
       WHERE status IN ('queued', 'running') AND source_key IS NOT NULL
    DO UPDATE SET source_hash = EXCLUDED.source_hash
    RETURNING 1
), gone AS (
    DELETE FROM file_sources s
     USING records rec, fence
     WHERE s.connection_id = %(connection_id)s AND s.table_name = %(table_name)s
       AND rec.connection_id = s.connection_id AND rec.table_name = s.table_name
       AND rec.external_id = s.external_id AND rec.deleted_at IS NOT NULL
    RETURNING s.external_id
), gone_documents AS (
    DELETE FROM documents d
     USING gone g
     WHERE d.connection_id = %(connection_id)s AND d.table_name = %(table_name)s
       AND d.external_id = g.external_id
    RETURNING d.id
), stopped AS (
    UPDATE ingestions i
       SET status = CASE WHEN i.status = 'queued' THEN 'cancelled' ELSE i.status END,
           finished_at = CASE WHEN i.status = 'queued' THEN now() END,
           cancel_requested_at = coalesce(i.cancel_requested_at, now()),
           error = jsonb_build_object('kind', 'file_deleted',
                                      'message', 'the file was deleted upstream')
      FROM gone g
     WHERE i.source_key = file_source_key(%(connection_id)s, %(table_name)s, g.external_id,
                                          NULL, NULL)
       AND i.status IN ('queued', 'running')
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM queued) AS queued,
       (SELECT count(*) FROM gone_documents) AS deleted, (SELECT count(*) FROM stopped) AS stopped;

-- name: save_cursor
-- Saves an incremental table's cursor (one partition's, inside the table's cursor object, when
-- a partition is named), after the batch it covers was written. Fenced; committed
-- asynchronously: the WAL keeps it after its batch, so a crash can lose the cursor but never
-- keep it without its records.
WITH async AS (
    SELECT set_config('synchronous_commit', 'off', true)
), fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
)
INSERT INTO table_state AS s (connection_id, table_name, cursor)
SELECT %(connection_id)s, %(table_name)s,
       CASE WHEN %(partition)s::text IS NULL THEN %(cursor)s::jsonb
            ELSE jsonb_build_object(%(partition)s::text, %(cursor)s::jsonb) END
  FROM fence, async
ON CONFLICT (connection_id, table_name) DO UPDATE
   SET cursor = CASE WHEN %(partition)s::text IS NULL THEN EXCLUDED.cursor
                     WHEN jsonb_typeof(s.cursor) = 'object' THEN s.cursor || EXCLUDED.cursor
                     ELSE EXCLUDED.cursor END,
       updated_at = now()
RETURNING 1;

-- name: clear_seen_keys
-- Drops the seen keys a finished run left behind (a table that did not complete). Only the run's
-- own worker calls this; prune_seen_keys_batch (maintenance.sql) collects those of runs whose
-- worker died.
DELETE FROM run_seen_keys WHERE run_id = %(run_id)s;

-- name: purge_records_batch
-- Deletes one bounded batch of a deleted connection's records, and records how many the purge
-- has deleted before this batch as its progress. Fenced.
WITH fence AS (
    UPDATE connection_runs
       SET processed_units = %(processed_units)s
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
    RETURNING id
), doomed AS (
    SELECT table_name, external_id FROM records
     WHERE connection_id = %(connection_id)s AND EXISTS (SELECT 1 FROM fence)
     LIMIT %(limit)s
), gone AS (
    DELETE FROM records r
     USING doomed d
     WHERE r.connection_id = %(connection_id)s AND r.table_name = d.table_name
       AND r.external_id = d.external_id
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM gone) AS deleted;

-- name: purge_connection_row
-- Removes a deleted connection's table state and then its row, once no record of it is left.
-- Its runs keep their history with connection_id set NULL. Fenced.
WITH fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
), gone AS (
    DELETE FROM connections c
     WHERE c.id = %(connection_id)s AND c.status = 'deleting'
       AND EXISTS (SELECT 1 FROM fence)
       AND NOT EXISTS (SELECT 1 FROM records r WHERE r.connection_id = %(connection_id)s)
    RETURNING 1
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM gone) AS deleted;

-- name: register_worker
-- A worker start records its own incarnation: process, host, version, start time and the
-- providers it can run. Invariant: one live incarnation per worker id. The row of an earlier
-- incarnation is taken over only if that one stopped, went stale (no heartbeat for
-- stale_seconds), or is the dead process the caller named (same host, a pid no longer running);
-- otherwise nothing is returned and the start is refused. Two starts racing for one dead row:
-- the first rewrites it, the second's condition no longer holds.
INSERT INTO workers (id, hostname, pid, version, providers, incarnation)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(version)s, %(providers)s::text[],
        %(incarnation)s)
ON CONFLICT (id) DO UPDATE
   SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, version = EXCLUDED.version,
       providers = EXCLUDED.providers, incarnation = EXCLUDED.incarnation,
       started_at = now(), heartbeat_at = now(), stopped_at = NULL, current_run_id = NULL
 WHERE workers.stopped_at IS NOT NULL
    OR workers.heartbeat_at < now() - make_interval(secs => %(stale_seconds)s)
    OR (%(dead_pid)s::integer IS NOT NULL
        AND workers.hostname = EXCLUDED.hostname AND workers.pid = %(dead_pid)s
        AND workers.incarnation IS NOT DISTINCT FROM %(dead_incarnation)s::uuid)
RETURNING incarnation;

-- name: heartbeat
-- A worker's heartbeat: says it is alive, what it is running and which providers it runs now
-- (declared providers are loaded while it runs). Invariant: only the incarnation that owns the
-- row beats for it; no row back means another process took the id over (this one was stale),
-- and this one must stop. A row deleted meanwhile is written again.
INSERT INTO workers (id, hostname, pid, version, providers, incarnation, current_run_id)
VALUES (%(worker_id)s, %(hostname)s, %(pid)s, %(version)s, %(providers)s::text[],
        %(incarnation)s, %(current_run_id)s)
ON CONFLICT (id) DO UPDATE
   SET heartbeat_at = now(), current_run_id = EXCLUDED.current_run_id,
       providers = EXCLUDED.providers
 WHERE workers.incarnation = EXCLUDED.incarnation
RETURNING 1 AS beat;

-- name: worker_stopped
-- Records a worker's stop. Invariant: one incarnation's stop never marks another stopped.
UPDATE workers SET stopped_at = now(), current_run_id = NULL
 WHERE id = %(worker_id)s AND incarnation = %(incarnation)s;

-- name: get_worker
SELECT w.*, now() - w.heartbeat_at AS since_heartbeat FROM workers w WHERE w.id = %(worker_id)s;

-- name: queued_runs_without_worker
-- Queued syncs that no live worker can take, by provider: no live worker (one that heartbeated
-- within stale_seconds and has not stopped) has that provider installed. A worker of an older
-- version (providers NULL) takes any. Reads only the claimable partial index's runs.
SELECT r.provider, count(*) AS runs, min(r.id) AS oldest_run
  FROM connection_runs r
 WHERE r.status = 'queued' AND r.kind = 'sync'
   AND (%(workspace_id)s::bigint IS NULL OR r.workspace_id = %(workspace_id)s)
   AND NOT EXISTS (SELECT 1 FROM workers w
                    WHERE w.stopped_at IS NULL
                      AND w.heartbeat_at > now() - make_interval(secs => %(stale_seconds)s)
                      AND (w.providers IS NULL OR r.provider = ANY (w.providers)))
 GROUP BY r.provider
 ORDER BY r.provider;

-- name: create_workspace
INSERT INTO workspaces (name) VALUES (%(name)s) RETURNING *;

-- name: list_workspaces
-- Workspaces that are not deleted, and deleted ones whose connections are still being purged.
SELECT w.*, (SELECT count(*) FROM connections c WHERE c.workspace_id = w.id) AS connections
  FROM workspaces w
 WHERE w.deleted_at IS NULL
    OR EXISTS (SELECT 1 FROM connections c WHERE c.workspace_id = w.id)
 ORDER BY w.id;

-- name: get_workspace_by_id
-- A reference made of digits is an id, and only an id: it never matches a name.
SELECT w.*, (SELECT count(*) FROM connections c WHERE c.workspace_id = w.id) AS connections
  FROM workspaces w
 WHERE w.id = %(workspace_id)s;

-- name: get_workspace_by_name
-- Any other reference is a name; a deleted workspace's name may be taken again, so only a
-- workspace that is not deleted answers to it.
SELECT w.*, (SELECT count(*) FROM connections c WHERE c.workspace_id = w.id) AS connections
  FROM workspaces w
 WHERE w.name = %(name)s AND w.deleted_at IS NULL;

-- name: rename_workspace
UPDATE workspaces SET name = %(name)s
 WHERE id = %(workspace_id)s AND deleted_at IS NULL
RETURNING *;

-- name: mark_workspace_deleted
-- The first step of deleting a workspace, in the transaction that then deletes each of its
-- connections. FOR UPDATE conflicts with the KEY SHARE lock create_connection takes, so a
-- connection is either created before (and deleted here) or refused after.
WITH locked AS (
    SELECT id FROM workspaces WHERE id = %(workspace_id)s FOR UPDATE
)
UPDATE workspaces w SET deleted_at = coalesce(w.deleted_at, now())
  FROM locked
 WHERE w.id = locked.id
RETURNING w.*;

-- name: connections_of_workspace
SELECT id FROM connections WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: create_connection
-- Creates a connection in a workspace that is not deleted. The KEY SHARE lock waits for a
-- workspace delete in progress, then sees it deleted (see mark_workspace_deleted). For a
-- declared provider, the same lock on its row waits for a removal in progress, then sees the
-- provider gone: no connection of a removed provider (see lock_declared_provider).
INSERT INTO connections (workspace_id, name, provider, config, credentials, budget_key,
                         schedule_every, next_run_at, reader_schema)
SELECT w.id, %(name)s, %(provider)s, %(config)s, %(credentials)s, %(budget_key)s,
       make_interval(secs => %(schedule_seconds)s),
       CASE WHEN %(schedule_seconds)s::float8 IS NULL THEN NULL ELSE now() END,
       %(reader_schema)s
  FROM workspaces w
 WHERE w.id = %(workspace_id)s AND w.deleted_at IS NULL
   AND (NOT %(declared)s
        OR EXISTS (SELECT 1 FROM declared_providers d WHERE d.name = %(provider)s
                      FOR KEY SHARE))
   FOR KEY SHARE OF w
RETURNING *;

-- name: update_connection
-- An operator's repair of a connection, under the row lock of lock_connection_credentials: a
-- new name, config, credentials (a disconnected connection given new ones is active again) or
-- schedule. A new schedule never pushes the next run later than the new interval from now; a
-- connection that had no schedule is due at once, as a new one is.
UPDATE connections
   SET name = coalesce(%(name)s, name),
       config = coalesce(%(config)s, config),
       credentials = CASE WHEN %(set_credentials)s THEN %(credentials)s ELSE credentials END,
       budget_key = %(budget_key)s,
       status = CASE WHEN status = 'disconnected' AND %(set_credentials)s THEN 'active'
                     ELSE status END,
       schedule_every = CASE WHEN %(set_schedule)s
                             THEN make_interval(secs => %(schedule_seconds)s)
                             ELSE schedule_every END,
       next_run_at = CASE WHEN NOT %(set_schedule)s THEN next_run_at
                          WHEN %(schedule_seconds)s::float8 IS NULL THEN NULL
                          WHEN schedule_every IS NULL OR next_run_at IS NULL THEN now()
                          ELSE least(next_run_at,
                                     now() + make_interval(secs => %(schedule_seconds)s))
                     END,
       updated_at = now()
 WHERE id = %(connection_id)s
RETURNING *;

-- name: list_connections
SELECT * FROM connections
 WHERE (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
 ORDER BY id;

-- name: get_connection
SELECT * FROM connections
 WHERE id = %(connection_id)s
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s);

-- name: set_connection_status
-- Pause or resume, only from the statuses given: a deleting connection never changes status
-- again, and a disconnected one is resumed only when the caller says so (its credentials were
-- refused). Resuming restarts its schedule from now.
UPDATE connections
   SET status = %(status)s, updated_at = now(),
       next_run_at = CASE WHEN %(status)s = 'active' AND schedule_every IS NOT NULL
                          THEN now() ELSE next_run_at END
 WHERE id = %(connection_id)s
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
   AND status = ANY (%(from_statuses)s::text[])
RETURNING *;

-- name: delete_connection
SELECT * FROM delete_connection_v2(%(connection_id)s, %(workspace_id)s, %(max_attempts)s);

-- name: list_runs
-- Newest first. A connection's runs are found by its id after it was deleted too.
SELECT * FROM connection_runs
 WHERE (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
   AND (%(connection_id)s::bigint IS NULL OR connection_id = %(connection_id)s
        OR deleted_connection_id = %(connection_id)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: get_run
SELECT * FROM connection_runs
 WHERE id = %(run_id)s
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s);

-- name: list_attempts
SELECT a.* FROM run_attempts a
  JOIN connection_runs r ON r.id = a.run_id
 WHERE a.run_id = %(run_id)s
   AND (%(workspace_id)s::bigint IS NULL OR r.workspace_id = %(workspace_id)s)
 ORDER BY a.id;

-- name: list_workers
SELECT w.*, now() - w.heartbeat_at AS since_heartbeat FROM workers w ORDER BY w.started_at;

-- name: list_records
-- A connection's records, live ones only unless asked; the API's read of synced data. Ids made
-- of digits come first, in numeric order (2 before 10, as people count), then the others as
-- text; the order costs a sort of the connection's rows, since no index holds it.
SELECT r.table_name, r.external_id, r.data, r.first_seen_at, r.updated_at, r.deleted_at
  FROM records r
  JOIN connections c ON c.id = r.connection_id
 WHERE r.connection_id = %(connection_id)s
   AND (%(workspace_id)s::bigint IS NULL OR c.workspace_id = %(workspace_id)s)
   AND (%(table_name)s::text IS NULL OR r.table_name = %(table_name)s)
   AND (%(include_deleted)s OR r.deleted_at IS NULL)
 ORDER BY r.table_name,
          CASE WHEN r.external_id ~ '^[0-9]+$' THEN r.external_id::numeric END,
          r.external_id
 LIMIT %(limit)s;

-- name: make_run_due
-- Tests only (sync.testing): a run queued for a later retry or waiting for a rate limit becomes
-- due now, and the rate budget it waits for is free now, as if its time had come.
WITH due AS (
    UPDATE connection_runs SET queued_at = now()
     WHERE id = %(run_id)s AND status = 'queued' AND queued_at > now()
    RETURNING id, budget_key
), lifted AS (
    UPDATE rate_budgets b SET blocked_until = now()
      FROM due
     WHERE b.key = due.budget_key AND b.blocked_until > now()
    RETURNING 1
)
SELECT id, (SELECT count(*) FROM lifted) AS lifted FROM due;

-- name: cached_response
-- The response a connection last got with an ETag from a URL, for a conditional request. The
-- lookup marks the entry used, which keeps it from the cleaner (prune_http_cache_batch): at
-- most once an hour, so a page that answers 304 on every sync costs no write each time.
WITH touched AS (
    UPDATE http_cache SET used_at = now()
     WHERE connection_id = %(connection_id)s AND url_hash = %(url_hash)s
       AND used_at < now() - interval '1 hour'
)
SELECT etag, headers, body FROM http_cache
 WHERE connection_id = %(connection_id)s AND url_hash = %(url_hash)s;

-- name: store_response
-- Keeps a response that came with an ETag, for the next conditional request to the same URL.
-- Fenced like every write a run makes.
WITH fence AS (
    SELECT id FROM connection_runs
     WHERE run_fence_v1(connection_runs, %(run_id)s, %(lease_owner)s)
       FOR SHARE
)
INSERT INTO http_cache (connection_id, url_hash, etag, headers, body)
SELECT %(connection_id)s, %(url_hash)s, %(etag)s, %(headers)s, %(body)s FROM fence
ON CONFLICT (connection_id, url_hash) DO UPDATE
   SET etag = EXCLUDED.etag, headers = EXCLUDED.headers, body = EXCLUDED.body,
       stored_at = now(), used_at = now()
RETURNING 1;

-- name: credentials_to_rotate
-- One batch of connections with credentials, after a given id, locked for re-encryption.
SELECT id, credentials FROM connections
 WHERE credentials IS NOT NULL AND id > %(after_id)s
 ORDER BY id
 LIMIT %(limit)s
   FOR UPDATE;

-- name: store_rotated_credentials
-- The same credentials, re-encrypted under the newest key.
UPDATE connections SET credentials = %(credentials)s WHERE id = %(connection_id)s;

-- name: connections_overview
-- The operator page's list of connections: each with its queued/running/waiting run, if any,
-- and the run that finished last (by finish time: a retried run finishes after newer ones). Two
-- index probes per connection (connection_runs_by_connection walked backwards, and
-- connection_runs_last_finished), and at most `limit` connections, so the page costs the same
-- however much history there is.
SELECT c.id, c.workspace_id, w.name AS workspace_name, c.name, c.provider, c.status,
       c.schedule_every, c.next_run_at,
       a.id AS active_run_id, a.status AS active_run_status,
       f.id AS last_run_id, f.status AS last_run_status, f.finished_at AS last_run_finished_at,
       f.error AS last_run_error
  FROM connections c
  JOIN workspaces w ON w.id = c.workspace_id
  LEFT JOIN LATERAL (
      SELECT r.id, r.status FROM connection_runs r
       WHERE r.connection_id = c.id AND r.status IN ('waiting', 'queued', 'running')
       ORDER BY r.id DESC LIMIT 1
  ) a ON true
  LEFT JOIN LATERAL (
      SELECT r.id, r.status, r.finished_at, r.error FROM connection_runs r
       WHERE r.connection_id = c.id AND r.finished_at IS NOT NULL
         AND r.status IN ('succeeded', 'partial', 'failed', 'cancelled')
       ORDER BY r.finished_at DESC, r.id DESC LIMIT 1
  ) f ON true
 WHERE (%(workspace_id)s::bigint IS NULL OR c.workspace_id = %(workspace_id)s)
 ORDER BY c.workspace_id, c.id
 LIMIT %(limit)s;

-- name: metrics_statement_timeout
-- A scrape of /metrics never holds a connection longer than the scraper waits for it: the
-- snapshot below runs in a transaction with this statement timeout.
SELECT set_config('statement_timeout', %(timeout)s, true);

-- name: metrics_snapshot
-- What /metrics exports from the database, in one statement, hence from one snapshot. Every part
-- reads an index that holds only what it counts, so a scrape costs the same however much history
-- retention keeps: the live runs and the queue (connection_runs_claimable), the runs finished in
-- the last `window_seconds` and their per-table record counts (connection_runs_retention), the
-- dead letters (connection_runs_dead_letters), the workers, and per application queue its
-- waiting jobs (jobs_due), active ones (jobs_expiring) and dead letters (jobs_dead). Read-only.
WITH live AS (
    SELECT kind, provider, status, count(*) AS count
      FROM connection_runs
     WHERE status IN ('waiting', 'queued', 'running')
     GROUP BY kind, provider, status
), finished AS (
    SELECT kind, provider, status, count(*) AS count
      FROM connection_runs
     WHERE finished_at IS NOT NULL
       AND finished_at > now() - make_interval(secs => %(window_seconds)s)
     GROUP BY kind, provider, status
), dead AS (
    SELECT kind, provider, count(*) AS count
      FROM connection_runs
     WHERE status = 'failed'
     GROUP BY kind, provider
), queue AS (
    SELECT count(*) FILTER (WHERE status = 'queued' AND queued_at <= now()) AS due,
           count(*) FILTER (WHERE status = 'queued' AND queued_at > now()) AS delayed,
           count(*) FILTER (WHERE status = 'waiting') AS waiting,
           extract(epoch FROM now() - min(queued_at)
                   FILTER (WHERE status = 'queued' AND queued_at <= now()))::float8
               AS oldest_due_seconds,
           count(*) FILTER (WHERE status = 'running' AND lease_expires_at < now())
               AS expired_leases,
           extract(epoch FROM now() - min(started_at) FILTER (WHERE status = 'running'))::float8
               AS oldest_running_seconds
      FROM connection_runs
     WHERE status IN ('waiting', 'queued', 'running')
), records AS (
    SELECT r.provider,
           sum(CASE WHEN jsonb_typeof(t.result -> 'upserted') = 'number'
                    THEN (t.result ->> 'upserted')::numeric ELSE 0 END)::bigint AS upserted,
           sum(CASE WHEN jsonb_typeof(t.result -> 'unchanged') = 'number'
                    THEN (t.result ->> 'unchanged')::numeric ELSE 0 END)::bigint AS unchanged,
           sum(CASE WHEN jsonb_typeof(t.result -> 'tombstoned') = 'number'
                    THEN (t.result ->> 'tombstoned')::numeric ELSE 0 END)::bigint AS tombstoned
      FROM connection_runs r
     CROSS JOIN LATERAL jsonb_each(CASE WHEN jsonb_typeof(r.results) = 'object'
                                        THEN r.results ELSE '{}' END) AS t(name, result)
     WHERE r.kind = 'sync' AND r.finished_at IS NOT NULL
       AND r.finished_at > now() - make_interval(secs => %(window_seconds)s)
     GROUP BY r.provider
), workers AS (
    SELECT CASE WHEN stopped_at IS NOT NULL THEN 'stopped'
                WHEN heartbeat_at < now() - make_interval(secs => %(stale_after_seconds)s)
                THEN 'stale'
                ELSE 'alive' END AS state,
           count(*) AS count
      FROM workers
     GROUP BY 1
), jobs_waiting AS (
    -- A waiting job is still in the queue it was sent to (only a dead one moves).
    SELECT queue,
           count(*) FILTER (WHERE run_after <= now()) AS due,
           count(*) FILTER (WHERE run_after > now()) AS delayed,
           extract(epoch FROM now() - min(run_after) FILTER (WHERE run_after <= now()))::float8
               AS oldest_due_seconds
      FROM jobs
     WHERE status IN ('queued', 'retrying')
     GROUP BY queue
), jobs_active AS (
    SELECT queue, count(*) AS active FROM jobs WHERE status = 'active' GROUP BY queue
), jobs_dead AS (
    SELECT queue, count(*) AS dead FROM jobs WHERE status = 'dead' GROUP BY queue
), app_queues AS (
    SELECT q.name, coalesce(w.due, 0) AS due, coalesce(w.delayed, 0) AS delayed,
           coalesce(a.active, 0) AS active, coalesce(d.dead, 0) AS dead, w.oldest_due_seconds
      FROM job_queues q
      LEFT JOIN jobs_waiting w ON w.queue = q.name
      LEFT JOIN jobs_active a ON a.queue = q.name
      LEFT JOIN jobs_dead d ON d.queue = q.name
)
SELECT (SELECT coalesce(jsonb_agg(to_jsonb(live)), '[]') FROM live) AS live,
       (SELECT coalesce(jsonb_agg(to_jsonb(finished)), '[]') FROM finished) AS finished,
       (SELECT coalesce(jsonb_agg(to_jsonb(dead)), '[]') FROM dead) AS dead,
       (SELECT to_jsonb(queue) FROM queue) AS queue,
       (SELECT coalesce(jsonb_agg(to_jsonb(records)), '[]') FROM records) AS records,
       (SELECT coalesce(jsonb_object_agg(state, count), '{}') FROM workers) AS workers,
       (SELECT coalesce(jsonb_agg(to_jsonb(app_queues) ORDER BY name), '[]') FROM app_queues)
           AS app_queues;

-- name: last_complete_passes
-- When each table of a connection, and each partition of it, was last read completely (and
-- tombstoned), to decide which slices of an incremental table with a periodic complete pass are
-- due one.
SELECT table_name, last_full_sync_at, coalesce(complete_passes, '{}') AS complete_passes
  FROM table_state
 WHERE connection_id = %(connection_id)s
   AND (last_full_sync_at IS NOT NULL OR complete_passes IS NOT NULL);
