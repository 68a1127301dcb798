-- The application queues' statements that run on a caller's own connection: a send inside the
-- caller's open transaction, so the job commits or rolls back with the caller's own rows.
-- The caller's search_path is the application's, so each statement names the schema
-- ({schema}, filled in with psycopg.sql.Identifier); the functions set their own search_path.
-- No statement here leaves any setting behind on the caller's connection or transaction.

-- name: send_job
-- send_job of queues.sql, in the caller's transaction. Invariants in send_job_v2 (0004): one
-- pending job per singleton slot (a second sender of a slot held by a job not committed yet
-- waits for it), one job per cron tick; the wake-up NOTIFY goes out only at commit.
SELECT * FROM {schema}.send_job_v2(%(queue)s, %(payload)s, %(key)s, %(now)s::timestamptz,
                                   %(delay)s::double precision, %(at)s::timestamptz, NULL,
                                   %(priority)s::smallint);

-- name: send_jobs
-- send_jobs of queues.sql, in the caller's transaction: the same invariants as send_job.
SELECT s.job_id, s.outcome
  FROM unnest(%(payloads)s::jsonb[]) WITH ORDINALITY AS p(payload, n)
 CROSS JOIN LATERAL {schema}.send_job_v2(%(queue)s, p.payload, %(key)s, %(now)s::timestamptz,
                                         %(delay)s::double precision, %(at)s::timestamptz,
                                         NULL, %(priority)s::smallint) AS s
 ORDER BY p.n;
