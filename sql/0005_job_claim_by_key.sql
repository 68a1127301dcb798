-- Application queues: the claim's plan no longer grows with the jobs table. Runs with
-- search_path set to the target schema. See docs/queues.md.

-- claim_jobs_v5: the job claim workers call; claim_jobs_v4 (0004) with the same arguments,
-- result and invariants (one claim per job, a fencing token per attempt, expired attempts taken
-- back first, claim order, fleet-wide limits). It differs in its plan only: the due jobs it locks
-- are updated by primary key, so a claim of one job or of a batch reads as many jobs as it takes
-- however large the backlog the statistics know of. Every statement in it has an index to take,
-- and none may read the jobs table whole: enable_seqscan = off keeps a small table (a few
-- thousand jobs, statistics not taken yet) from being scanned whole at each claim too.
CREATE FUNCTION claim_jobs_v5(p_queues text[], p_limit integer, p_lease double precision,
                              p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_queue text := p_queues[1];
    v_limit integer := p_limit;
    v_limits record;
    v_ids bigint[];
    v_started integer;
    v_taken integer := 0;
BEGIN
    IF cardinality(p_queues) > 1 THEN
        FOR v_queue IN
            SELECT s.name FROM unnest(p_queues) AS s(name)
              LEFT JOIN LATERAL (
                SELECT true AS expired FROM jobs j
                 WHERE j.status = 'active' AND j.origin_queue = s.name AND j.expires_at < v_now
                 LIMIT 1) e ON true
              LEFT JOIN LATERAL (
                SELECT j.claim_at, j.id FROM jobs j
                 WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = s.name
                   AND j.run_after <= v_now
                 ORDER BY j.claim_at, j.id LIMIT 1) d ON true
             WHERE e.expired OR d.id IS NOT NULL
             ORDER BY e.expired IS NOT TRUE, d.claim_at, d.id
        LOOP
            RETURN QUERY SELECT * FROM claim_jobs_v5(ARRAY[v_queue], p_limit - v_taken, p_lease,
                                                     p_now);
            GET DIAGNOSTICS v_started = ROW_COUNT;
            v_taken := v_taken + v_started;
            EXIT WHEN v_taken >= p_limit;
        END LOOP;
        RETURN;
    END IF;

    SELECT q.global_concurrency, q.rate_limit, q.rate_period INTO v_limits
      FROM job_queues q WHERE q.name = v_queue;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_limits.global_concurrency IS NOT NULL OR v_limits.rate_limit IS NOT NULL THEN
        PERFORM 1 FROM job_queues q WHERE q.name = v_queue FOR NO KEY UPDATE;
        IF v_limits.global_concurrency IS NOT NULL THEN
            v_limit := least(v_limit, v_limits.global_concurrency - (
                SELECT count(*) FROM jobs j
                 WHERE j.status = 'active' AND j.origin_queue = v_queue
                   AND j.expires_at >= v_now)::integer);
        END IF;
        IF v_limits.rate_limit IS NOT NULL THEN
            DELETE FROM job_starts s
             WHERE s.queue = v_queue
               AND s.started_at <= v_now - make_interval(secs => v_limits.rate_period);
            v_limit := least(v_limit, v_limits.rate_limit - (
                SELECT count(*) FROM job_starts s WHERE s.queue = v_queue)::integer);
        END IF;
        IF v_limit <= 0 THEN
            RETURN;
        END IF;
    END IF;

    IF NOT EXISTS (SELECT 1 FROM jobs j
                    WHERE j.status = 'active' AND j.origin_queue = v_queue
                      AND j.expires_at < v_now) THEN
        -- The usual case: lock the due jobs, then one UPDATE of them by primary key. The ids
        -- go through an array, which a generic plan expects to be short: joined to the jobs
        -- as a subquery with a LIMIT of unknown size, they were expected to be a tenth of the
        -- backlog, and the plan hashed the whole table at every claim.
        v_ids := ARRAY(
            SELECT j.id FROM jobs j
             WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = v_queue
               AND j.run_after <= v_now
             ORDER BY j.claim_at, j.id
             LIMIT v_limit
               FOR UPDATE SKIP LOCKED);
        IF cardinality(v_ids) = 0 THEN
            RETURN;
        END IF;
        PERFORM set_config('synchronous_commit', 'off', true);
        RETURN QUERY
        WITH started AS (
            UPDATE jobs j
               SET status = 'active', attempts = j.attempts + 1, started_at = v_now,
                   finished_at = NULL,
                   expires_at = v_now + make_interval(secs => least(p_lease, q.expire)),
                   deadline_at = v_now + make_interval(secs => q.expire),
                   lease_owner = gen_random_uuid()
              FROM job_queues q
             WHERE j.id = ANY (v_ids) AND q.name = j.origin_queue
            RETURNING j.*
        )
        SELECT * FROM started ORDER BY started.claim_at, started.id;
    ELSE
        v_ids := ARRAY(
            SELECT j.id FROM jobs j
             WHERE j.status = 'active' AND j.origin_queue = v_queue AND j.expires_at < v_now
             ORDER BY j.expires_at, j.id
             LIMIT v_limit
               FOR UPDATE SKIP LOCKED);
        IF cardinality(v_ids) < v_limit THEN
            v_ids := v_ids || ARRAY(
                SELECT j.id FROM jobs j
                 WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = v_queue
                   AND j.run_after <= v_now
                 ORDER BY j.claim_at, j.id
                 LIMIT v_limit - cardinality(v_ids)
                   FOR UPDATE SKIP LOCKED);
        END IF;
        IF cardinality(v_ids) = 0 THEN
            RETURN;
        END IF;
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
            SELECT j.id, j.attempts, j.queue, j.started_at, v_now, 'expired', p.why,
                   j.lease_owner
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
        SELECT * FROM updated ORDER BY updated.status = 'dead', updated.claim_at, updated.id;
    END IF;
    GET DIAGNOSTICS v_started = ROW_COUNT;
    IF v_limits.rate_limit IS NOT NULL AND v_started > 0 THEN
        INSERT INTO job_starts (queue, started_at)
        SELECT v_queue, v_now FROM generate_series(1, v_started);
    END IF;
END
$$;
