-- Lane parking and targeted wake-ups.
--
-- 1. Parking. A lane is a workspace and a provider: the limiter lets one sync of a lane run at a
--    time. A queued sync whose lane is busy is marked `parked`, and the claim walks an index that
--    leaves parked runs out, so 10,000 runs queued behind one running sync cost a claim nothing.
--    The rules, each keeping one invariant (a lane that has a parked run also has a running sync
--    or an unparked queued sync, and the end of that run unparks the next one):
--    a. the claim of a sync parks the other queued syncs of its lane, in the transaction that
--       makes its run running (claim_run_v3);
--    b. a sync inserted queued while a sync of its lane is running is parked, with that running
--       run's row share-locked until the insert commits, so the running run cannot end unseen
--       (connection_runs_park_v3);
--    c. when a sync stops running, or an unparked queued sync ends without running, the oldest
--       parked run of its lane is unparked (connection_runs_unpark_v3, ..._unpark_deleted_v3);
--    d. a parked run that leaves `queued` is no longer parked (connection_runs_unpark_self_v3).
--    Parking only narrows the claim's walk: the limiter's check under the workspace lock is the
--    same as before, so the claim functions of earlier versions, which ignore `parked`, stay
--    correct beside these (a rolling upgrade runs both).
-- 2. Targeted wake-ups. An idle worker that listens is marked in `workers.idle_since` by its
--    empty claim; an enqueue or a finish that makes one run claimable notifies one such worker on
--    a channel of its own (worker_channel_v3) instead of every worker on the shared channel. With
--    no idle worker visible it falls back to the shared channel, so a worker going idle while
--    the notice is sent still hears it.

ALTER TABLE connection_runs ADD COLUMN parked boolean NOT NULL DEFAULT false;

-- The claim of claim_run_v3 walks this in (queued_at, id) order: parked runs are not in it.
CREATE INDEX connection_runs_claimable_unparked ON connection_runs (queued_at, id, lease_expires_at)
    WHERE status IN ('waiting', 'queued', 'running') AND NOT parked;

-- A lane's queued syncs: the claim parks the unparked ones, the end of a run unparks the oldest
-- parked one.
CREATE INDEX connection_runs_lane_queue
    ON connection_runs (workspace_id, provider, parked, queued_at, id)
    WHERE status = 'queued' AND kind = 'sync';

ALTER TABLE workers ADD COLUMN idle_since timestamptz;


-- Rule b. SKIP LOCKED: a running run whose row another transaction is writing (its finish, a
-- lease renewal) is not waited for; the new run then stays unparked, which is always safe (it
-- is walked, and the limiter holds it back).
CREATE FUNCTION park_if_lane_busy_v3() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM 1 FROM connection_runs o
     WHERE o.workspace_id = NEW.workspace_id AND o.provider = NEW.provider
       AND o.status = 'running' AND o.kind = 'sync'
     LIMIT 1
       FOR SHARE SKIP LOCKED;
    NEW.parked := FOUND;
    RETURN NEW;
END
$$;

CREATE TRIGGER connection_runs_park_v3 BEFORE INSERT ON connection_runs
    FOR EACH ROW WHEN (NEW.status = 'queued' AND NEW.kind = 'sync')
    EXECUTE FUNCTION park_if_lane_busy_v3();


-- Rule c. The head is locked before it is unparked: one that a concurrent statement cancels is
-- re-checked and passed over for the next, so the unpark never lands on a run that is gone.
CREATE FUNCTION unpark_lane_head_v3() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE connection_runs r SET parked = false
     WHERE r.id = (SELECT h.id FROM connection_runs h
                    WHERE h.workspace_id = OLD.workspace_id AND h.provider = OLD.provider
                      AND h.status = 'queued' AND h.kind = 'sync' AND h.parked
                    ORDER BY h.parked, h.queued_at, h.id
                    LIMIT 1
                      FOR NO KEY UPDATE);
    RETURN NULL;
END
$$;

CREATE TRIGGER connection_runs_unpark_v3 AFTER UPDATE OF status ON connection_runs
    FOR EACH ROW
    WHEN (OLD.kind = 'sync'
          AND ((OLD.status = 'running' AND NEW.status <> 'running')
               OR (OLD.status = 'queued' AND NOT OLD.parked
                   AND NEW.status NOT IN ('queued', 'running'))))
    EXECUTE FUNCTION unpark_lane_head_v3();

CREATE TRIGGER connection_runs_unpark_deleted_v3 AFTER DELETE ON connection_runs
    FOR EACH ROW
    WHEN (OLD.kind = 'sync'
          AND (OLD.status = 'running' OR (OLD.status = 'queued' AND NOT OLD.parked)))
    EXECUTE FUNCTION unpark_lane_head_v3();


-- Rule d. A claim of an earlier version may take a parked run; it must not stay parked while it
-- runs (a running run with an expired lease must stay in the claim's index).
CREATE FUNCTION unpark_self_v3() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    NEW.parked := false;
    RETURN NEW;
END
$$;

CREATE TRIGGER connection_runs_unpark_self_v3 BEFORE UPDATE OF status ON connection_runs
    FOR EACH ROW WHEN (NEW.parked AND NEW.status <> 'queued')
    EXECUTE FUNCTION unpark_self_v3();


-- The channel one worker listens on besides the shared one. Hashed: a channel name has at most
-- 63 bytes, a schema and a worker id may have more.
CREATE FUNCTION worker_channel_v3(p_worker_id text) RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT 'connector_sync_w_' || left(md5(current_schema() || '/' || p_worker_id), 24) $$;


-- wake_one_v3: one run of p_provider (NULL: a purge, any worker) became claimable. Notifies the
-- idle worker that has waited longest among those that can run it, and clears its mark so the
-- next wake-up goes to another. Invariant: no wake-up is lost. A worker marks itself idle in the
-- transaction of its empty claim, which this one may not see yet; with no idle worker visible
-- the notice goes to the shared channel, which every listening worker hears.
CREATE FUNCTION wake_one_v3(p_provider text) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_worker text;
BEGIN
    UPDATE workers w SET idle_since = NULL
     WHERE w.id = (SELECT i.id FROM workers i
                    WHERE i.idle_since IS NOT NULL AND i.stopped_at IS NULL
                      AND (p_provider IS NULL OR i.providers IS NULL
                           OR p_provider = ANY (i.providers))
                    ORDER BY i.idle_since
                    LIMIT 1
                      FOR NO KEY UPDATE SKIP LOCKED)
    RETURNING w.id INTO v_worker;
    IF FOUND THEN
        PERFORM pg_notify(worker_channel_v3(v_worker), 'run');
    ELSE
        PERFORM pg_notify(notify_channel(), 'enqueued');
    END IF;
END
$$;


-- enqueue_run_v3: enqueue_run() (0002_queue_functions.sql), waking one worker that can run the
-- new run, and none if it is parked (its lane is busy: no worker can take it now).
CREATE FUNCTION enqueue_run_v3(p_connection_id bigint, p_workspace_id bigint, p_trigger text,
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
            IF NOT created.parked THEN
                PERFORM wake_one_v3(created.provider);
            END IF;
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

        IF NOT EXISTS (SELECT 1 FROM connections c
                        WHERE c.id = p_connection_id
                          AND (p_workspace_id IS NULL OR c.workspace_id = p_workspace_id)
                          AND c.status = 'active') THEN
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'enqueue_run_v3: connection % kept changing under ten attempts', p_connection_id;
END
$$;


-- claim_run_v3: claim_run() (0005_worker_providers_and_repairs.sql) over the index of unparked
-- runs, parking the claimed sync's lane (rule a). p_wakeable: the claiming worker listens on its
-- own channel; an empty claim marks it idle for wake_one_v3, a claim clears the mark. The
-- limiter's invariant and its re-check under the workspace lock are claim_run()'s.
CREATE FUNCTION claim_run_v3(p_worker_id text, p_lease interval, p_providers text[] DEFAULT NULL,
                             p_wakeable boolean DEFAULT false)
RETURNS SETOF connection_runs
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
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
           AND NOT r.parked
           AND r.queued_at <= now()
           AND r.id <> ALL (passed)
           AND (r.kind = 'purge' OR p_providers IS NULL OR r.provider = ANY (p_providers))
           AND CASE r.status
                   WHEN 'queued' THEN true
                   WHEN 'running' THEN r.lease_expires_at <= now()
                   ELSE r.kind = 'purge' AND NOT EXISTS (
                            SELECT 1 FROM connection_runs o
                             WHERE o.connection_id = r.connection_id
                               AND o.status IN ('queued', 'running'))
               END
           AND (r.budget_key IS NULL OR NOT EXISTS (
                   SELECT 1 FROM rate_budgets b
                    WHERE b.key = r.budget_key AND b.blocked_until > now()))
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
            IF p_wakeable THEN
                UPDATE workers SET idle_since = now()
                 WHERE id = p_worker_id AND idle_since IS NULL;
            END IF;
            RETURN;
        END IF;

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
        INSERT INTO run_attempts (run_id, attempt, lease_owner, worker_id, started_at)
        VALUES (candidate.id, candidate.attempts + 1, token, p_worker_id, clock_timestamp());

        -- Rule a: the rest of this lane waits, out of every claim's walk. SKIP LOCKED: a run
        -- another transaction holds stays unparked (safe; it is walked).
        IF candidate.kind = 'sync' THEN
            UPDATE connection_runs q SET parked = true
             WHERE q.id IN (SELECT l.id FROM connection_runs l
                             WHERE l.workspace_id = candidate.workspace_id
                               AND l.provider = candidate.provider
                               AND l.status = 'queued' AND l.kind = 'sync' AND NOT l.parked
                               AND l.id <> candidate.id
                               FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
        IF p_wakeable THEN
            UPDATE workers SET idle_since = NULL
             WHERE id = p_worker_id AND idle_since IS NOT NULL;
        END IF;

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


-- wake_for_freed_lane_v3: the run p_run_id (of this lane) just ended. Wakes one worker if that
-- made a run claimable that is still unclaimed: the lane's oldest unparked due sync (rule c
-- unparked it), a purge of the workspace or of the connection waiting for this run. Nothing
-- else became claimable, so nobody else is woken.
CREATE FUNCTION wake_for_freed_lane_v3(p_workspace_id bigint, p_provider text, p_kind text,
                                       p_connection_id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_kind = 'purge' THEN
        -- A purge held its whole workspace; purges are rare, so no search for what it held.
        PERFORM wake_one_v3(NULL);
    ELSIF EXISTS (SELECT 1 FROM connection_runs r
                   WHERE r.workspace_id = p_workspace_id AND r.provider = p_provider
                     AND r.status = 'queued' AND r.kind = 'sync' AND NOT r.parked
                     AND r.queued_at <= now()) THEN
        PERFORM wake_one_v3(p_provider);
    ELSIF EXISTS (SELECT 1 FROM connection_runs r
                   WHERE r.connection_id = p_connection_id AND r.kind = 'purge'
                     AND r.status = 'waiting') THEN
        PERFORM wake_one_v3(NULL);
    END IF;
END
$$;


-- finish_run_v3: finish_run() (0002_queue_functions.sql) with the wake-up of
-- wake_for_freed_lane_v3 instead of every idle worker. p_wake: false when the caller claims next
-- in the same transaction (finish_and_claim_v3), which wakes after its claim. Fenced by
-- run_fence_v1 (0012_fence_and_versions.sql), as finish_run_v2(): a stale owner's finish
-- matches nothing and returns NULL.
CREATE FUNCTION finish_run_v3(p_run_id bigint, p_lease_owner uuid, p_status text, p_results jsonb,
                              p_error jsonb, p_processed_units bigint, p_disconnect boolean,
                              p_wake boolean DEFAULT true)
RETURNS connection_runs
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_run connection_runs;
BEGIN
    UPDATE connection_runs
       SET status = p_status, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
           results = p_results, error = p_error,
           processed_units = coalesce(p_processed_units, processed_units)
     WHERE run_fence_v1(connection_runs, p_run_id, p_lease_owner)
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE run_attempts
       SET finished_at = clock_timestamp(), outcome = p_status, error = p_error,
           results = p_results
     WHERE lease_owner = p_lease_owner;
    IF p_disconnect THEN
        UPDATE connections SET status = 'disconnected', updated_at = now()
         WHERE id = v_run.connection_id AND status = 'active';
    END IF;
    IF p_wake THEN
        PERFORM wake_for_freed_lane_v3(v_run.workspace_id, v_run.provider, v_run.kind,
                                       v_run.connection_id);
    END IF;
    RETURN v_run;
END
$$;


-- finish_and_claim_v3: finish_run_v3(), then claim_run_v3(), in one call, then the wake-up for
-- the finished run's lane: after the claim, so a run this worker took itself wakes nobody.
CREATE FUNCTION finish_and_claim_v3(p_run_id bigint, p_lease_owner uuid, p_status text,
                                    p_results jsonb, p_error jsonb, p_processed_units bigint,
                                    p_disconnect boolean, p_worker_id text, p_lease interval,
                                    p_providers text[] DEFAULT NULL,
                                    p_wakeable boolean DEFAULT false)
RETURNS TABLE (sealed boolean, claimed connection_runs)
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
AS $$
DECLARE
    v_done connection_runs;
    v_next connection_runs;
BEGIN
    v_done := finish_run_v3(p_run_id, p_lease_owner, p_status, p_results, p_error,
                            p_processed_units, p_disconnect, false);
    sealed := v_done.id IS NOT NULL;
    SELECT * INTO v_next FROM claim_run_v3(p_worker_id, p_lease, p_providers, p_wakeable);
    IF sealed THEN
        PERFORM wake_for_freed_lane_v3(v_done.workspace_id, v_done.provider, v_done.kind,
                                       v_done.connection_id);
    END IF;
    claimed := v_next;
    RETURN NEXT;
END
$$;
