-- Retention of finished ingestions (see prune_ingestions_batch in sql/maintenance.sql and
-- "Retention" in docs/operations.md).

-- Finished ingestions by when they finished: the retention pass reads only the ones past its
-- cutoff, oldest first. Queued and running ones are not in it, so queueing and claiming cost
-- nothing more. Finished application jobs need no index of their own: jobs_finished
-- (queue, finished_at) already serves the walk per queue.
CREATE INDEX ingestions_finished ON ingestions (finished_at, id)
    WHERE status IN ('ready', 'skipped', 'failed', 'cancelled');
