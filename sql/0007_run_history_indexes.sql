-- Indexes for reading run history by time and the dead letters without scanning every retained
-- run: /metrics counts the runs that finished in its window and the failed runs on each scrape,
-- and a scrape should cost the same with a thousand finished runs or ten million.

-- Runs that finished (any terminal status), by when. A run is in it only once it has ended.
CREATE INDEX connection_runs_finished ON connection_runs (finished_at)
    WHERE finished_at IS NOT NULL;

-- The dead letters: runs that failed for good and wait for an operator's retry.
CREATE INDEX connection_runs_dead_letters ON connection_runs (kind, provider)
    WHERE status = 'failed';
