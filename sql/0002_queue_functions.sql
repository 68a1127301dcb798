-- Server-side functions for the three queue operations that need more than one statement to be
-- correct under concurrency, yet must cost one round trip. In a VOLATILE plpgsql function under
-- READ COMMITTED every statement takes a fresh snapshot: that is what closes the races below.

-- The channel workers LISTEN on; one per schema so two installations never wake each other.
CREATE FUNCTION notify_channel() RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT 'connector_sync_' || current_schema() $$;


-- enqueue_run: insert a queued sync run for an active connection, or return the run already
-- queued/running for it. Invariant: one queued/running run per connection however many callers
-- race (the partial unique index decides; the loop re-reads with a fresh snapshot, so a winner
-- that committed after our statement began is still returned).
-- FOR SHARE on the connection row serializes with delete_connection's status change, so no sync
-- can be enqueued behind a purge.
CREATE FUNCTION enqueue_run(p_connection_id bigint, p_workspace_id bigint, p_trigger text,
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
    RAISE EXCEPTION 'enqueue_run: connection % kept changing under ten attempts', p_connection_id;
END
$$;


-- claim_run: take the oldest claimable run, lock it and its workspace, and make it running under
-- a fresh fencing token. Claimable: queued and due; running with an expired lease; a waiting
-- purge whose connection has no queued/running run left; in each case only while the rate
-- budget the run draws on is not blocked.
-- Invariant: two runs of one lane never hold live leases at once. The candidate query filters by
-- the limiter, but its snapshot predates the workspace lock, so a run another claimer committed
-- meanwhile is invisible to it. Every claimer of a workspace holds that workspace's row lock until
-- it commits, so the re-check below (a new statement, a new snapshot, taken with the lock held)
-- sees every run claimed before ours.
-- FOR NO KEY UPDATE rather than FOR UPDATE: it excludes other claimers just the same, but does not
-- conflict with the KEY SHARE locks that foreign-key checks take (an enqueue inserting a run of
-- this workspace), so those never make a claimer skip a workspace.
CREATE FUNCTION claim_run(p_worker_id text, p_lease interval)
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


-- finish_run: seal a run with a terminal status, its results and error, close its attempt and,
-- with p_disconnect, mark its connection disconnected (credentials refused for good). Wakes idle
-- workers, since the lane it held is free. Invariant: fenced; a stale owner's finish matches
-- nothing and returns false.
CREATE FUNCTION finish_run(p_run_id bigint, p_lease_owner uuid, p_status text, p_results jsonb,
                           p_error jsonb, p_processed_units bigint, p_disconnect boolean)
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
     WHERE id = p_run_id AND lease_owner = p_lease_owner AND status = 'running'
       AND lease_expires_at > now()
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


-- finish_and_claim: finish_run(), then claim_run(), in one call: the worker loop's single round
-- trip between two runs. The finish commits with the claim; if nothing is claimable, `claimed`
-- is all NULL and the finish still stands.
CREATE FUNCTION finish_and_claim(p_run_id bigint, p_lease_owner uuid, p_status text,
                                 p_results jsonb, p_error jsonb, p_processed_units bigint,
                                 p_disconnect boolean, p_worker_id text, p_lease interval)
RETURNS TABLE (sealed boolean, claimed connection_runs)
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
AS $$
DECLARE
    v_next connection_runs;
BEGIN
    sealed := finish_run(p_run_id, p_lease_owner, p_status, p_results, p_error,
                         p_processed_units, p_disconnect);
    SELECT * INTO v_next FROM claim_run(p_worker_id, p_lease);
    claimed := v_next;
    RETURN NEXT;
END
$$;


-- tombstone_unseen: one bounded step of a full table's tombstone pass. It takes the next p_limit
-- stored rows of the table after p_after, in key order, and tombstones the live ones that this
-- attempt neither wrote (written_by) nor saw unchanged (an anti-join against run_seen_keys).
-- Invariants: fenced; bounded, so the run row is share-locked only briefly and lease renewals
-- interleave with a pass over millions of rows; linear, because nested loops are off for it: with
-- no statistics on run_seen_keys (scratch space, refilled by every run) the planner otherwise
-- picks a nested-loop anti-join that rescans every seen key for every stored row. The step that
-- reaches the end of the table stamps last_full_sync_at.
CREATE FUNCTION tombstone_unseen(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                                 p_table text, p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
-- The cost penalty that turns nested loops off would otherwise trip JIT compilation (0.4 s).
SET jit = off
AS $$
BEGIN
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH fence AS (
        SELECT r.id FROM connection_runs r
         WHERE r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
           AND r.lease_expires_at > now()
           FOR SHARE
    ), span AS (
        SELECT s.external_id FROM records s
         WHERE s.connection_id = p_connection_id AND s.table_name = p_table
           AND s.external_id > p_after
         ORDER BY s.external_id
         LIMIT p_limit
    ), bounds AS (
        SELECT max(span.external_id) AS hi, count(*) AS n FROM span
    ), gone AS (
        UPDATE records r
           SET deleted_at = now(), updated_at = now(), written_by = p_lease_owner
          FROM bounds
         WHERE r.connection_id = p_connection_id AND r.table_name = p_table
           AND r.external_id > p_after AND r.external_id <= bounds.hi
           AND r.deleted_at IS NULL AND r.written_by <> p_lease_owner
           AND EXISTS (SELECT 1 FROM fence)
           AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                            WHERE k.lease_owner = p_lease_owner AND k.table_name = p_table
                              AND k.external_id > p_after AND k.external_id <= bounds.hi
                              AND k.external_id = r.external_id)
        RETURNING 1
    ), stamped AS (
        INSERT INTO table_state (connection_id, table_name, last_full_sync_at)
        SELECT p_connection_id, p_table, now() FROM fence, bounds WHERE bounds.n < p_limit
        ON CONFLICT (connection_id, table_name) DO UPDATE
           SET last_full_sync_at = now(), updated_at = now()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM fence), (SELECT b.hi FROM bounds b),
           (SELECT b.n FROM bounds b), (SELECT count(*) FROM gone);
END
$$;


-- delete_connection: mark the connection deleting, cancel its queued sync, and insert the purge
-- run: waiting behind a sync that is still running, else queued. Returns the purge run (the one
-- already pending, when called twice). Each statement sees what the previous ones committed or
-- waited for: a claim racing the cancel makes the sync running, and the purge then waits for it.
CREATE FUNCTION delete_connection(p_connection_id bigint, p_workspace_id bigint,
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
