-- The fences of the application jobs and of the ingestions, each written once, like the runs'
-- run_fence_v1 (0012_fence_and_versions.sql), whose shape they take: a one-expression SQL
-- function (no SET clause, STABLE, not STRICT) that the planner inlines, so a fenced statement
-- plans exactly like the conditions written out, an index scan of its table's primary key on
-- the row's id (tests/test_fence.py checks every fenced statement's plan). The row lock that
-- holds the fence until commit (the UPDATE of the row, FOR NO KEY UPDATE or FOR SHARE) stays
-- with each statement.


-- job_fence_v1: the fence of every write of an application job's attempt (sql/queues.sql).
-- Invariant: the write commits only while the attempt whose fencing token is `p_lease_owner`
-- still holds the job `p_job_id`: the job is active under that token and its lease has not run
-- out by `p_now`, the caller's clock, or the database's now() when `p_now` is NULL (the clock
-- tests drive; see the header of queues.sql). An attempt past its expires_at never passes, even
-- before a claim has taken the job back: the claim already treats it as expired.
CREATE FUNCTION job_fence_v1(j jobs, p_job_id bigint, p_lease_owner uuid, p_now timestamptz)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT j.id = p_job_id AND j.lease_owner = p_lease_owner AND j.status = 'active'
           AND j.expires_at >= coalesce(p_now, now())
$$;


-- ingestion_fence_v1: the fence of every write of an ingestion's attempt (sql/ingestions.sql).
-- Invariant: the write commits only while the claim that made `p_lease_owner` still holds the
-- ingestion `p_ingestion_id`: it is running under that token and its lease is live. An expired
-- lease never passes, even before another worker has claimed the ingestion: the claim already
-- treats it as free. An archive expansion has no lease; its writes are guarded by the
-- processing_since its claim stamped instead.
CREATE FUNCTION ingestion_fence_v1(i ingestions, p_ingestion_id bigint, p_lease_owner uuid)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT i.id = p_ingestion_id AND i.lease_owner = p_lease_owner AND i.status = 'running'
           AND i.lease_expires_at > now()
$$;
