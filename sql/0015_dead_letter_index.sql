-- The dead letters of each application queue, counted by /metrics on every scrape (and by the
-- operator page's queues page): an index that holds only dead jobs, so counting them reads as
-- many entries as there are dead jobs, however many completed ones retention keeps. Without
-- it the count read every finished job of the table (jobs_finished holds completed and
-- cancelled ones too), a sequential scan at each scrape.
CREATE INDEX jobs_dead ON jobs (queue) WHERE status = 'dead';
