-- Workers that say which providers they can run, and the schema the repair commands need.
--
-- 1. Each worker start records its own incarnation (a fresh uuid) and the providers it has
--    installed. The claim takes that provider list: a worker never claims a sync it cannot run,
--    so a run of a provider no live worker has stays queued instead of failing.
-- 2. Deleting a workspace keeps its row (runs keep their workspace) and marks it deleted; its
--    name is free again.
-- 3. A run keeps the id of its connection after the connection is deleted (connection_id is set
--    NULL then, as before), so the history of a deleted connection can still be listed by id.

ALTER TABLE workers ADD COLUMN incarnation uuid;
-- NULL for a worker of an older version, which claims every provider.
ALTER TABLE workers ADD COLUMN providers text[];


ALTER TABLE workspaces ADD COLUMN deleted_at timestamptz;
ALTER TABLE workspaces DROP CONSTRAINT workspaces_name_key;
-- Names are unique among the workspaces that are not deleted.
CREATE UNIQUE INDEX workspaces_live_name ON workspaces (name) WHERE deleted_at IS NULL;


ALTER TABLE connection_runs ADD COLUMN deleted_connection_id bigint;
CREATE INDEX connection_runs_by_deleted_connection ON connection_runs (deleted_connection_id, id)
    WHERE deleted_connection_id IS NOT NULL;

-- Runs before the foreign key's ON DELETE SET NULL clears connection_id. The only path that
-- deletes a connection is its purge, so this runs once per connection, never on a hot path.
CREATE FUNCTION keep_deleted_connection_id() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE connection_runs SET deleted_connection_id = OLD.id WHERE connection_id = OLD.id;
    RETURN OLD;
END
$$;

CREATE TRIGGER connections_keep_run_history BEFORE DELETE ON connections
    FOR EACH ROW EXECUTE FUNCTION keep_deleted_connection_id();


-- claim_run and finish_and_claim gain the claiming worker's providers. Called with two (or
-- nine) arguments, as workers of the previous version do during a rolling upgrade, the list is
-- NULL and every provider is claimable, as before. The old signatures are dropped: an overload
-- beside them would make those calls ambiguous.
DROP FUNCTION finish_and_claim(bigint, uuid, text, jsonb, jsonb, bigint, boolean, text, interval);
DROP FUNCTION claim_run(text, interval);

-- claim_run: take the oldest claimable run, lock it and its workspace, and make it running under
-- a fresh fencing token. Claimable: queued and due; running with an expired lease; a waiting
-- purge whose connection has no queued/running run left; in each case only while the rate
-- budget the run draws on is not blocked, and, for a sync, only if its provider is among
-- p_providers (the connectors the claiming worker has installed; NULL: any). A purge needs no
-- connector, so any worker takes it.
-- Invariant: two runs of one lane never hold live leases at once. The candidate query filters by
-- the limiter, but its snapshot predates the workspace lock, so a run another claimer committed
-- meanwhile is invisible to it. Every claimer of a workspace holds that workspace's row lock until
-- it commits, so the re-check below (a new statement, a new snapshot, taken with the lock held)
-- sees every run claimed before ours.
-- FOR NO KEY UPDATE rather than FOR UPDATE: it excludes other claimers just the same, but does not
-- conflict with the KEY SHARE locks that foreign-key checks take (an enqueue inserting a run of
-- this workspace), so those never make a claimer skip a workspace.
CREATE FUNCTION claim_run(p_worker_id text, p_lease interval, p_providers text[] DEFAULT NULL)
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


-- finish_and_claim: finish_run(), then claim_run(), in one call: the worker loop's single round
-- trip between two runs. The finish commits with the claim; if nothing is claimable, `claimed`
-- is all NULL and the finish still stands. p_providers as for claim_run.
CREATE FUNCTION finish_and_claim(p_run_id bigint, p_lease_owner uuid, p_status text,
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
    sealed := finish_run(p_run_id, p_lease_owner, p_status, p_results, p_error,
                         p_processed_units, p_disconnect);
    SELECT * INTO v_next FROM claim_run(p_worker_id, p_lease, p_providers);
    claimed := v_next;
    RETURN NEXT;
END
$$;
