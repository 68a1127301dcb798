-- The application queues: queues as rows (like pg-boss's createQueue), their jobs, the attempts
-- that ended, and cron schedules; the functions workers call carry a version in their name, so
-- workers of two releases can run side by side during a deploy. The statements that are one
-- statement each live in sql/queues.sql.

CREATE TABLE job_queues (
    name           text PRIMARY KEY,
    policy         text NOT NULL CHECK (policy IN ('standard', 'exclusive')),
    retry_limit    integer NOT NULL CHECK (retry_limit >= 0),
    retry_delay    double precision NOT NULL CHECK (retry_delay > 0),
    retry_ceiling  double precision NOT NULL CHECK (retry_ceiling >= retry_delay),
    expire         double precision NOT NULL CHECK (expire > 0),
    -- Deleting a queue that is another's dead-letter queue is refused by this key.
    dead_letter    text REFERENCES job_queues (name),
    retention      double precision NOT NULL CHECK (retention > 0),
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK (dead_letter IS DISTINCT FROM name)
);

CREATE TABLE jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Where the job is now: the queue it was sent to, or its dead-letter queue once dead.
    queue            text NOT NULL REFERENCES job_queues (name),
    -- The queue it was sent to: whose handler runs it, where a redrive sends it back.
    origin_queue     text NOT NULL,
    payload          jsonb NOT NULL,
    key              text,
    -- The singleton slot of an exclusive queue's job (its key, or '' without one); NULL on a
    -- standard queue. The partial unique index below admits one pending job per slot.
    slot             text,
    status           text NOT NULL CHECK (status IN ('queued', 'active', 'retrying', 'completed',
                                                     'dead', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    run_after        timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    -- While active: when a claim may take the attempt back. The lease keeper renews it at a
    -- third of its length, never past deadline_at (the start plus the queue's expire).
    expires_at       timestamptz,
    deadline_at      timestamptz,
    -- The running (or last) attempt's fencing token: every write of an attempt names it.
    lease_owner      uuid,
    error            text,
    -- The cron tick that sent it, if a schedule did.
    tick             timestamptz,
    processed_units  bigint,
    total_units      bigint
);

-- Exclusive queues: one pending job per singleton slot. A duplicate send conflicts here and
-- returns the job that holds the slot.
CREATE UNIQUE INDEX jobs_singleton ON jobs (origin_queue, slot)
    WHERE status IN ('queued', 'retrying', 'active');
-- Cron: a tick of a queue's schedule makes one job however many workers fire it.
CREATE UNIQUE INDEX jobs_tick ON jobs (origin_queue, tick) WHERE tick IS NOT NULL;
-- The claim's two reads: due waiting jobs of the served queues, oldest first, and active
-- attempts past their expiry. Finished jobs are in neither, so the claim stays fast however
-- many of them retention keeps.
CREATE INDEX jobs_due ON jobs (origin_queue, run_after, id)
    WHERE status IN ('queued', 'retrying');
CREATE INDEX jobs_expiring ON jobs (origin_queue, expires_at) WHERE status = 'active';
-- Reading a queue's jobs, newest first; figures per queue; retention.
CREATE INDEX jobs_by_queue ON jobs (queue, id);
CREATE INDEX jobs_finished ON jobs (queue, finished_at)
    WHERE status IN ('completed', 'dead', 'cancelled');

-- The attempts that ended; a running attempt is read from its job's row.
CREATE TABLE job_attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       bigint NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    queue        text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN ('completed', 'failed', 'expired', 'cancelled')),
    error        text,
    lease_owner  uuid
);

CREATE INDEX job_attempts_by_job ON job_attempts (job_id, id);

CREATE TABLE job_schedules (
    queue       text PRIMARY KEY REFERENCES job_queues (name) ON DELETE CASCADE,
    cron        text NOT NULL,
    payload     jsonb NOT NULL,
    -- The first tick not fired yet; firing moves it past now with a compare-and-set.
    next_tick   timestamptz NOT NULL,
    last_tick   timestamptz,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- What a worker runs of the application queues: {queue: lanes}; NULL for none.
ALTER TABLE workers ADD COLUMN lanes jsonb;


-- send_job_v1: queue a job, or return the pending job that holds its singleton slot (or its
-- cron tick). Invariant: one pending job per slot of an exclusive queue and one job per
-- (queue, tick), however many callers race: the unique indexes decide, and the loop re-reads
-- with a fresh snapshot, so a winner that committed after our insert began is still returned.
-- outcome: 'created', 'existing', 'no_queue' or 'key_on_standard'. A created job that is due
-- now wakes the lanes of its queue (NOTIFY 'job:<queue>').
CREATE FUNCTION send_job_v1(p_queue text, p_payload jsonb, p_key text, p_now timestamptz,
                            p_delay double precision, p_at timestamptz, p_tick timestamptz,
                            OUT job_id bigint, OUT outcome text)
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
                          created_at, tick)
        VALUES (p_queue, p_queue, p_payload, p_key, v_slot, 'queued', v_run_after, v_now, p_tick)
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
    RAISE EXCEPTION 'send_job_v1: queue % kept changing under 20 tries', p_queue
        USING ERRCODE = '40001';
END
$$;


-- claim_jobs_v1: start an attempt of up to p_limit due jobs of the served queues, under a lease
-- of p_lease seconds (never past the queue's expire). Invariants: a job is claimed by one
-- claim (FOR UPDATE SKIP LOCKED); each attempt gets a fencing token of its own (lease_owner);
-- an active attempt past its expiry is taken back here, with no sweep of its own: it is
-- recorded as expired and run again by this claim, or, with no attempt left, dead-lettered
-- (returned with status 'dead', for the caller to call the on_dead hook once). Expired
-- attempts are taken first, then due queued and retrying jobs, the longest waiting first.
CREATE FUNCTION claim_jobs_v1(p_queues text[], p_limit integer, p_lease double precision,
                              p_now timestamptz)
RETURNS SETOF jobs
LANGUAGE plpgsql
SET search_path FROM CURRENT
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


-- fire_schedule_v1: fire one tick of a queue's schedule, seen by the caller with next_tick
-- p_expected. Invariant: a tick fires once across all workers, with no leader: the
-- compare-and-set on next_tick lets one caller through (the others match nothing once it
-- commits), and the unique (queue, tick) index makes a second job for the tick impossible
-- anyway. On an exclusive queue whose slot is held, nothing is sent (a sweep never stacks).
-- Returns the new job's id, or NULL when this caller sent nothing.
CREATE FUNCTION fire_schedule_v1(p_queue text, p_expected timestamptz, p_tick timestamptz,
                                 p_next timestamptz, p_now timestamptz)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_payload jsonb;
    v_sent record;
BEGIN
    UPDATE job_schedules s
       SET next_tick = p_next, last_tick = p_tick, updated_at = now()
     WHERE s.queue = p_queue AND s.next_tick = p_expected
    RETURNING s.payload INTO v_payload;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT * INTO v_sent FROM send_job_v1(p_queue, v_payload, NULL, p_now, NULL, NULL, p_tick);
    IF v_sent.outcome = 'created' THEN
        RETURN v_sent.job_id;
    END IF;
    RETURN NULL;
END
$$;
