-- The engine's tables: workspaces, their connections, the runs that sync or purge them and their
-- attempts, the records they write, and the state each table keeps between runs. Runs from
-- `connector-sync migrate` with search_path set to the target schema, so no name below is
-- schema-qualified.

CREATE TABLE workspaces (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (name <> ''),
    created_at  timestamptz NOT NULL DEFAULT now()
);

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

-- The claim scans this in (queued_at, id) order; finished runs are not in it, so the claim
-- costs the same however much history accumulates.
CREATE INDEX connection_runs_claimable ON connection_runs (queued_at, id, lease_expires_at)
    WHERE status IN ('waiting', 'queued', 'running');

-- The limiter's lookup of live runs in a workspace; only running rows are in it.
CREATE INDEX connection_runs_running_lane ON connection_runs (workspace_id, provider)
    WHERE status = 'running';

-- Listing a connection's history.
CREATE INDEX connection_runs_by_connection ON connection_runs (connection_id, id);

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
    results      jsonb
);

CREATE INDEX run_attempts_by_run ON run_attempts (run_id, id);

CREATE TABLE workers (
    id              text PRIMARY KEY,
    hostname        text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz,
    current_run_id  bigint
);

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
    -- the current attempt are known seen without being listed in run_seen_keys.
    written_by     uuid NOT NULL,
    PRIMARY KEY (connection_id, table_name, external_id)
);

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
    PRIMARY KEY (connection_id, table_name)
);

-- Keys an attempt saw unchanged, for the tombstone anti-join of `full` tables. Unlogged: it is
-- scratch space that a crash may lose (the attempt that wrote it is lost with it).
CREATE UNLOGGED TABLE run_seen_keys (
    lease_owner  uuid NOT NULL,
    table_name   text NOT NULL,
    external_id  text NOT NULL
);

CREATE INDEX run_seen_keys_lookup ON run_seen_keys (lease_owner, table_name, external_id);
