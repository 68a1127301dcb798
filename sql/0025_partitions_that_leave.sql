-- A partition that leaves the listing that defines it (a project made inactive, a repository
-- removed from the config), or answers 404 at two syncs in a row, is gone: its rows are
-- tombstoned. See "Deletions" in docs/architecture.md.


-- The partitions of a table as the last sync listed them, and those that answered 404 (or 410)
-- since which run: a partition that answers 404 is tombstoned only when a later run still gets
-- 404, so one refused read never deletes a partition's rows.
ALTER TABLE table_state ADD COLUMN partitions text[];
ALTER TABLE table_state ADD COLUMN absent_partitions jsonb;


-- tombstone_partitions_v1: one bounded step over a table's stored rows after p_after,
-- tombstoning the live rows of the partitions in p_partitions, seen or not: those partitions are
-- gone as a whole. Returns the rows tombstoned per partition, as tombstone_unseen_v2 does.
-- Invariants: fenced (the run row is share-locked first and held until commit); bounded (the
-- step's key range is fixed before its UPDATE, so the UPDATE is an index range scan of one
-- step's keys); an intermediate write of a run, committed asynchronously (see "Durability" in
-- docs/architecture.md).
CREATE FUNCTION tombstone_partitions_v1(p_run_id bigint, p_lease_owner uuid,
                                        p_connection_id bigint, p_table text,
                                        p_partitions text[], p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned jsonb)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_gone jsonb := '{}';
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, '{}'::jsonb;
        RETURN;
    END IF;

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
               AND r.deleted_at IS NULL AND r.partition = ANY (p_partitions)
            RETURNING r.partition AS part
        )
        SELECT coalesce(jsonb_object_agg(counted.part, counted.n), '{}') INTO v_gone
          FROM (SELECT gone.part, count(*) AS n FROM gone GROUP BY gone.part) counted;
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_gone;
END
$$;
