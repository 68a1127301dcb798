-- The baseline: the whole schema of connector-sync 0.1.0, in one migration. Later releases add
-- numbered migrations after it (0002_...), each applied once, in order, by
-- `connector-sync migrate`, and none of them edits this file or an earlier one.
--
-- Runs with search_path set to the target schema, so no name below is schema-qualified.
--
-- Sections: 1. workspaces and connections; 2. runs, their attempts, checkpoints and seen keys;
-- 3. workers; 4. records, table state, rate budgets and the ETag cache; 5. maintenance;
-- 6. the run queue's functions; 7. the end of a table (tombstones); 8. documents;
-- 9. ingestions; 10. application queues.
--
-- The functions workers and the API call carry a version in their name (claim_run_v3,
-- send_job_v1, ...). A later release never replaces, alters or drops a version that a release
-- it supports calls: it adds the next version beside it (see "Upgrading" in
-- docs/operations.md). A name keeps its number (the numbers do not count from 1), and the next
-- version of a function takes the next one.


-- 1. Workspaces and connections ----------------------------------------------------------------

CREATE TABLE workspaces (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL CHECK (name <> ''),
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- A deleted workspace keeps its row (its runs keep their workspace); its name is free again.
    deleted_at  timestamptz
);

-- Names are unique among the workspaces that are not deleted.
CREATE UNIQUE INDEX workspaces_live_name ON workspaces (name) WHERE deleted_at IS NULL;

CREATE TABLE connections (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id    bigint NOT NULL REFERENCES workspaces (id),
    name            text NOT NULL CHECK (name <> ''),
    provider        text NOT NULL,
    config          jsonb NOT NULL DEFAULT '{}',
    -- A Fernet token (see sync/base/secrets.py); plaintext credentials never reach the database.
    credentials     bytea,
    status          text NOT NULL DEFAULT 'active'
                    CHECK (status IN ('active', 'paused', 'disconnected', 'deleting')),
    -- A hash of the rate budget the connector says this connection draws on (see rate_budgets).
    budget_key      text,
    schedule_every  interval CHECK (schedule_every > interval '0'),
    next_run_at     timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, name)
);

-- The scheduler's scan: only active connections with a schedule are in it.
CREATE INDEX connections_due ON connections (next_run_at)
    WHERE status = 'active' AND next_run_at IS NOT NULL;


-- 2. Runs, their attempts, checkpoints and seen keys -------------------------------------------

CREATE TABLE connection_runs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Runs outlive their connection so history stays readable.
    connection_id        bigint REFERENCES connections (id) ON DELETE SET NULL,
    workspace_id         bigint NOT NULL REFERENCES workspaces (id),
    provider             text NOT NULL,
    budget_key           text,
    kind                 text NOT NULL DEFAULT 'sync' CHECK (kind IN ('sync', 'purge')),
    status               text NOT NULL
                         CHECK (status IN ('waiting', 'queued', 'running', 'succeeded',
                                           'partial', 'failed', 'cancelled')),
    trigger              text NOT NULL DEFAULT 'manual',
    attempts             integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts         integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    -- When the run may next be claimed: it orders the claim, and a retry, a hand-back and
    -- `runs retry` move it (first_queued_at below never moves).
    queued_at            timestamptz NOT NULL DEFAULT now(),
    started_at           timestamptz,
    finished_at          timestamptz,
    -- The fencing token: a fresh uuid per claim, so a stale attempt never matches the next one.
    lease_owner          uuid,
    lease_expires_at     timestamptz,
    worker_id            text,
    cancel_requested_at  timestamptz,
    results              jsonb NOT NULL DEFAULT '{}',
    error                jsonb,
    processed_units      bigint NOT NULL DEFAULT 0,
    total_units          bigint,
    -- Waits for a provider's rate limit: they spend no attempt, and are counted on the run.
    waits                integer NOT NULL DEFAULT 0,
    waiting_for          text,
    waiting_until        timestamptz,
    -- Where the run is now: table k of n, its partition, page, records read and total.
    progress             jsonb,
    -- The id of the run's connection once that connection is deleted (connection_id is NULL
    -- then), so the history of a deleted connection can still be listed by id.
    deleted_connection_id  bigint,
    -- A queued sync whose lane (workspace and provider) is busy: left out of the claim's walk
    -- (see "Lane parking" in section 6).
    parked               boolean NOT NULL DEFAULT false,
    -- When the run was first queued, so `runs show` can say both when a run was asked for and
    -- when its next attempt is due. Readers take the earliest time recorded of a run without it.
    first_queued_at      timestamptz DEFAULT now(),
    CHECK (attempts <= max_attempts),
    CHECK ((status = 'running') = (lease_owner IS NOT NULL)),
    CHECK ((status = 'running') = (lease_expires_at IS NOT NULL))
);

-- The queue's rows churn (queued, running, finished); vacuum it by the thousand, not at the
-- default 20 % of a table that keeps all history, so the claim's partial index never carries
-- hundreds of thousands of dead entries.
ALTER TABLE connection_runs SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 5000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 5000
);

-- At most one queued/running run per connection: makes enqueue idempotent.
CREATE UNIQUE INDEX connection_runs_one_active ON connection_runs (connection_id)
    WHERE status IN ('queued', 'running');

-- At most one pending purge per connection.
CREATE UNIQUE INDEX connection_runs_one_pending_purge ON connection_runs (connection_id)
    WHERE kind = 'purge' AND status IN ('waiting', 'queued', 'running');

-- The runs that are not finished, in (queued_at, id) order: finished runs are not in it, so a
-- walk of it costs the same however much history accumulates.
CREATE INDEX connection_runs_claimable ON connection_runs (queued_at, id, lease_expires_at)
    WHERE status IN ('waiting', 'queued', 'running');

-- The index claim_run_v3 walks in (queued_at, id) order: parked runs are not in it either, so
-- runs queued behind a busy lane cost the claim nothing.
CREATE INDEX connection_runs_claimable_unparked ON connection_runs (queued_at, id, lease_expires_at)
    WHERE status IN ('waiting', 'queued', 'running') AND NOT parked;

-- The limiter's lookup of live runs in a workspace; only running rows are in it.
CREATE INDEX connection_runs_running_lane ON connection_runs (workspace_id, provider)
    WHERE status = 'running';

-- A lane's queued syncs: the claim parks the unparked ones, the end of a run unparks the oldest
-- parked one.
CREATE INDEX connection_runs_lane_queue
    ON connection_runs (workspace_id, provider, parked, queued_at, id)
    WHERE status = 'queued' AND kind = 'sync';

-- Listing a connection's history, and a deleted connection's.
CREATE INDEX connection_runs_by_connection ON connection_runs (connection_id, id);
CREATE INDEX connection_runs_by_deleted_connection ON connection_runs (deleted_connection_id, id)
    WHERE deleted_connection_id IS NOT NULL;

-- Finished runs in (finished_at, id) order: the retention pass walks the runs that finished
-- before its cutoff by keyset, once per pass, passing the newest runs of each connection that
-- it keeps without reading them again; /metrics counts the runs that finished in its window.
CREATE INDEX connection_runs_retention ON connection_runs (finished_at, id)
    WHERE finished_at IS NOT NULL;

-- The dead letters: runs that failed for good and wait for an operator's retry, counted by
-- /metrics on every scrape without reading the rest of the history.
CREATE INDEX connection_runs_dead_letters ON connection_runs (kind, provider)
    WHERE status = 'failed';

CREATE TABLE run_attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id       bigint NOT NULL REFERENCES connection_runs (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    lease_owner  uuid NOT NULL UNIQUE,
    worker_id    text NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    -- NULL while the attempt runs; then succeeded | partial | failed | cancelled | retry |
    -- lost (its lease expired and the run was claimed again) | handed_back (graceful shutdown).
    outcome      text,
    error        jsonb,
    results      jsonb,
    -- An attempt that ended waiting says for what and until when.
    waiting_for  text,
    waiting_until  timestamptz,
    -- The lease it last held, as each renewal extends it: an attempt whose worker died held its
    -- run until then, however much later a claim took the run over (and recorded its end).
    lease_expires_at  timestamptz
);

CREATE INDEX run_attempts_by_run ON run_attempts (run_id, id);

-- Where each table of a run got to, per partition ('' for a table without partitions). Saved in
-- the transaction of the batch it follows (write_record_batch), so a position is never ahead of
-- the records it covers. A later attempt of the same run resumes every slice that is not done
-- from its position. Deleted with the run. See "Resuming a run" in docs/architecture.md.
CREATE TABLE run_checkpoints (
    run_id      bigint NOT NULL REFERENCES connection_runs (id) ON DELETE CASCADE,
    table_name  text NOT NULL,
    partition   text NOT NULL DEFAULT '',
    -- What the connector yielded as its read position (a next link, a page number...); NULL:
    -- from the start.
    position    jsonb,
    -- Read to its end in this run.
    done        boolean NOT NULL DEFAULT false,
    -- The read lists the whole slice (a full table, or an incremental one after Resync): rows it
    -- did not see are tombstoned once the table is done.
    resync      boolean NOT NULL DEFAULT false,
    pages       integer NOT NULL DEFAULT 0,
    records     bigint NOT NULL DEFAULT 0,
    -- As many records as the provider said the slice holds, when it says.
    total       bigint,
    -- How many keys this run put in run_seen_keys for the slice. run_seen_keys is unlogged: a
    -- crash restart of Postgres empties it, and a count short of this one says so.
    seen        bigint NOT NULL DEFAULT 0,
    -- The attempt (run_attempts.id) whose read of the slice this is. Rows written by it and by
    -- the attempts after it were read in this run; rows an earlier attempt wrote before the
    -- slice started over were not.
    first_attempt  bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    -- The provider's total of the slice was an estimate (GitHub's last page number times the
    -- page size is an upper bound): shown as one, and replaced by the records read once the
    -- slice is read to its end.
    total_estimated  boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, table_name, partition)
);

-- Keys a run saw unchanged, for the tombstone anti-join of the tables it lists whole; every
-- attempt of the run counts. Unlogged: scratch space that a crash restart of Postgres may empty
-- (run_checkpoints.seen says so, and such a table is not tombstoned).
CREATE UNLOGGED TABLE run_seen_keys (
    run_id       bigint NOT NULL,
    table_name   text NOT NULL,
    external_id  text NOT NULL
);

CREATE INDEX run_seen_keys_lookup ON run_seen_keys (run_id, table_name, external_id);

-- Runs before the foreign key's ON DELETE SET NULL clears connection_runs.connection_id. The
-- only path that deletes a connection is its purge, so this runs once per connection, never on
-- a hot path.
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

-- A connection's last run is the one that finished last, not the newest by id: a failed run
-- retried finishes after runs queued since. The operator page reads it with one probe of this
-- index per connection (connections_overview), however much history retention keeps.
CREATE INDEX connection_runs_last_finished
    ON connection_runs (connection_id, finished_at DESC, id DESC)
 WHERE finished_at IS NOT NULL;


-- 3. Workers -----------------------------------------------------------------------------------

CREATE TABLE workers (
    id              text PRIMARY KEY,
    hostname        text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz,
    current_run_id  bigint,
    -- Each start of a worker records its own incarnation (a fresh uuid).
    incarnation     uuid,
    -- The providers it has installed: the claim takes only syncs it can run. NULL: any.
    providers       text[],
    -- What it runs of the application queues: {queue: lanes}; NULL for none.
    lanes           jsonb,
    -- Set by its empty claim while it listens on its own channel (worker_channel_v3), so that
    -- one enqueue wakes it alone (wake_one_v3); cleared by a claim or a wake-up.
    idle_since      timestamptz
);


-- 4. Records, table state, rate budgets and the ETag cache -------------------------------------

-- No foreign key to connections: a key check would lock the connection row once per written
-- record. The purge run is the one path that removes a connection, and it removes these first.
CREATE TABLE records (
    connection_id  bigint NOT NULL,
    table_name     text NOT NULL,
    external_id    text NOT NULL,
    data           jsonb NOT NULL,
    content_hash   bytea NOT NULL,
    first_seen_at  timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    deleted_at     timestamptz,
    -- The lease owner (claim token) of the attempt that last wrote this row. Rows written by
    -- the attempts of the current run are known seen without being listed in run_seen_keys.
    written_by     uuid NOT NULL,
    -- The partition a row was read from (a repository, a project, a drive); NULL for a table
    -- without partitions.
    partition      text,
    -- For a table whose listing can shift and whose connector cannot confirm deletions one by
    -- one: the run whose complete listing first missed this live row. A second complete listing
    -- that misses it too tombstones it; a listing that shows it again clears the mark.
    missed_by      bigint,
    PRIMARY KEY (connection_id, table_name, external_id)
);

-- Tombstoned records by when: the pass that deletes old tombstones (only when an operator sets
-- tombstone_days) reads only them. Live rows (deleted_at NULL) are not in it, so writing a live
-- row costs nothing more.
CREATE INDEX records_tombstoned ON records (deleted_at) WHERE deleted_at IS NOT NULL;

-- Provider rate budgets found exhausted, shared by every worker: no run drawing on a blocked
-- budget is claimed before blocked_until, and running ones wait (their control read sees it).
CREATE TABLE rate_budgets (
    key            text PRIMARY KEY,
    blocked_until  timestamptz NOT NULL,
    reason         text NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE table_state (
    connection_id      bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    table_name         text NOT NULL,
    cursor             jsonb,
    last_full_sync_at  timestamptz,
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- When each partition of the table was last read completely (and tombstoned), as an object
    -- from partition to time: a partition that keeps failing holds back no other's periodic
    -- complete pass, and is itself read completely once it recovers. last_full_sync_at says
    -- when every partition was; a partition without an entry goes by it.
    complete_passes    jsonb,
    -- The partitions of the table as the last sync listed them, and those that answered 404 (or
    -- 410) since which run: a partition that answers 404 is tombstoned only when a later run
    -- still gets 404, so one refused read never deletes a partition's rows. See "Deletions" in
    -- docs/architecture.md.
    partitions         text[],
    absent_partitions  jsonb,
    PRIMARY KEY (connection_id, table_name)
);

-- Conditional requests: the last response with an ETag per connection and URL (the URL's
-- SHA-256, so a key in a query string is never stored). A 304 reuses the stored body, which is
-- zlib-compressed here and therefore kept out of Postgres' own compression.
CREATE TABLE http_cache (
    connection_id  bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    url_hash       bytea NOT NULL,
    etag           text NOT NULL,
    headers        jsonb NOT NULL,
    body           bytea NOT NULL,
    stored_at      timestamptz NOT NULL DEFAULT now(),
    -- When it was last asked for (stored, or looked up for a conditional request). Entries
    -- nobody asked for in `http_cache_days` are deleted by the cleaner: a URL that is never
    -- asked again (a listing whose query changes with every sync) would otherwise stay for ever.
    used_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, url_hash)
);

ALTER TABLE http_cache ALTER COLUMN body SET STORAGE EXTERNAL;

-- The cleaner reads the entries unused the longest first, so a batch costs its own rows however
-- large the cache is.
CREATE INDEX http_cache_unused ON http_cache (used_at);


-- 5. Maintenance -------------------------------------------------------------------------------

-- Maintenance that workers do between them (see sql/maintenance.sql and "Retention" in
-- docs/operations.md): one row per periodic task (the cleaner's retention pass, the sweep of
-- seen keys), when a worker last took it and what that pass did. A worker takes a task with one
-- conditional UPDATE of its row (claim_maintenance); while the interval has not passed since
-- last_run_at, the others' UPDATEs match nothing and they skip it.
CREATE TABLE maintenance_runs (
    task         text PRIMARY KEY,
    last_run_at  timestamptz NOT NULL,
    worker_id    text,
    finished_at  timestamptz,
    -- What the pass deleted, per kind of row ({"runs": 120, "attempts": 240, ...}).
    result       jsonb
);


-- 6. The run queue's functions -----------------------------------------------------------------
--
-- The operations that need several statements to be correct under concurrency, yet must cost
-- one round trip. In a VOLATILE plpgsql function under READ COMMITTED every statement takes a
-- fresh snapshot: that is what closes the races described at each.

-- notify_channel: the channel every worker listens on; one per schema so two installations
-- never wake each other. Unversioned, and never to change: the enqueues and finishes of every
-- release notify it and the listener of every release listens on it (see "Upgrading" in
-- docs/operations.md).
CREATE FUNCTION notify_channel() RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$ SELECT 'connector_sync_' || current_schema() $$;


-- run_fence_v1: the fence of every write a run makes. Invariant: a write fenced by it commits
-- only while the claim that made `p_lease_owner` still holds the run `p_run_id`: the run is
-- running and its lease is live. An expired lease never passes, even before another worker has
-- claimed the run: the limiter already treats it as free. STABLE (now()), so the statement's
-- one now() is used throughout.
-- A one-expression SQL function (no SET clause, STABLE, not STRICT), so the planner inlines it:
-- `WHERE run_fence_v1(r, $1, $2)` plans exactly like the four conditions, an index scan of
-- connection_runs_pkey on `r.id = $1` (tests/test_fence.py checks every fenced statement's
-- plan). The row lock that holds the fence until commit (FOR SHARE, or the UPDATE of the run
-- row) stays with each statement.
CREATE FUNCTION run_fence_v1(r connection_runs, p_run_id bigint, p_lease_owner uuid)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
           AND r.lease_expires_at > now()
$$;


-- Lane parking. A lane is a workspace and a provider: the limiter lets one sync of a lane run at
-- a time. A queued sync whose lane is busy is marked `parked`, and the claim walks an index that
-- leaves parked runs out (connection_runs_claimable_unparked), so 10,000 runs queued behind one
-- running sync cost a claim nothing. The rules, each keeping one invariant (a lane that has a
-- parked run also has a running sync or an unparked queued sync, and the end of that run
-- unparks the next one):
--   a. the claim of a sync parks the other queued syncs of its lane, in the transaction that
--      makes its run running (claim_run_v3);
--   b. a sync inserted queued while a sync of its lane is running is parked, with that running
--      run's row share-locked until the insert commits, so the running run cannot end unseen
--      (connection_runs_park_v3);
--   c. when a sync stops running, or an unparked queued sync ends without running, the oldest
--      parked run of its lane is unparked (connection_runs_unpark_v3, ..._unpark_deleted_v3);
--   d. a parked run that leaves `queued` is no longer parked (connection_runs_unpark_self_v3).
-- Parking only narrows the claim's walk: the limiter's check under the workspace lock decides.

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


-- Rule d. A run that leaves `queued` (claimed, cancelled, failed) is not behind a busy lane any
-- more: a running run must not be parked (once its lease expires it must be in the claim's
-- index), and one sent back to the queue later must not come back parked with nothing ahead of
-- it to unpark it.
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


-- Targeted wake-ups. An idle worker that listens is marked in `workers.idle_since` by its empty
-- claim; an enqueue or a finish that makes one run claimable notifies one such worker on a
-- channel of its own instead of every worker on the shared channel. With no idle worker visible
-- it falls back to the shared channel, so a worker going idle while the notice is sent still
-- hears it.

-- worker_channel_v3: the channel one worker listens on besides the shared one. Hashed: a
-- channel name has at most 63 bytes, a schema and a worker id may have more.
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


-- enqueue_run_v3: insert a queued sync run for an active connection, or return the run already
-- queued/running for it; wakes one worker that can run the new run, and none if it is parked
-- (its lane is busy: no worker can take it now). Invariant: one queued/running run per
-- connection however many callers race (the partial unique index decides; the loop re-reads
-- with a fresh snapshot, so a winner that committed after our statement began is still
-- returned). FOR SHARE on the connection row serializes with delete_connection_v2's status
-- change, so no sync can be enqueued behind a purge. Neither inserted nor found: either the
-- connection is not active (the caller says why) or the active run finished between the two
-- statements, so it tries again.
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


-- claim_run_v3: take the oldest claimable run, lock it and its workspace, and make it running
-- under a fresh fencing token. Claimable: queued and due; running with an expired lease; a
-- waiting purge whose connection has no queued/running run left; in each case only while the
-- rate budget the run draws on is not blocked, and, for a sync, only if its provider is among
-- p_providers (the connectors the claiming worker has installed; NULL: any). A purge needs no
-- connector, so any worker takes it. Walks only the index of unparked runs, and parks the rest
-- of the claimed sync's lane (rule a). p_wakeable: the claiming worker listens on its own
-- channel; an empty claim marks it idle for wake_one_v3, a claim clears the mark.
-- Invariant: two runs of one lane never hold live leases at once. The candidate query filters by
-- the limiter, but its snapshot predates the workspace lock, so a run another claimer committed
-- meanwhile is invisible to it. Every claimer of a workspace holds that workspace's row lock until
-- it commits, so the re-check after it (a new statement, a new snapshot, taken with the lock
-- held) sees every run claimed before ours: is another run of this workspace running with a live
-- lease such that the two may not overlap (either is a purge, or both draw on the same
-- provider)? The `lease_expires_at > now()` tests are the limiter's, not the fence.
-- FOR NO KEY UPDATE rather than FOR UPDATE: it excludes other claimers just the same, but does not
-- conflict with the KEY SHARE locks that foreign-key checks take (an enqueue inserting a run of
-- this workspace), so those never make a claimer skip a workspace.
-- A run found running with an expired lease: its attempt is recorded `lost`, and on its last
-- attempt the run is dead-lettered (`failed`) instead of claimed. The attempt's start is
-- clock_timestamp(), not now(): an attempt's interval must contain its execution, which begins
-- after this claim's locks were taken, not when its transaction began.
-- ROWS 1: one row at most; without it the planner assumes 1,000 and hashes all of `connections`
-- to join the claimed run to its connection. enable_sort and enable_bitmapscan off: the
-- candidate must come from walking connection_runs_claimable_unparked in order, stopping at the
-- first claimable row; without statistics (a fresh or just-filled queue) the planner would
-- otherwise bitmap-scan every due run and sort them, on every claim: O(queue) instead of O(1).
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


-- claimed_run_extras_v1: what a claimed run comes back with besides its own row, written once
-- for the claim and the finish-and-claim (sql/queries.sql): the run's connection's name, status,
-- config and (encrypted) credentials, and its tables' incremental cursors, so the executor needs
-- no second round trip before it starts. No row when the run has no connection (a deleted
-- one's purge whose row is gone); the statements join it LEFT, so those columns are then NULL.
-- Invariant: none of its own; it reads what the claim's transaction sees.
-- A plpgsql function (its one statement planned once per session, as the claim's own are), so
-- the claim statements that call it plan a join with one function call instead of the select
-- list; the connection is read by its primary key (tests/test_claim_plan.py).
CREATE FUNCTION claimed_run_extras_v1(p_connection_id bigint)
RETURNS TABLE (connection_name text, connection_status text, config jsonb, credentials bytea,
               cursors jsonb)
LANGUAGE plpgsql
STABLE
ROWS 1
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT c.name, c.status, c.config, c.credentials,
           (SELECT jsonb_object_agg(s.table_name, s.cursor) FROM table_state s
             WHERE s.connection_id = c.id AND s.cursor IS NOT NULL)
      FROM connections c
     WHERE c.id = p_connection_id;
END
$$;


-- finish_run_v4: seal a run with a terminal status, the run's totals over all its attempts
-- (p_results) and its error, close its attempt with the attempt's own counts
-- (p_attempt_results) and, with p_disconnect, mark its connection disconnected (credentials
-- refused for good). Wakes one worker if the end of the run made a run claimable
-- (wake_for_freed_lane_v3); p_wake: false when the caller claims next in the same transaction
-- (finish_and_claim_v4), which wakes after its claim. Invariant: fenced by run_fence_v1; a
-- stale owner's finish matches nothing and returns NULL.
CREATE FUNCTION finish_run_v4(p_run_id bigint, p_lease_owner uuid, p_status text, p_results jsonb,
                              p_attempt_results jsonb, p_error jsonb, p_processed_units bigint,
                              p_disconnect boolean, p_wake boolean DEFAULT true)
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
           results = p_attempt_results
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


-- finish_and_claim_v4: finish_run_v4(), then claim_run_v3(), in one call: the worker loop's
-- single round trip between two runs; then the wake-up for the finished run's lane, after the
-- claim, so a run this worker took itself wakes nobody. The finish commits with the claim; if
-- nothing is claimable, `claimed` is all NULL and the finish still stands.
CREATE FUNCTION finish_and_claim_v4(p_run_id bigint, p_lease_owner uuid, p_status text,
                                    p_results jsonb, p_attempt_results jsonb, p_error jsonb,
                                    p_processed_units bigint, p_disconnect boolean,
                                    p_worker_id text, p_lease interval,
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
    v_done := finish_run_v4(p_run_id, p_lease_owner, p_status, p_results, p_attempt_results,
                            p_error, p_processed_units, p_disconnect, false);
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


-- delete_connection_v2: mark the connection deleting, cancel its queued sync, and insert the
-- purge run: waiting behind a sync that is still running, else queued. Returns the purge run
-- (the one already pending, when called twice). Each statement sees what the previous ones
-- committed or waited for: a claim racing the cancel makes the sync running, and the purge then
-- waits for it. Invariant: no sync is enqueued behind a purge, and a purge never runs beside a
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


-- 7. The end of a table: tombstones ------------------------------------------------------------
--
-- See "The tombstone pass" in docs/architecture.md. Each step is bounded, so the run row is
-- share-locked only briefly and lease renewals interleave with a pass over millions of rows, and
-- each step's key range is fixed before its UPDATE, so both scans of the UPDATE are index range
-- scans (p_after, v_hi]. The steps that tombstone (tombstone_unseen_v2, tombstone_partitions_v1,
-- end_table_v1) are intermediate writes of a run, committed asynchronously (see "Durability" in
-- docs/architecture.md).

-- tombstone_unseen_v2: one bounded step of a table's tombstone pass over the stored rows after
-- p_after, tombstoning the live ones of the partitions read completely (p_partitions; NULL:
-- every row of the table) that this run neither wrote (written_by is the lease owner of an
-- attempt that read the table, see run_checkpoints.first_attempt) nor saw unchanged
-- (run_seen_keys). Returns the rows tombstoned per partition.
-- Invariants: fenced (the run row is share-locked first and held until commit); bounded;
-- linear, because nested loops are off for it: with no statistics on run_seen_keys (scratch
-- space, refilled by every run) the planner otherwise picks a nested-loop anti-join that
-- rescans every seen key for every stored row.
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


-- unseen_rows_v2: the read-only twin of tombstone_unseen_v2 for tables whose listing can shift:
-- one bounded step of the same candidates, returned with their stored data so that the
-- connector can confirm each deletion before anything is tombstoned. Same invariants: fenced,
-- bounded, linear.
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


-- tombstone_partitions_v1: one bounded step over a table's stored rows after p_after,
-- tombstoning the live rows of the partitions in p_partitions, seen or not: those partitions are
-- gone as a whole (they left the listing that defines them, or answered 404 at two syncs in a
-- row). Returns the rows tombstoned per partition, as tombstone_unseen_v2 does.
-- Invariants: fenced (the run row is share-locked first and held until commit); bounded.
CREATE FUNCTION tombstone_partitions_v1(p_run_id bigint, p_lease_owner uuid,
                                        p_connection_id bigint, p_table text,
                                        p_partitions text[], p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_gone jsonb := '{}';
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '{}'::jsonb;
        RETURN;
    END IF;

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
               AND r.deleted_at IS NULL AND r.partition = ANY (p_partitions)
            RETURNING r.partition AS part
        )
        SELECT coalesce(jsonb_object_agg(counted.part, counted.n), '{}') INTO v_gone
          FROM (SELECT gone.part, count(*) AS n FROM gone GROUP BY gone.part) counted;
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_gone;
END
$$;


-- seen_keys_intact_v1: whether the seen keys this run saved for a table are all still there.
-- run_seen_keys is unlogged, and a crash restart of Postgres empties it; the checkpoints counted
-- the keys each batch saved in the batch's own transaction, and they are logged.
-- Invariant: a table whose seen keys were lost is never tombstoned by them.
CREATE FUNCTION seen_keys_intact_v1(p_run_id bigint, p_table text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    SELECT (SELECT count(*) FROM run_seen_keys k
             WHERE k.run_id = p_run_id AND k.table_name = p_table)
        >= (SELECT coalesce(sum(c.seen), 0) FROM run_checkpoints c
             WHERE c.run_id = p_run_id AND c.table_name = p_table)
$$;


-- complete_table_v1: the end of a table's tombstone pass: stamps each partition in p_whole
-- (partitions read completely in this run) in complete_passes, so a partition that keeps
-- failing holds back no other's periodic complete pass, and last_full_sync_at when p_stamp
-- (every partition was); drops the table's seen keys, which nothing reads any more.
-- Fenced: returns false, and changes nothing, when this claim no longer holds the run.
CREATE FUNCTION complete_table_v1(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                                  p_table text, p_whole text[], p_stamp boolean)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_stamp OR cardinality(p_whole) > 0 THEN
        INSERT INTO table_state AS s (connection_id, table_name, last_full_sync_at,
                                      complete_passes)
        SELECT p_connection_id, p_table, CASE WHEN p_stamp THEN now() END,
               coalesce(jsonb_object_agg(p, now()) FILTER (WHERE p IS NOT NULL), '{}')
          FROM unnest(p_whole) p
        ON CONFLICT (connection_id, table_name) DO UPDATE
           SET last_full_sync_at = coalesce(EXCLUDED.last_full_sync_at, s.last_full_sync_at),
               complete_passes = coalesce(s.complete_passes, '{}') || EXCLUDED.complete_passes,
               updated_at = now();
    END IF;
    DELETE FROM run_seen_keys WHERE run_id = p_run_id AND table_name = p_table;
    RETURN true;
END
$$;


-- end_table_v1: the end of a table read completely in this run (every slice done or failed for
-- good), in one call: the seen-key check of seen_keys_intact_v1; the first step of the
-- tombstone pass (tombstone_unseen_v2, over p_partitions, NULL for the whole table); and, when
-- that step reached the end of the table's rows, complete_table_v1. `intact` false: the seen keys
-- were lost, and nothing was written. `completed` false: more steps follow (tombstone_unseen_v2
-- from last_key), then complete_table_v1.
-- Invariants: fenced (the run row is share-locked first and held until commit); never tombstones
-- by lost seen keys; bounded like one tombstone step.
CREATE FUNCTION end_table_v1(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                             p_table text, p_partitions text[], p_whole text[], p_stamp boolean,
                             p_limit integer)
RETURNS TABLE (fenced boolean, intact boolean, last_key text, scanned bigint, tombstoned jsonb,
               completed boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_step record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, false, NULL::text, 0::bigint, '{}'::jsonb, false;
        RETURN;
    END IF;
    IF NOT seen_keys_intact_v1(p_run_id, p_table) THEN
        RETURN QUERY SELECT true, false, NULL::text, 0::bigint, '{}'::jsonb, false;
        RETURN;
    END IF;
    SELECT * INTO v_step
      FROM tombstone_unseen_v2(p_run_id, p_lease_owner, p_connection_id, p_table, p_partitions,
                               '', p_limit);
    completed := v_step.scanned < p_limit OR v_step.last_key IS NULL;
    IF completed THEN
        PERFORM complete_table_v1(p_run_id, p_lease_owner, p_connection_id, p_table, p_whole,
                                  p_stamp);
    END IF;
    RETURN QUERY SELECT true, true, v_step.last_key, v_step.scanned, v_step.tombstoned, completed;
END
$$;


-- 8. Documents ---------------------------------------------------------------------------------
--
-- Documents and their chunks, for search: each chunk's text, page, embedding and tsvector. A
-- document knows its source: a synced file (connection, table, the record's key, and a member
-- path inside an archive) or a local file (`connector-sync ingest PATH`), its scope, what it was
-- indexed from, and whether it is ready. Search reads ready documents only. See
-- docs/documents.md.

-- file_source_key: a file's identity as one value: its connection, table and external id, or
-- its workspace and local path (NULL for neither). Documents and ingestions are keyed by it and
-- a member path.
CREATE FUNCTION file_source_key(p_connection_id bigint, p_table_name text, p_external_id text,
                                p_workspace_id bigint, p_local_path text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
           WHEN p_connection_id IS NOT NULL
               THEN 'file' || chr(31) || p_connection_id::text || chr(31) || p_table_name
                    || chr(31) || p_external_id
           WHEN p_local_path IS NOT NULL
               THEN 'local' || chr(31) || p_workspace_id::text || chr(31) || p_local_path
       END;

CREATE TABLE documents (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id bigint NOT NULL REFERENCES workspaces (id),
    name         text NOT NULL CHECK (name <> ''),
    media_type   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    connection_id  bigint REFERENCES connections (id) ON DELETE CASCADE,
    table_name     text,
    external_id    text,
    local_path     text,
    -- '' for the file itself; a member's path inside the archive it came from.
    member_path    text NOT NULL DEFAULT '',
    scope          text,
    -- The record's content hash (a synced file) or the bytes' SHA-256 (a local file) that the
    -- document was last indexed from, the provider's version, and the SHA-256 of the bytes.
    source_hash    bytea,
    version        text,
    content_sha256 text,
    -- The embedding model and chunk settings of the stored chunks: a change re-indexes.
    indexed_with   text,
    chunks         integer,
    status         text NOT NULL DEFAULT 'ready' CHECK (status IN ('indexing', 'ready')),
    ready_at       timestamptz,
    source_key     text GENERATED ALWAYS AS (
        file_source_key(connection_id, table_name, external_id, workspace_id, local_path)) STORED,
    -- The target of the chunks' (document_id, workspace_id) key: a chunk is always in the
    -- workspace of its document.
    UNIQUE (id, workspace_id),
    CONSTRAINT documents_one_source CHECK (connection_id IS NULL OR local_path IS NULL)
);

CREATE INDEX documents_workspace ON documents (workspace_id);
-- One document per file (and per member of an archive file).
CREATE UNIQUE INDEX documents_of_source ON documents (source_key, member_path)
    WHERE source_key IS NOT NULL;
-- A connection's documents, for deleting those of tombstoned files.
CREATE INDEX documents_of_connection ON documents (connection_id, table_name, external_id)
    WHERE connection_id IS NOT NULL;

CREATE TABLE document_chunks (
    document_id     bigint NOT NULL,
    workspace_id    bigint NOT NULL,
    chunk_index     integer NOT NULL CHECK (chunk_index >= 0),
    page            integer NOT NULL CHECK (page >= 1),
    text            text NOT NULL,
    -- The vector space of `embedding` (see sync/documents/embeddings.py); a search compares
    -- only vectors of its own model.
    embedding_model text NOT NULL,
    embedding       real[] NOT NULL,  -- the pgvector type instead, where chosen (below)
    -- The full-text side of search reads chunks in English: words are stemmed ("renewed" and
    -- "renewal" are one term) and stop words ("is", "the", "how") are left out, so a question
    -- in plain words matches by the words that carry its meaning. Words the dictionary does not
    -- know (part numbers, codes) are kept as written.
    tsv             tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
    PRIMARY KEY (document_id, chunk_index),
    FOREIGN KEY (document_id, workspace_id) REFERENCES documents (id, workspace_id)
        ON DELETE CASCADE
);

-- A search reads one workspace's chunks of one model (the vector side), and the chunks whose
-- words match (the full-text side).
CREATE INDEX document_chunks_workspace ON document_chunks (workspace_id, embedding_model);
CREATE INDEX document_chunks_tsv ON document_chunks USING gin (tsv);

-- Embeddings are stored with pgvector where it can be had, else in a real[] column. The choice
-- is made here, once per schema:
--   1. the `vector` extension is already installed in this database, in any schema: use it;
--   2. else, if the server has it and this role may create it: create it, in this schema;
--   3. else (no pgvector on the server, or a role that may not create extensions): real[].
-- Two functions hide the difference from every statement in sql/documents.sql:
-- document_embedding(real[]) makes a column value, document_similarity(column, real[]) gives
-- the cosine similarity (0 when either vector is all zeros). docs/documents.md says how to move
-- a real[] schema to pgvector later.
CREATE FUNCTION document_embedding(v real[]) RETURNS real[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN v;

CREATE FUNCTION document_similarity(a real[], b real[]) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(sum(x::float8 * y) / nullif(sqrt(sum(x::float8 * x))
                                                   * sqrt(sum(y::float8 * y)), 0), 0)
          FROM unnest(a, b) AS t (x, y));

DO $$
DECLARE
    v_schema text;
BEGIN
    SELECT n.nspname INTO v_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'vector';
    IF v_schema IS NULL AND EXISTS (SELECT 1 FROM pg_available_extensions
                                     WHERE name = 'vector') THEN
        BEGIN
            EXECUTE format('CREATE EXTENSION vector SCHEMA %I', current_schema());
            v_schema := current_schema();
        EXCEPTION WHEN insufficient_privilege OR undefined_file THEN
            RAISE NOTICE 'pgvector is on the server but cannot be created here (%); '
                         'embeddings are stored as real[]', SQLERRM;
        END;
    END IF;
    IF v_schema IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE document_chunks ALTER COLUMN embedding TYPE %1$I.vector '
                   'USING embedding::%1$I.vector', v_schema);
    DROP FUNCTION document_similarity(real[], real[]);
    DROP FUNCTION document_embedding(real[]);
    EXECUTE format('CREATE FUNCTION document_embedding(v real[]) RETURNS %1$I.vector '
                   'LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN v::%1$I.vector', v_schema);
    -- pgvector's cosine distance is NaN when a vector is all zeros; similarity 0 instead.
    EXECUTE format('CREATE FUNCTION document_similarity(a %1$I.vector, b real[]) '
                   'RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE '
                   'RETURN coalesce(nullif(1 - (a OPERATOR(%1$I.<=>) b::%1$I.vector), ''NaN''), 0)',
                   v_schema);
END
$$;


-- 9. Ingestions --------------------------------------------------------------------------------
--
-- Ingestions: the checkpointed job that turns one file into searchable chunks, and the lighter
-- archive expansion that turns one ZIP into member files to ingest. kind 'document' is leased
-- (lease owner and expiry, renewed by the worker's lease keeper) and resumes at
-- `processed_units`; kind 'archive' carries a `processing_since` timestamp instead of a lease.

-- The record version of each synced file last queued for ingestion. A file whose record's
-- content hash equals the one here is not queued again; a tombstoned file's row goes with its
-- documents, so a file that comes back is indexed again.
CREATE TABLE file_sources (
    connection_id bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    table_name    text NOT NULL,
    external_id   text NOT NULL,
    content_hash  bytea NOT NULL,
    queued_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, table_name, external_id)
);

-- One row per ingestion of one file.
CREATE TABLE ingestions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id        bigint NOT NULL REFERENCES workspaces (id),
    kind                text NOT NULL DEFAULT 'document' CHECK (kind IN ('document', 'archive')),
    status              text NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'running', 'ready', 'skipped', 'failed',
                                          'cancelled')),
    -- The source: a synced file (connection, table, external id) or a local file (path).
    source              text NOT NULL CHECK (source IN ('file', 'local')),
    -- History outlives the connection; a deleted connection's documents go with it.
    connection_id       bigint REFERENCES connections (id) ON DELETE SET NULL,
    table_name          text,
    external_id         text,
    local_path          text,
    member_path         text NOT NULL DEFAULT '',
    -- A member's archive: the ingestion that expanded it and the SHA-256 of its bytes then.
    archive_id          bigint REFERENCES ingestions (id) ON DELETE SET NULL,
    archive_sha256      text,
    -- What was queued: the record's content hash (a synced file), the SHA-256 of the bytes (a
    -- local file or an archive member). A sync that finds the file changed again while it is
    -- being ingested updates it; the finish then sees the record moved on.
    source_hash         bytea NOT NULL,
    name                text,
    scope               text,
    document_id         bigint REFERENCES documents (id) ON DELETE SET NULL,
    -- The SHA-256 of the bytes the chunks are being made from: a later attempt whose bytes
    -- differ starts again from chunk 0.
    content_sha256      text,
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL CHECK (max_attempts >= 1),
    queued_at           timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    worker_id           text,
    lease_owner         uuid,
    lease_expires_at    timestamptz,
    processing_since    timestamptz,
    cancel_requested_at timestamptz,
    processed_units     integer NOT NULL DEFAULT 0 CHECK (processed_units >= 0),
    total_units         integer,
    results             jsonb NOT NULL DEFAULT '{}',
    error               jsonb,
    source_key          text GENERATED ALWAYS AS (
        file_source_key(connection_id, table_name, external_id, workspace_id, local_path)) STORED,
    -- What the processed units were made with: the embedding model and chunk settings (the
    -- `indexed_with` of documents). An attempt resumes at `processed_units` only when its bytes
    -- and these are the ones an earlier attempt worked with: chunks embedded by another model,
    -- or cut with other chunk settings, are another list, and a document must never mix two.
    -- NULL starts again from chunk 0.
    indexed_with        text,
    CHECK (source <> 'local' OR local_path IS NOT NULL)
);

-- At most one pending (queued or running) ingestion per file: a file is never indexed by two
-- workers at once, and queueing a file that is already pending updates the pending one.
CREATE UNIQUE INDEX ingestions_pending ON ingestions (source_key, member_path)
    WHERE status IN ('queued', 'running') AND source_key IS NOT NULL;

-- The claims walk this in order; finished ingestions are not in it.
CREATE INDEX ingestions_claimable ON ingestions (kind, queued_at, id)
    WHERE status IN ('queued', 'running');
CREATE INDEX ingestions_by_workspace ON ingestions (workspace_id, id);
CREATE INDEX ingestions_of_archive ON ingestions (archive_id) WHERE archive_id IS NOT NULL;

-- Finished ingestions by when they finished: the retention pass (prune_ingestions_batch in
-- sql/maintenance.sql) reads only the ones past its cutoff, oldest first. Queued and running
-- ones are not in it, so queueing and claiming cost nothing more.
CREATE INDEX ingestions_finished ON ingestions (finished_at, id)
    WHERE status IN ('ready', 'skipped', 'failed', 'cancelled');


-- claim_ingestion_v1: take the oldest claimable document ingestion and make it running under a
-- fresh fencing token (its lease owner). Claimable: queued and due, or running with an expired
-- lease (its worker died); a synced file's only if the claiming worker has its provider
-- (p_providers NULL: any). A reclaimed row keeps its processed_units: the next attempt resumes
-- there. An expired row that has used its last attempt is dead-lettered on the way.
-- Invariant: one live lease per ingestion; SKIP LOCKED keeps two claimers off one row.
CREATE FUNCTION claim_ingestion_v1(p_worker_id text, p_lease interval,
                                   p_providers text[] DEFAULT NULL)
RETURNS SETOF ingestions
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    candidate ingestions;
BEGIN
    FOR round IN 1..20 LOOP
        SELECT i.* INTO candidate
          FROM ingestions i
         WHERE i.kind = 'document'
           AND i.status IN ('queued', 'running')
           AND i.queued_at <= now()
           AND CASE i.status WHEN 'queued' THEN true ELSE i.lease_expires_at <= now() END
           AND (i.source = 'local' OR p_providers IS NULL OR i.connection_id IS NULL
                OR EXISTS (SELECT 1 FROM connections c
                            WHERE c.id = i.connection_id AND c.provider = ANY (p_providers)))
         ORDER BY i.kind, i.queued_at, i.id
         LIMIT 1
           FOR NO KEY UPDATE OF i SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF candidate.status = 'running' AND candidate.attempts >= candidate.max_attempts THEN
            UPDATE ingestions
               SET status = 'failed', finished_at = now(),
                   lease_owner = NULL, lease_expires_at = NULL,
                   error = jsonb_build_object(
                       'kind', 'lease_expired',
                       'message', 'the worker running the last attempt stopped renewing its lease')
             WHERE id = candidate.id;
            CONTINUE;
        END IF;
        RETURN QUERY
            UPDATE ingestions
               SET status = 'running',
                   attempts = attempts + 1,
                   lease_owner = gen_random_uuid(),
                   lease_expires_at = now() + p_lease,
                   worker_id = p_worker_id,
                   started_at = coalesce(started_at, now()),
                   error = NULL
             WHERE id = candidate.id
            RETURNING *;
        RETURN;
    END LOOP;
END
$$;


-- claim_archive_v1: take the oldest archive expansion that is queued and due, or whose
-- processing began more than p_reclaim_after ago (its worker died, or is far slower than an
-- expansion should be), and stamp processing_since. There is no lease: an expansion is quick
-- and safe to redo, and every write it makes is guarded by the processing_since it was given.
-- One that has used its last attempt is failed on the way.
CREATE FUNCTION claim_archive_v1(p_worker_id text, p_reclaim_after interval,
                                 p_providers text[] DEFAULT NULL)
RETURNS SETOF ingestions
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    candidate ingestions;
BEGIN
    FOR round IN 1..20 LOOP
        SELECT i.* INTO candidate
          FROM ingestions i
         WHERE i.kind = 'archive'
           AND i.status IN ('queued', 'running')
           AND i.queued_at <= now()
           AND CASE i.status
                   WHEN 'queued' THEN true
                   ELSE i.processing_since <= now() - p_reclaim_after
               END
           AND (i.source = 'local' OR p_providers IS NULL OR i.connection_id IS NULL
                OR EXISTS (SELECT 1 FROM connections c
                            WHERE c.id = i.connection_id AND c.provider = ANY (p_providers)))
         ORDER BY i.kind, i.queued_at, i.id
         LIMIT 1
           FOR NO KEY UPDATE OF i SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF candidate.status = 'running' AND candidate.attempts >= candidate.max_attempts THEN
            UPDATE ingestions
               SET status = 'failed', finished_at = now(), processing_since = NULL,
                   error = jsonb_build_object(
                       'kind', 'abandoned',
                       'message', 'the worker expanding the archive on its last attempt never '
                                  'finished')
             WHERE id = candidate.id;
            CONTINUE;
        END IF;
        RETURN QUERY
            UPDATE ingestions
               SET status = 'running',
                   attempts = attempts + 1,
                   processing_since = clock_timestamp(),
                   worker_id = p_worker_id,
                   started_at = coalesce(started_at, now()),
                   error = NULL
             WHERE id = candidate.id
            RETURNING *;
        RETURN;
    END LOOP;
END
$$;


-- ingestion_fence_v1: the fence of every write of an ingestion's attempt (sql/ingestions.sql).
-- Invariant: the write commits only while the claim that made `p_lease_owner` still holds the
-- ingestion `p_ingestion_id`: it is running under that token and its lease is live. An expired
-- lease never passes, even before another worker has claimed the ingestion: the claim already
-- treats it as free. An archive expansion has no lease; its writes are guarded by the
-- processing_since its claim stamped instead. Inlined by the planner like run_fence_v1.
CREATE FUNCTION ingestion_fence_v1(i ingestions, p_ingestion_id bigint, p_lease_owner uuid)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT i.id = p_ingestion_id AND i.lease_owner = p_lease_owner AND i.status = 'running'
           AND i.lease_expires_at > now()
$$;


-- 10. Application queues -----------------------------------------------------------------------
--
-- Queues as rows (like pg-boss's createQueue), their jobs, the attempts that ended, and cron
-- schedules. The statements that are one statement each live in sql/queues.sql. See
-- docs/queues.md.

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
-- Reading a queue's jobs, newest first; figures per queue; retention (the walk per queue of
-- the finished jobs past their queue's retention).
CREATE INDEX jobs_by_queue ON jobs (queue, id);
CREATE INDEX jobs_finished ON jobs (queue, finished_at)
    WHERE status IN ('completed', 'dead', 'cancelled');
-- The dead letters of each queue, counted by /metrics on every scrape (and by the operator
-- page's queues page): counting them reads as many entries as there are dead jobs, however
-- many completed ones retention keeps.
CREATE INDEX jobs_dead ON jobs (queue) WHERE status = 'dead';

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


-- claim_jobs_v2: start an attempt of up to p_limit due jobs of the served queues, under a lease
-- of p_lease seconds (never past the queue's expire). Expired attempts are taken first, then due
-- queued and retrying jobs, the longest waiting first. claim_jobs_v3 falls back on it whenever
-- an attempt past its expiry is to be taken back, and for a claim of several queues.
-- Invariants: a job is claimed by one claim (FOR UPDATE SKIP LOCKED); each attempt gets a
-- fencing token of its own (lease_owner); an active attempt past its expiry is taken back here,
-- with no sweep of its own: it is recorded as expired and run again by this claim, or, with no
-- attempt left, dead-lettered (returned with status 'dead', for the caller to call the on_dead
-- hook once).
-- plan_cache_mode = force_generic_plan: Postgres plans a function's statements with the call's
-- values ("custom" plans) until it judges a generic plan no dearer, and for this claim it kept
-- choosing custom ones, planning for longer than the statements ran. The generic plans walk the
-- same partial indexes (jobs_expiring, jobs_due) in the same order; tests/test_queues_postgres.py
-- reads them at 100,000 finished jobs.
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


-- claim_jobs_v3: the job claim workers call. When no attempt of the one queue claimed is past
-- its expiry (the usual case: the partial index jobs_expiring answers from its first entry),
-- the claim is one UPDATE of the due jobs it locks; otherwise, and for a claim of several
-- queues, it is claim_jobs_v2, which also takes expired attempts back.
-- Invariants, the same as claim_jobs_v2's:
-- * a job is claimed by one claim (FOR UPDATE SKIP LOCKED, on either path), and each attempt
--   gets a fencing token of its own (gen_random_uuid());
-- * an attempt past its expiry is taken back by a claim: by this one when it sees one (through
--   claim_jobs_v2), and one that expires while this claim runs by the next claim;
-- * a claim commits without waiting for its WAL flush (a claim lost in a crash leaves its jobs
--   claimable, as a dead worker does); one that dead-letters a job (claim_jobs_v2 only) stays
--   durable.
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


-- job_fence_v1: the fence of every write of an application job's attempt (sql/queues.sql).
-- Invariant: the write commits only while the attempt whose fencing token is `p_lease_owner`
-- still holds the job `p_job_id`: the job is active under that token and its lease has not run
-- out by `p_now`, the caller's clock, or the database's now() when `p_now` is NULL (the clock
-- tests drive; see the header of queues.sql). An attempt past its expires_at never passes, even
-- before a claim has taken the job back: the claim already treats it as expired. Inlined by the
-- planner like run_fence_v1.
CREATE FUNCTION job_fence_v1(j jobs, p_job_id bigint, p_lease_owner uuid, p_now timestamptz)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT j.id = p_job_id AND j.lease_owner = p_lease_owner AND j.status = 'active'
           AND j.expires_at >= coalesce(p_now, now())
$$;
