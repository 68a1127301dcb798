-- A job claim that is not planned again on every call.
--
-- claim_jobs_v2: claim_jobs_v1() (0010_application_queues.sql), the same statements, run with
-- plan_cache_mode = force_generic_plan. Postgres plans a function's statements with the call's
-- values ("custom" plans) until it judges a generic plan no dearer, and for this claim it kept
-- choosing custom ones: planning was about 0.7 ms of the 1.2 ms one claim of one job took,
-- more than every statement of it ran for. The generic plans walk the same partial indexes
-- (jobs_expiring, jobs_due) in the same order; tests/test_queues_postgres.py reads them at
-- 100,000 finished jobs. Invariants unchanged: a job is claimed by one claim (FOR UPDATE SKIP
-- LOCKED); each attempt gets a fencing token of its own; an expired attempt is taken back by the
-- claim, or dead-lettered with no attempt left.
--
-- Versioned like every function workers call (see "Upgrading" in docs/operations.md):
-- claim_jobs_v1 stays for workers of the release before.


CREATE FUNCTION claim_jobs_v2(p_queues text[], p_limit integer, p_lease double precision,
                              p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_ids bigint[];
BEGIN
    v_ids := ARRAY(
        SELECT j.id FROM jobs j
         WHERE j.status = 'active' AND j.origin_queue = ANY (p_queues) AND j.expires_at < v_now
         ORDER BY j.expires_at, j.id
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED);
    -- One queue (what a lane claims) walks jobs_due in order and stops at the limit, however
    -- long the backlog; several queues (tests, tools) take the oldest due among them.
    IF cardinality(v_ids) < p_limit AND cardinality(p_queues) = 1 THEN
        v_ids := v_ids || ARRAY(
            SELECT j.id FROM jobs j
             WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = p_queues[1]
               AND j.run_after <= v_now
             ORDER BY j.run_after, j.id
             LIMIT p_limit - cardinality(v_ids)
               FOR UPDATE SKIP LOCKED);
    ELSIF cardinality(v_ids) < p_limit THEN
        v_ids := v_ids || ARRAY(
            SELECT j.id FROM jobs j
             WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = ANY (p_queues)
               AND j.run_after <= v_now
             ORDER BY j.run_after, j.id
             LIMIT p_limit - cardinality(v_ids)
               FOR UPDATE SKIP LOCKED);
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;
    -- A claim need not wait for its WAL to reach the disk: a claim lost in a server crash
    -- leaves its jobs claimable again, exactly as a worker that died would. The attempt's end
    -- is committed durably, and its flush carries the claim along. A claim that dead-letters a
    -- job stays durable, since the on_dead hook it leads to must not run twice.
    IF NOT EXISTS (SELECT 1 FROM jobs j JOIN job_queues q ON q.name = j.origin_queue
                    WHERE j.id = ANY (v_ids) AND j.status = 'active'
                      AND j.attempts >= q.retry_limit + 1) THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;

    RETURN QUERY
    WITH picked AS (
        SELECT j.id, j.status = 'active' AS expired,
               j.status = 'active' AND j.attempts >= q.retry_limit + 1 AS spent,
               'the attempt outlived the queue''s expiry of ' || q.expire::text || ' s' AS why,
               q.expire, coalesce(q.dead_letter, q.name) AS grave
          FROM jobs j JOIN job_queues q ON q.name = j.origin_queue
         WHERE j.id = ANY (v_ids)
    ), taken_back AS (
        INSERT INTO job_attempts (job_id, attempt, queue, started_at, finished_at, outcome,
                                  error, lease_owner)
        SELECT j.id, j.attempts, j.queue, j.started_at, v_now, 'expired', p.why, j.lease_owner
          FROM picked p JOIN jobs j ON j.id = p.id
         WHERE p.expired
    ), updated AS (
        UPDATE jobs j
           SET status = CASE WHEN p.spent THEN 'dead' ELSE 'active' END,
               queue = CASE WHEN p.spent THEN p.grave ELSE j.queue END,
               attempts = CASE WHEN p.spent THEN j.attempts ELSE j.attempts + 1 END,
               started_at = CASE WHEN p.spent THEN j.started_at ELSE v_now END,
               finished_at = CASE WHEN p.spent THEN v_now END,
               expires_at = CASE WHEN p.spent THEN NULL
                                 ELSE v_now + make_interval(secs => least(p_lease, p.expire))
                            END,
               deadline_at = CASE WHEN p.spent THEN NULL
                                  ELSE v_now + make_interval(secs => p.expire) END,
               lease_owner = CASE WHEN p.spent THEN j.lease_owner ELSE gen_random_uuid() END,
               error = CASE WHEN p.expired THEN p.why ELSE j.error END
          FROM picked p
         WHERE j.id = p.id
        RETURNING j.*
    )
    SELECT * FROM updated ORDER BY updated.id;
END
$$;
