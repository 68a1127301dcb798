-- When each run was first queued. queued_at orders the claim and so moves: a retry, a hand-back
-- and `runs retry` set it to when the run may next be claimed. first_queued_at never moves, so
-- `runs show` can say both when a run was asked for and when its next attempt is due.
--
-- Added without a rewrite of the table: a column without a default takes no time however many
-- runs there are, and the default applies to runs inserted from now on. Runs queued before it
-- keep NULL, and readers take the earliest time recorded of them instead (sync.models.Run:
-- the earlier of queued_at and started_at, since a retried run's queued_at is later than its
-- first attempt's start). A backfill would lock the queue for as long as it rewrites every row.
ALTER TABLE connection_runs ADD COLUMN first_queued_at timestamptz;
ALTER TABLE connection_runs ALTER COLUMN first_queued_at SET DEFAULT now();
