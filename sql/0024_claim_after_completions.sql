-- A lane's claim that first completes the attempts it ran since its last claim.
--
-- claim_jobs_v3: complete the attempts whose handlers returned (p_done_ids with their fencing
-- tokens p_done_owners), then claim as claim_jobs_v2 (0022_generic_job_claim.sql) does, in one
-- round trip and one commit. A lane that runs one short job at a time otherwise made two round
-- trips and two commits per job, the completion's on a thread of its own; see "Application
-- jobs one at a time" in docs/performance.md.
-- Invariants: each completion is fenced by job_fence_v1 (0023_job_and_ingestion_fences.sql),
-- exactly as complete_attempts in queues.sql (applied only while the attempt still holds its
-- job; a stale one completes nothing); the claim's invariants are claim_jobs_v2's (one claim
-- per job, a fencing token per attempt, an expired attempt taken back by the claim). A
-- completion is durable: claim_jobs_v2 lets a claim alone commit without waiting for its WAL
-- flush, and this function sets synchronous_commit back to what it was before whenever it
-- completed something, so the transaction commits as durably as a completion on its own did.
-- Returns the claimed jobs, like claim_jobs_v2.
--
-- Versioned like every function workers call (see "Upgrading" in docs/operations.md):
-- claim_jobs_v2 stays for workers of the release before, and is what this one calls.


CREATE FUNCTION claim_jobs_v3(p_done_ids bigint[], p_done_owners uuid[], p_queues text[],
                              p_limit integer, p_lease double precision, p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_durable text := current_setting('synchronous_commit');
BEGIN
    IF cardinality(p_done_ids) > 0 THEN
        WITH ended (id, lease_owner) AS (
            SELECT * FROM unnest(p_done_ids, p_done_owners)
        ), done AS (
            UPDATE jobs j
               SET status = 'completed', finished_at = coalesce(p_now, now()),
                   expires_at = NULL, deadline_at = NULL
              FROM ended e
             WHERE job_fence_v1(j, e.id, e.lease_owner, p_now)
            RETURNING j.id, j.attempts, j.queue, j.started_at, j.finished_at, j.lease_owner
        )
        INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome,
                                  lease_owner)
        SELECT id, attempts, queue, started_at, finished_at, 'completed', lease_owner
          FROM done;
    END IF;
    RETURN QUERY SELECT * FROM claim_jobs_v2(p_queues, p_limit, p_lease, p_now);
    IF cardinality(p_done_ids) > 0 THEN
        PERFORM set_config('synchronous_commit', v_durable, true);
    END IF;
END
$$;
