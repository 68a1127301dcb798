-- When each run was first queued. queued_at orders the claim and so moves: a retry, a hand-back
-- and `runs retry` set it to when the run may next be claimed. first_queued_at never moves, so
-- `runs show` can say both when a run was asked for and when its next attempt is due.
ALTER TABLE connection_runs ADD COLUMN first_queued_at timestamptz;

-- Runs queued before this migration: the earliest time recorded of each, since a retried run's
-- queued_at is later than its first attempt's start (least() skips the NULLs of runs that never
-- started).
UPDATE connection_runs r
   SET first_queued_at = least(r.queued_at, r.started_at,
                               (SELECT min(a.started_at) FROM run_attempts a WHERE a.run_id = r.id));

ALTER TABLE connection_runs
    ALTER COLUMN first_queued_at SET DEFAULT now(),
    ALTER COLUMN first_queued_at SET NOT NULL;
