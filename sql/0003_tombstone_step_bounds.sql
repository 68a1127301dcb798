-- tombstone_unseen, redefined: a step's key range is fixed before its UPDATE runs.
--
-- In 0002 the step's upper key came from a CTE, which the UPDATE could only apply as a filter
-- (with nested loops off there is no parameterised scan to carry it): each step read the
-- table's stored rows and seen keys from p_after to the *end* of the table, so a pass over N rows
-- read about N^2 / (2 * p_limit) rows. Measured with 1 M stored rows: 169-185 s for a 1 % resync,
-- most of it in this pass. Here the range is computed first, into variables, and both scans of
-- the UPDATE are index range scans (p_after, v_hi]: each step reads about p_limit rows of each.
--
-- Invariants, as before: fenced (the run row is share-locked first and held until commit);
-- bounded; linear (nested loops off: run_seen_keys never has statistics for this attempt); the
-- step that reaches the end of the table stamps last_full_sync_at.
CREATE OR REPLACE FUNCTION tombstone_unseen(p_run_id bigint, p_lease_owner uuid,
                                            p_connection_id bigint, p_table text,
                                            p_after text, p_limit integer)
RETURNS TABLE (fenced boolean, last_key text, scanned bigint, tombstoned bigint)
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_nestloop = off
-- The cost penalty that turns nested loops off would otherwise trip JIT compilation (0.4 s).
SET jit = off
AS $$
DECLARE
    v_hi text;
    v_n bigint;
    v_gone bigint := 0;
BEGIN
    -- An intermediate write of a run: see "Durability" in docs/architecture.md.
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE r.id = p_run_id AND r.lease_owner = p_lease_owner AND r.status = 'running'
       AND r.lease_expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, 0::bigint, 0::bigint;
        RETURN;
    END IF;

    SELECT max(span.external_id), count(*) INTO v_hi, v_n
      FROM (SELECT s.external_id FROM records s
             WHERE s.connection_id = p_connection_id AND s.table_name = p_table
               AND s.external_id > p_after
             ORDER BY s.external_id
             LIMIT p_limit) span;

    IF v_n > 0 THEN
        UPDATE records r
           SET deleted_at = now(), updated_at = now(), written_by = p_lease_owner
         WHERE r.connection_id = p_connection_id AND r.table_name = p_table
           AND r.external_id > p_after AND r.external_id <= v_hi
           AND r.deleted_at IS NULL AND r.written_by <> p_lease_owner
           AND NOT EXISTS (SELECT 1 FROM run_seen_keys k
                            WHERE k.lease_owner = p_lease_owner AND k.table_name = p_table
                              AND k.external_id > p_after AND k.external_id <= v_hi
                              AND k.external_id = r.external_id);
        GET DIAGNOSTICS v_gone = ROW_COUNT;
    END IF;

    IF v_n < p_limit THEN
        INSERT INTO table_state (connection_id, table_name, last_full_sync_at)
        VALUES (p_connection_id, p_table, now())
        ON CONFLICT (connection_id, table_name) DO UPDATE
           SET last_full_sync_at = now(), updated_at = now();
    END IF;

    RETURN QUERY SELECT true, v_hi, v_n, v_gone;
END
$$;
