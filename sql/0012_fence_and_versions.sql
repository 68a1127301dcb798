-- The fence, written once, and versioned names for the functions the engine calls.
--
-- 1. run_fence_v1(r, run_id, lease_owner) is the fence of every write a run makes: the run row
--    `r` is the run `run_id`, still names the claim's fencing token as its lease owner, is
--    running, and its lease has not run out. Every fenced statement of queries.sql and every
--    function below says it through this function instead of writing the four conditions out.
--    It is a one-expression SQL function (no SET clause, STABLE, not STRICT), so the planner
--    inlines it: `WHERE run_fence_v1(r, $1, $2)` plans exactly like the four conditions, an
--    index scan of connection_runs_pkey on `r.id = $1` (tests/test_fence.py checks every fenced
--    statement's plan). The row lock that holds the fence until commit (FOR SHARE, or the
--    UPDATE of the run row) stays with each statement.
--
-- 2. The functions the engine calls carry a version in their name. A rolling upgrade runs
--    workers and API processes of two versions against one migrated schema: the old ones keep
--    calling the functions they know, the new ones call the new versions. A change to a
--    function's behaviour or signature is a new version in a new migration (claim_run_v3 ...),
--    never a CREATE OR REPLACE of one in use; an old version is dropped only by a migration of
--    a release after every process stopped calling it. The unversioned functions of 0002-0005
--    stay, unchanged, for processes of the previous release; nothing of this release calls them.
--    The versions here have the same bodies as those (the fence aside, which says the same).


-- run_fence_v1: the fence. Invariant: a write fenced by it commits only while the claim that
-- made `p_lease_owner` still holds the run `p_run_id`: the run is running and its lease is live.
-- An expired lease never passes, even before another worker has claimed the run: the limiter
-- already treats it as free. STABLE (now()), so the statement's one now() is used throughout.
CREATE FUNCTION run_fence_v1(r connection_runs, p_run_id bigint, p_lease_owner uuid)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
           AND r.lease_expires_at > now()
$$;


-- enqueue_run_v2: enqueue_run of 0002_queue_functions.sql under its versioned name, the same
-- body. Invariant: one queued/running run per connection however many callers race.
CREATE FUNCTION enqueue_run_v2(p_connection_id bigint, p_workspace_id bigint, p_trigger text,
                               p_max_attempts integer)
RETURNS SETOF connection_runs
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    created connection_runs;
BEGIN
    FOR round IN 1..10 LOOP
        INSERT INTO connection_runs (connection_id, workspace_id, provider, budget_key, kind,
                                     status, trigger, max_attempts)
        SELECT c.id, c.workspace_id, c.provider, c.budget_key, 'sync', 'queued', p_trigger,
               p_max_attempts
          FROM connections c
         WHERE c.id = p_connection_id
           AND (p_workspace_id IS NULL OR c.workspace_id = p_workspace_id)
           AND c.status = 'active'
           FOR SHARE
        ON CONFLICT (connection_id) WHERE status IN ('queued', 'running') DO NOTHING
        RETURNING * INTO created;
        IF FOUND THEN
            PERFORM pg_notify(notify_channel(), 'enqueued');
            RETURN NEXT created;
            RETURN;
        END IF;

        RETURN QUERY
            SELECT r.* FROM connection_runs r
             WHERE r.connection_id = p_connection_id
               AND (p_workspace_id IS NULL OR r.workspace_id = p_workspace_id)
               AND r.kind = 'sync' AND r.status IN ('queued', 'running');
        IF FOUND THEN
            RETURN;
        END IF;

        -- Neither inserted nor found: either the connection is not active (the caller says why)
        -- or the active run finished between our two statements, so try again.
        IF NOT EXISTS (SELECT 1 FROM connections c
                        WHERE c.id = p_connection_id
                          AND (p_workspace_id IS NULL OR c.workspace_id = p_workspace_id)
                          AND c.status = 'active') THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'enqueue_run_v2: connection % kept changing under ten attempts', p_connection_id;
END
$$;


-- claim_run_v2: claim_run of 0005_worker_providers_and_repairs.sql under its versioned name, the
-- same body: the oldest claimable run this worker can execute, locked with its workspace, made
-- running under a fresh fencing token. Invariant: two runs of one lane never hold live leases
-- at once (the limiter, re-checked with the workspace lock held). The `lease_expires_at > now()`
-- tests below are the limiter's (is another run's lease live?), not the fence.
CREATE FUNCTION claim_run_v2(p_worker_id text, p_lease interval,
                              p_providers text[] DEFAULT NULL)
RETURNS SETOF connection_runs
LANGUAGE plpgsql
-- One row at most: without this the planner assumes 1,000 and hashes all of `connections` to
-- join the claimed run to its connection.
ROWS 1
SET search_path FROM CURRENT
-- The candidate must come from walking connection_runs_claimable in order, stopping at the first
-- claimable row. Without statistics (a fresh or just-filled queue) the planner would otherwise
-- bitmap-scan every due run and sort them, on every claim: O(queue) instead of O(1).
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    candidate connection_runs;
    passed    bigint[] := '{}';
    token     uuid;
BEGIN
    FOR round IN 1..20 LOOP
        SELECT r.* INTO candidate
          FROM connection_runs r
          JOIN workspaces w ON w.id = r.workspace_id
         WHERE r.status IN ('waiting', 'queued', 'running')
           AND r.queued_at <= now()
           AND r.id <> ALL (passed)
           -- Only what this worker can run: a run of a provider it lacks waits for one that has it.
           AND (r.kind = 'purge' OR p_providers IS NULL OR r.provider = ANY (p_providers))
           AND CASE r.status
                   WHEN 'queued' THEN true
                   WHEN 'running' THEN r.lease_expires_at <= now()
                   ELSE r.kind = 'purge' AND NOT EXISTS (
                            SELECT 1 FROM connection_runs o
                             WHERE o.connection_id = r.connection_id
                               AND o.status IN ('queued', 'running'))
               END
           -- A shared rate budget found exhausted holds back every run drawing on it.
           AND (r.budget_key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM rate_budgets b
                    WHERE b.key = r.budget_key AND b.blocked_until > now()))
           -- The limiter (see the re-check below).
           AND NOT EXISTS (
                   SELECT 1 FROM connection_runs o
                    WHERE o.workspace_id = r.workspace_id
                      AND o.status = 'running'
                      AND o.lease_expires_at > now()
                      AND (o.kind = 'purge' OR r.kind = 'purge' OR o.provider = r.provider))
         ORDER BY r.queued_at, r.id
         LIMIT 1
           FOR NO KEY UPDATE OF r, w SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;

        -- The re-check of the limiter, with the workspace lock held: is another run of this
        -- workspace running with a live lease such that the two may not overlap (either is a
        -- purge, or both draw on the same provider)?
        IF EXISTS (SELECT 1 FROM connection_runs o
                    WHERE o.workspace_id = candidate.workspace_id
                      AND o.status = 'running'
                      AND o.lease_expires_at > now()
                      AND o.id <> candidate.id
                      AND (o.kind = 'purge' OR candidate.kind = 'purge'
                           OR o.provider = candidate.provider))
           OR (candidate.status = 'waiting' AND EXISTS (
                   SELECT 1 FROM connection_runs o
                    WHERE o.connection_id = candidate.connection_id
                      AND o.status IN ('queued', 'running'))) THEN
            passed := passed || candidate.id;
            CONTINUE;
        END IF;

        IF candidate.status = 'running' THEN
            UPDATE run_attempts
               SET outcome = 'lost', finished_at = now(),
                   error = jsonb_build_object(
                       'kind', 'lease_expired',
                       'message', 'the worker stopped renewing its lease; the run was claimed again')
             WHERE run_id = candidate.id AND outcome IS NULL;

            -- A crash on the last attempt leaves nothing to retry: dead-letter it.
            IF candidate.attempts >= candidate.max_attempts THEN
                UPDATE connection_runs
                   SET status = 'failed', finished_at = now(),
                       lease_owner = NULL, lease_expires_at = NULL,
                       error = jsonb_build_object(
                           'kind', 'lease_expired',
                           'message', 'the worker running the last attempt stopped renewing its lease')
                 WHERE id = candidate.id;
                passed := passed || candidate.id;
                CONTINUE;
            END IF;
        END IF;

        token := gen_random_uuid();
        -- clock_timestamp(), not now(): an attempt's interval must contain its execution, which
        -- begins after this claim's locks were taken, not when its transaction began.
        INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id, started_at)
        VALUES (candidate.id, candidate.attempts + 1, token, p_worker_id, clock_timestamp());

        RETURN QUERY
            UPDATE connection_runs
               SET status = 'running',
                   attempts = attempts + 1,
                   lease_owner = token,
                   lease_expires_at = now() + p_lease,
                   worker_id = p_worker_id,
                   started_at = coalesce(started_at, now())
             WHERE id = candidate.id
            RETURNING *;
        RETURN;
    END LOOP;
END
$$;


-- finish_run_v2: finish_run of 0002_queue_functions.sql, fenced by run_fence_v1. Seals a run with
-- a terminal status, its results and error, closes its attempt and, with p_disconnect, marks its
-- connection disconnected. Invariant: a stale owner's finish matches nothing and returns false.
CREATE FUNCTION finish_run_v2(p_run_id bigint, p_lease_owner uuid, p_status text,
                              p_results jsonb, p_error jsonb, p_processed_units bigint,
                              p_disconnect boolean)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_connection bigint;
BEGIN
    UPDATE connection_runs
       SET status = p_status, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
           results = p_results, error = p_error,
           processed_units = coalesce(p_processed_units, processed_units)
     WHERE run_fence_v1(connection_runs, p_run_id, p_lease_owner)
    RETURNING connection_id INTO v_connection;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE run_attempts
       SET finished_at = clock_timestamp(), outcome = p_status, error = p_error,
           results = p_results
     WHERE lease_owner = p_lease_owner;
    IF p_disconnect THEN
        UPDATE connections SET status = 'disconnected', updated_at = now()
         WHERE id = v_connection AND status = 'active';
    END IF;
    -- Only a worker idle behind this run's lane can use a wake-up: none if nothing is due.
    IF EXISTS (SELECT 1 FROM connection_runs
                WHERE status IN ('queued', 'waiting') AND queued_at <= now()) THEN
        PERFORM pg_notify(notify_channel(), 'finished');
    END IF;
    RETURN true;
END
$$;


-- finish_and_claim_v2: finish_run_v2(), then claim_run_v2(), in one call: the worker loop's
-- single round trip between two runs. The finish commits with the claim; if nothing is
-- claimable, `claimed` is all NULL and the finish still stands.
CREATE FUNCTION finish_and_claim_v2(p_run_id bigint, p_lease_owner uuid, p_status text,
                                    p_results jsonb, p_error jsonb, p_processed_units bigint,
                                    p_disconnect boolean, p_worker_id text, p_lease interval,
                                    p_providers text[] DEFAULT NULL)
RETURNS TABLE (sealed boolean, claimed connection_runs)
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
AS $$
DECLARE
    v_next connection_runs;
BEGIN
    sealed := finish_run_v2(p_run_id, p_lease_owner, p_status, p_results, p_error,
                         p_processed_units, p_disconnect);
    SELECT * INTO v_next FROM claim_run_v2(p_worker_id, p_lease, p_providers);
    claimed := v_next;
    RETURN NEXT;
END
$$;


-- tombstone_unseen_v2: tombstone_unseen of 0004_resumable_syncs.sql, fenced by run_fence_v1.
-- Invariants: fenced (the run row is share-locked first and held until commit); bounded; linear
-- (nested loops off: run_seen_keys never has statistics for this run); each step's key range is
-- fixed before its UPDATE.
CREATE FUNCTION tombstone_unseen_v2(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                                    p_table text, p_partitions text[], p_after text,
                                    p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
-- The cost penalty that turns nested loops off would otherwise trip JIT compilation (0.4 s).
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_tokens uuid[];
    v_gone jsonb := '{}';
BEGIN
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '{}'::jsonb;
        RETURN;
    END IF;

    -- Rows written by the attempts that read the table's slices were read in this run.
    SELECT array_agg(a.lease_owner) INTO v_tokens
      FROM run_attempts a
     WHERE a.run_id = p_run_id
       AND a.id >= coalesce((SELECT min(c.first_attempt) FROM run_checkpoints c
                              WHERE c.run_id = p_run_id AND c.table_name = p_table),
                            (SELECT b.id FROM run_attempts b WHERE b.lease_owner = p_lease_owner));

    SELECT max(span.external_id), count(*) INTO v_hi, v_n
      FROM (SELECT s.external_id FROM records s
             WHERE s.connection_id = p_connection_id AND s.table_name = p_table
               AND s.external_id > p_after
             ORDER BY s.external_id
             LIMIT p_limit) span;

    IF v_n > 0 THEN
        WITH gone AS (
            UPDATE records r
               SET deleted_at = now(), updated_at = now(), written_by = p_lease_owner
             WHERE r.connection_id = p_connection_id AND r.table_name = p_table
               AND r.external_id > p_after AND r.external_id <= v_hi
               AND r.deleted_at IS NULL AND r.written_by <> ALL (v_tokens)
               AND (p_partitions IS NULL OR r.partition = ANY (p_partitions))
               AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                                WHERE k.run_id = p_run_id AND k.table_name = p_table
                                  AND k.external_id > p_after AND k.external_id <= v_hi
                                  AND k.external_id = r.external_id)
            RETURNING coalesce(r.partition, '') AS part
        )
        SELECT coalesce(jsonb_object_agg(counted.part, counted.n), '{}') INTO v_gone
          FROM (SELECT gone.part, count(*) AS n FROM gone GROUP BY gone.part) counted;
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_gone;
END
$$;


-- unseen_rows_v2: unseen_rows of 0004_resumable_syncs.sql, fenced by run_fence_v1: the
-- read-only twin of tombstone_unseen_v2. Same invariants: fenced, bounded, linear.
CREATE FUNCTION unseen_rows_v2(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                               p_table text, p_partitions text[], p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, unseen jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_tokens uuid[];
    v_unseen jsonb := '[]';
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner);
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '[]'::jsonb;
        RETURN;
    END IF;

    SELECT array_agg(a.lease_owner) INTO v_tokens
      FROM run_attempts a
     WHERE a.run_id = p_run_id
       AND a.id >= coalesce((SELECT min(c.first_attempt) FROM run_checkpoints c
                              WHERE c.run_id = p_run_id AND c.table_name = p_table),
                            (SELECT b.id FROM run_attempts b WHERE b.lease_owner = p_lease_owner));

    SELECT max(span.external_id), count(*) INTO v_hi, v_n
      FROM (SELECT s.external_id FROM records s
             WHERE s.connection_id = p_connection_id AND s.table_name = p_table
               AND s.external_id > p_after
             ORDER BY s.external_id
             LIMIT p_limit) span;

    IF v_n > 0 THEN
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'external_id', r.external_id, 'partition', r.partition, 'data', r.data)
                   ORDER BY r.external_id), '[]')
          INTO v_unseen
          FROM records r
         WHERE r.connection_id = p_connection_id AND r.table_name = p_table
           AND r.external_id > p_after AND r.external_id <= v_hi
           AND r.deleted_at IS NULL AND r.written_by <> ALL (v_tokens)
           AND (p_partitions IS NULL OR r.partition = ANY (p_partitions))
           AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                            WHERE k.run_id = p_run_id AND k.table_name = p_table
                              AND k.external_id > p_after AND k.external_id <= v_hi
                              AND k.external_id = r.external_id);
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_unseen;
END
$$;


-- delete_connection_v2: delete_connection of 0002_queue_functions.sql under its versioned name,
-- the same body. Invariant: no sync is enqueued behind a purge, and a purge never runs beside a
-- sync of its connection.
CREATE FUNCTION delete_connection_v2(p_connection_id bigint, p_workspace_id bigint,
                                     p_max_attempts integer)
RETURNS SETOF connection_runs
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    conn connections;
    busy boolean;
BEGIN
    UPDATE connections
       SET status = 'deleting', next_run_at = NULL, updated_at = now()
     WHERE id = p_connection_id
       AND (p_workspace_id IS NULL OR workspace_id = p_workspace_id)
    RETURNING * INTO conn;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    UPDATE connection_runs
       SET status = 'cancelled', finished_at = now(),
           cancel_requested_at = coalesce(cancel_requested_at, now()),
           error = jsonb_build_object('kind', 'cancelled',
                                      'message', 'the connection was deleted')
     WHERE connection_id = p_connection_id AND kind = 'sync' AND status = 'queued';

    RETURN QUERY
        SELECT r.* FROM connection_runs r
         WHERE r.connection_id = p_connection_id AND r.kind = 'purge'
           AND r.status IN ('waiting', 'queued', 'running');
    IF FOUND THEN
        RETURN;
    END IF;

    busy := EXISTS (SELECT 1 FROM connection_runs
                     WHERE connection_id = p_connection_id AND status IN ('queued', 'running'));
    RETURN QUERY
        INSERT INTO connection_runs (connection_id, workspace_id, provider, kind, status,
                                     trigger, max_attempts)
        VALUES (conn.id, conn.workspace_id, conn.provider, 'purge',
                CASE WHEN busy THEN 'waiting' ELSE 'queued' END, 'delete', p_max_attempts)
        RETURNING *;
    PERFORM pg_notify(notify_channel(), 'enqueued');
END
$$;
