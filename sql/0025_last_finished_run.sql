-- A connection's last run is the one that finished last, not the newest by id: a failed run
-- retried finishes after runs queued since. The operator page reads it with one probe of this
-- index per connection (connections_overview), however much history retention keeps.
CREATE INDEX connection_runs_last_finished
    ON connection_runs (connection_id, finished_at DESC, id DESC)
 WHERE finished_at IS NOT NULL;
