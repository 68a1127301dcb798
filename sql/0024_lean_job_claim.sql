-- A job claim that takes the common case in one UPDATE.
--
-- claim_jobs_v3: when no attempt of the one queue claimed is past its expiry (the usual case:
-- the partial index jobs_expiring answers from its first entry), the claim is one UPDATE of
-- the due jobs it locks; otherwise, and for a claim of several queues, it is claim_jobs_v2
-- (0022_generic_job_claim.sql), which also takes expired attempts back. claim_jobs_v2 runs
-- four statements (the expired attempts, the due jobs, the dead-letter check, the update) for
-- every claim; a claim of one job cost about twice the single UPDATE (see "Application jobs"
-- in docs/performance.md).
--
-- Invariants, the same as claim_jobs_v2's:
-- * a job is claimed by one claim (FOR UPDATE SKIP LOCKED, on either path), and each attempt
--   gets a fencing token of its own (gen_random_uuid());
-- * an attempt past its expiry is taken back by a claim: by this one when it sees one (through
--   claim_jobs_v2), and one that expires while this claim runs by the next claim;
-- * a claim commits without waiting for its WAL flush (a claim lost in a crash leaves its jobs
--   claimable, as a dead worker does); one that dead-letters a job (claim_jobs_v2 only) stays
--   durable.
--
-- Versioned like every function workers call (see "Upgrading" in docs/operations.md):
-- claim_jobs_v2 stays for workers of the release before, and is what this one falls back on.


CREATE FUNCTION claim_jobs_v3(p_queues text[], p_limit integer, p_lease double precision,
                              p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
BEGIN
    IF cardinality(p_queues) <> 1 OR EXISTS (
            SELECT 1 FROM jobs j
             WHERE j.status = 'active' AND j.origin_queue = ANY (p_queues)
               AND j.expires_at < v_now) THEN
        RETURN QUERY SELECT * FROM claim_jobs_v2(p_queues, p_limit, p_lease, p_now);
        RETURN;
    END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN QUERY
    WITH due AS (
        SELECT j.id FROM jobs j
         WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = p_queues[1]
           AND j.run_after <= v_now
         ORDER BY j.run_after, j.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), started AS (
        UPDATE jobs j
           SET status = 'active', attempts = j.attempts + 1, started_at = v_now,
               finished_at = NULL,
               expires_at = v_now + make_interval(secs => least(p_lease, q.expire)),
               deadline_at = v_now + make_interval(secs => q.expire),
               lease_owner = gen_random_uuid()
          FROM due, job_queues q
         WHERE j.id = due.id AND q.name = j.origin_queue
        RETURNING j.*
    )
    SELECT * FROM started ORDER BY started.id;
END
$$;
