-- Maintenance that workers do between them: a durable marker per periodic task, so that any
-- number of workers run each task once per interval, and the indexes the retention deletes walk
-- (see sql/maintenance.sql and "Retention" in docs/operations.md).

-- One row per periodic task (the cleaner's retention pass, the sweep of seen keys): when a
-- worker last took it and what that pass did. A worker takes a task with one conditional
-- UPDATE of its row (claim_maintenance); while the interval has not passed since last_run_at,
-- the others' UPDATEs match nothing and they skip it.
CREATE TABLE maintenance_runs (
    task         text PRIMARY KEY,
    last_run_at  timestamptz NOT NULL,
    worker_id    text,
    finished_at  timestamptz,
    -- What the pass deleted, per kind of row ({"runs": 120, "attempts": 240, ...}).
    result       jsonb
);

-- Finished runs in (finished_at, id) order: the retention pass walks the runs that finished
-- before its cutoff by keyset, once per pass, passing the newest runs of each connection that
-- it keeps without reading them again. Also serves what connection_runs_finished served.
CREATE INDEX connection_runs_retention ON connection_runs (finished_at, id)
    WHERE finished_at IS NOT NULL;
DROP INDEX connection_runs_finished;

-- Tombstoned records by when: the pass that deletes old tombstones (only when an operator sets
-- tombstone_days) reads only them. Live rows (deleted_at NULL) are not in it, so writing a live
-- row costs nothing more.
CREATE INDEX records_tombstoned ON records (deleted_at) WHERE deleted_at IS NOT NULL;
