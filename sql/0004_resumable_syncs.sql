-- Resumable syncs: a run's tables resume where an earlier attempt stopped, rate-limit waits spend
-- no attempt, partitions of a table are checkpointed and tombstoned on their own, listings that
-- shift never tombstone a live row, and conditional requests reuse what a provider said before.
-- See "Resuming a run" in docs/architecture.md.


-- Where each table of a run got to, per partition ('' for a table without partitions). Saved in
-- the transaction of the batch it follows (write_record_batch), so a position is never ahead of
-- the records it covers. A later attempt of the same run resumes every slice that is not done
-- from its position. Deleted with the run.
CREATE TABLE run_checkpoints (
    run_id      bigint NOT NULL REFERENCES connection_runs (id) ON DELETE CASCADE,
    table_name  text NOT NULL,
    partition   text NOT NULL DEFAULT '',
    -- What the connector yielded as its read position (a next link, a page number...); NULL:
    -- from the start.
    position    jsonb,
    -- Read to its end in this run.
    done        boolean NOT NULL DEFAULT false,
    -- The read lists the whole slice (a full table, or an incremental one after Resync): rows it
    -- did not see are tombstoned once the table is done.
    resync      boolean NOT NULL DEFAULT false,
    pages       integer NOT NULL DEFAULT 0,
    records     bigint NOT NULL DEFAULT 0,
    -- As many records as the provider said the slice holds, when it says.
    total       bigint,
    -- How many keys this run put in run_seen_keys for the slice. run_seen_keys is unlogged: a
    -- crash restart of Postgres empties it, and a count short of this one says so.
    seen        bigint NOT NULL DEFAULT 0,
    -- The attempt (run_attempts.id) whose read of the slice this is. Rows written by it and by
    -- the attempts after it were read in this run; rows an earlier attempt wrote before the
    -- slice started over were not.
    first_attempt  bigint NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, table_name, partition)
);


-- Seen keys now belong to the run, not to one attempt: every attempt of a run counts for the
-- tombstone pass. The old table held only scratch keys of attempts, so nothing is lost with it.
DROP TABLE run_seen_keys;

CREATE UNLOGGED TABLE run_seen_keys (
    run_id       bigint NOT NULL,
    table_name   text NOT NULL,
    external_id  text NOT NULL
);

CREATE INDEX run_seen_keys_lookup ON run_seen_keys (run_id, table_name, external_id);


-- The partition a row was read from (a repository, a project, a drive); NULL for a table
-- without partitions. Adding a nullable column rewrites nothing.
ALTER TABLE records ADD COLUMN partition text;

-- For a table whose listing can shift and whose connector cannot confirm deletions one by one:
-- the run whose complete listing first missed this live row. A second complete listing that
-- misses it too tombstones it; a listing that shows it again clears the mark.
ALTER TABLE records ADD COLUMN missed_by bigint;


-- Waits for a provider's rate limit: they spend no attempt, and are counted on the run.
ALTER TABLE connection_runs
    ADD COLUMN waits integer NOT NULL DEFAULT 0,
    ADD COLUMN waiting_for text,
    ADD COLUMN waiting_until timestamptz,
    -- Where the run is now: table k of n, its partition, page, records read and total.
    ADD COLUMN progress jsonb;

-- An attempt that ended waiting says for what and until when. And the lease it last held, as
-- each renewal extends it: an attempt whose worker died held its run until then, however much
-- later a claim took the run over (and recorded the attempt's end).
ALTER TABLE run_attempts
    ADD COLUMN waiting_for text,
    ADD COLUMN waiting_until timestamptz,
    ADD COLUMN lease_expires_at timestamptz;


-- Conditional requests: the last response with an ETag per connection and URL (the URL's
-- SHA-256, so a key in a query string is never stored). A 304 reuses the stored body, which is
-- zlib-compressed here and therefore kept out of Postgres' own compression.
CREATE TABLE http_cache (
    connection_id  bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    url_hash       bytea NOT NULL,
    etag           text NOT NULL,
    headers        jsonb NOT NULL,
    body           bytea NOT NULL,
    stored_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, url_hash)
);

ALTER TABLE http_cache ALTER COLUMN body SET STORAGE EXTERNAL;


-- tombstone_unseen, now per run and per partition: one bounded step of a table's tombstone
-- pass over the stored rows after p_after, tombstoning the live ones of the partitions read
-- completely (p_partitions; NULL: every row of the table) that this run neither wrote (written_by
-- is the lease owner of an attempt that read the table, see run_checkpoints.first_attempt) nor
-- saw unchanged (run_seen_keys).
-- Invariants, as before: fenced (the run row is share-locked first and held until commit);
-- bounded; linear (nested loops off: run_seen_keys never has statistics for this run); each
-- step's key range is fixed before its UPDATE. Returns the rows tombstoned per partition.
DROP FUNCTION tombstone_unseen(bigint, uuid, bigint, text, text, integer);

CREATE FUNCTION tombstone_unseen(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                                 p_table text, p_partitions text[], p_after text,
                                 p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
-- The cost penalty that turns nested loops off would otherwise trip JIT compilation (0.4 s).
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_tokens uuid[];
    v_gone jsonb := '{}';
BEGIN
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
       AND r.lease_expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '{}'::jsonb;
        RETURN;
    END IF;

    -- Rows written by the attempts that read the table's slices were read in this run.
    SELECT array_agg(a.lease_owner) INTO v_tokens
      FROM run_attempts a
     WHERE a.run_id = p_run_id
       AND a.id >= coalesce((SELECT min(c.first_attempt) FROM run_checkpoints c
                              WHERE c.run_id = p_run_id AND c.table_name = p_table),
                            (SELECT b.id FROM run_attempts b WHERE b.lease_owner = p_lease_owner));

    SELECT max(span.external_id), count(*) INTO v_hi, v_n
      FROM (SELECT s.external_id FROM records s
             WHERE s.connection_id = p_connection_id AND s.table_name = p_table
               AND s.external_id > p_after
             ORDER BY s.external_id
             LIMIT p_limit) span;

    IF v_n > 0 THEN
        WITH gone AS (
            UPDATE records r
               SET deleted_at = now(), updated_at = now(), written_by = p_lease_owner
             WHERE r.connection_id = p_connection_id AND r.table_name = p_table
               AND r.external_id > p_after AND r.external_id <= v_hi
               AND r.deleted_at IS NULL AND r.written_by <> ALL (v_tokens)
               AND (p_partitions IS NULL OR r.partition = ANY (p_partitions))
               AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                                WHERE k.run_id = p_run_id AND k.table_name = p_table
                                  AND k.external_id > p_after AND k.external_id <= v_hi
                                  AND k.external_id = r.external_id)
            RETURNING coalesce(r.partition, '') AS part
        )
        SELECT coalesce(jsonb_object_agg(counted.part, counted.n), '{}') INTO v_gone
          FROM (SELECT gone.part, count(*) AS n FROM gone GROUP BY gone.part) counted;
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_gone;
END
$$;


-- unseen_rows: the read-only twin of tombstone_unseen for tables whose listing can shift: one
-- bounded step of the same candidates (live rows of the partitions read completely that this
-- run neither wrote nor saw), returned with their stored data so that the connector can confirm
-- each deletion before anything is tombstoned. Same invariants: fenced, bounded, linear.
CREATE FUNCTION unseen_rows(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                            p_table text, p_partitions text[], p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, unseen jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_tokens uuid[];
    v_unseen jsonb := '[]';
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
       AND r.lease_expires_at > now();
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '[]'::jsonb;
        RETURN;
    END IF;

    SELECT array_agg(a.lease_owner) INTO v_tokens
      FROM run_attempts a
     WHERE a.run_id = p_run_id
       AND a.id >= coalesce((SELECT min(c.first_attempt) FROM run_checkpoints c
                              WHERE c.run_id = p_run_id AND c.table_name = p_table),
                            (SELECT b.id FROM run_attempts b WHERE b.lease_owner = p_lease_owner));

    SELECT max(span.external_id), count(*) INTO v_hi, v_n
      FROM (SELECT s.external_id FROM records s
             WHERE s.connection_id = p_connection_id AND s.table_name = p_table
               AND s.external_id > p_after
             ORDER BY s.external_id
             LIMIT p_limit) span;

    IF v_n > 0 THEN
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'external_id', r.external_id, 'partition', r.partition, 'data', r.data)
                   ORDER BY r.external_id), '[]')
          INTO v_unseen
          FROM records r
         WHERE r.connection_id = p_connection_id AND r.table_name = p_table
           AND r.external_id > p_after AND r.external_id <= v_hi
           AND r.deleted_at IS NULL AND r.written_by <> ALL (v_tokens)
           AND (p_partitions IS NULL OR r.partition = ANY (p_partitions))
           AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                            WHERE k.run_id = p_run_id AND k.table_name = p_table
                              AND k.external_id > p_after AND k.external_id <= v_hi
                              AND k.external_id = r.external_id);
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_unseen;
END
$$;
