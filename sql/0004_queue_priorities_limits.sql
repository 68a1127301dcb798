-- Application queues: job priorities, a send that takes its priority, and fleet-wide limits per
-- queue (at most N active jobs; at most N starts per period), enforced by the claim. Runs with
-- search_path set to the target schema. See docs/queues.md.

-- A queue's default priority for the jobs sent without one, how many seconds of waiting one
-- priority level is worth (the rule that keeps a job from waiting forever behind better ones),
-- and its fleet-wide limits (NULL: none).
ALTER TABLE job_queues
    ADD COLUMN priority            smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    ADD COLUMN priority_step       double precision NOT NULL DEFAULT 60
                                   CHECK (priority_step > 0),
    ADD COLUMN global_concurrency  integer CHECK (global_concurrency > 0),
    ADD COLUMN rate_limit          integer CHECK (rate_limit > 0),
    ADD COLUMN rate_period         double precision CHECK (rate_period > 0),
    ADD CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

-- A job's priority (0 first, 9 last) and its place in the claim's order: claim_at is its due
-- time plus priority_step seconds per level, written by the trigger below whenever run_after
-- or priority is written, so every statement that queues a job (of this release or an older
-- one) keeps it right.
ALTER TABLE jobs
    ADD COLUMN priority  smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 9),
    ADD COLUMN claim_at  timestamptz;
-- A send that names no priority (NULL) gets its queue's default from the trigger.
ALTER TABLE jobs ALTER COLUMN priority DROP DEFAULT;
UPDATE jobs SET claim_at = run_after WHERE status IN ('queued', 'retrying');

-- The claim's walk: due waiting jobs of a queue in claim order. The order starts at run_after
-- (priority 0) or later, so the jobs not due yet that the walk passes over are those due
-- within priority_step × 9 seconds.
CREATE INDEX jobs_claim_order ON jobs (origin_queue, claim_at, id)
    WHERE status IN ('queued', 'retrying');

-- Starts of the jobs of rate-limited queues within their period (older ones are deleted by the
-- claim that finds them), counted by the claim.
CREATE TABLE job_starts (
    queue       text NOT NULL REFERENCES job_queues (name) ON DELETE CASCADE,
    started_at  timestamptz NOT NULL
);
CREATE INDEX job_starts_by_queue ON job_starts (queue, started_at);


-- job_claim_order_v1: a job's priority (its queue's default when the send named none) and its
-- claim order. Invariant: a waiting job's claim_at is run_after + priority × the queue's
-- priority_step, so the claim, walking claim_at, takes a job of priority p before one of
-- priority q > p unless that one became due more than (q − p) × priority_step earlier.
CREATE FUNCTION job_claim_order_v1() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_default smallint;
    v_step double precision;
BEGIN
    SELECT q.priority, q.priority_step INTO v_default, v_step
      FROM job_queues q WHERE q.name = NEW.origin_queue;
    NEW.priority := coalesce(NEW.priority, v_default, 0);
    NEW.claim_at := NEW.run_after + make_interval(secs => NEW.priority * coalesce(v_step, 60));
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_claim_order BEFORE INSERT OR UPDATE OF run_after, priority ON jobs
    FOR EACH ROW EXECUTE FUNCTION job_claim_order_v1();


-- send_job_v2: send_job_v1 with a priority (NULL: the queue's default). The same invariants:
-- one pending job per slot of an exclusive queue and one job per (queue, tick), however many
-- callers race, also inside a caller's open transaction: a second sender of a slot held by a
-- job not committed yet waits for that transaction, then returns its job (committed) or queues
-- its own (rolled back). A created job that is due now wakes the lanes of its queue (NOTIFY
-- 'job:<queue>', which Postgres delivers when the transaction commits, and never if it rolls
-- back).
CREATE FUNCTION send_job_v2(p_queue text, p_payload jsonb, p_key text, p_now timestamptz,
                            p_delay double precision, p_at timestamptz, p_tick timestamptz,
                            p_priority smallint, OUT job_id bigint, OUT outcome text)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := coalesce(p_now, now());
    v_policy text;
    v_slot text;
    v_run_after timestamptz;
BEGIN
    SELECT q.policy INTO v_policy FROM job_queues q WHERE q.name = p_queue;
    IF NOT FOUND THEN
        outcome := 'no_queue';
        RETURN;
    END IF;
    IF v_policy = 'standard' AND p_key IS NOT NULL THEN
        outcome := 'key_on_standard';
        RETURN;
    END IF;
    IF v_policy = 'exclusive' THEN
        v_slot := coalesce(p_key, '');
    END IF;
    v_run_after := greatest(coalesce(p_at, v_now + make_interval(secs => coalesce(p_delay, 0))),
                            v_now);
    FOR round IN 1..20 LOOP
        INSERT INTO jobs (queue, origin_queue, payload, key, slot, status, run_after,
                          created_at, tick, priority)
        VALUES (p_queue, p_queue, p_payload, p_key, v_slot, 'queued', v_run_after, v_now, p_tick,
                p_priority)
        ON CONFLICT DO NOTHING
        RETURNING id INTO job_id;
        IF FOUND THEN
            outcome := 'created';
            IF v_run_after <= v_now THEN
                PERFORM pg_notify(notify_channel(), 'job:' || p_queue);
            END IF;
            RETURN;
        END IF;
        IF p_tick IS NOT NULL THEN
            SELECT j.id INTO job_id FROM jobs j
             WHERE j.origin_queue = p_queue AND j.tick = p_tick;
            IF FOUND THEN
                outcome := 'existing';
                RETURN;
            END IF;
        END IF;
        IF v_slot IS NOT NULL THEN
            SELECT j.id INTO job_id FROM jobs j
             WHERE j.origin_queue = p_queue AND j.slot = v_slot
               AND j.status IN ('queued', 'retrying', 'active');
            IF FOUND THEN
                outcome := 'existing';
                RETURN;
            END IF;
        END IF;
        -- The holder finished between our two statements: try again.
    END LOOP;
    RAISE EXCEPTION 'send_job_v2: queue % kept changing under 20 tries', p_queue
        USING ERRCODE = '40001';
END
$$;


-- claim_jobs_v4: the job claim workers call. Start an attempt of up to p_limit jobs of the
-- served queues under a lease of p_lease seconds (never past the queue's expire): attempts past
-- their expiry first (taken back: recorded as expired and run again, or dead-lettered with no
-- attempt left, returned with status 'dead'), then due waiting jobs in claim order (claim_at:
-- priority first, and a job that has waited priority_step seconds per level goes before better
-- ones sent after it). Several queues (tests, tools) are claimed one after another, the queue
-- whose first job comes first before the others.
-- Invariants, claim_jobs_v3's:
-- * a job is claimed by one claim (FOR UPDATE SKIP LOCKED), and each attempt gets a fencing
--   token of its own (gen_random_uuid());
-- * a claim commits without waiting for its WAL flush (a claim lost in a crash leaves its jobs
--   claimable, as a dead worker does); one that dead-letters a job stays durable;
-- and the fleet-wide limits of a queue:
-- * at most global_concurrency attempts of the queue are active (unexpired) at once, and at
--   most rate_limit attempts start within any rate_period seconds, across every worker: the
--   claims of a limited queue take turns on its row (FOR NO KEY UPDATE, which a sender's
--   key-share lock does not wait for), and each counts, with a snapshot taken after its turn
--   came, what the claims before it started.
CREATE FUNCTION claim_jobs_v4(p_queues text[], p_limit integer, p_lease double precision,
                              p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
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
            RETURN QUERY SELECT * FROM claim_jobs_v4(ARRAY[v_queue], p_limit - v_taken, p_lease,
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
        -- The usual case: one UPDATE of the due jobs it locks.
        PERFORM set_config('synchronous_commit', 'off', true);
        RETURN QUERY
        WITH due AS (
            SELECT j.id FROM jobs j
             WHERE j.status IN ('queued', 'retrying') AND j.origin_queue = v_queue
               AND j.run_after <= v_now
             ORDER BY j.claim_at, j.id
             LIMIT v_limit
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
