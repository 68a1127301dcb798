-- Fewer round trips at the end of a table and of a run.
--
-- finish_run_v4 / finish_and_claim_v4: finish_run_v3 / finish_and_claim_v3
-- (0013_lane_parking.sql) that also write the attempt's own counts on its history row, so the
-- finish is one statement (before, a second statement sent in the same pipeline replaced the
-- run's totals there with the attempt's counts).
--
-- seen_keys_intact_v1, complete_table_v1 and end_table_v1: the end of a table's read, which
-- took three round trips (are the seen keys intact, the first tombstone step, stamp the complete
-- pass), in one call when the table's live rows fit in one tombstone step.
--
-- Versioned like every function workers call (see "Upgrading" in docs/operations.md): the _v3
-- finishes stay for workers of the release before.


-- finish_run_v4: finish_run_v3() with p_attempt_results, the attempt's own counts, written on
-- its history row (p_results, the run's totals over all its attempts, go on the run). Fenced by
-- run_fence_v1: a stale owner's finish matches nothing and returns NULL.
CREATE FUNCTION finish_run_v4(p_run_id bigint, p_lease_owner uuid, p_status text, p_results jsonb,
                              p_attempt_results jsonb, p_error jsonb, p_processed_units bigint,
                              p_disconnect boolean, p_wake boolean DEFAULT true)
RETURNS connection_runs
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_run connection_runs;
BEGIN
    UPDATE connection_runs
       SET status = p_status, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
           results = p_results, error = p_error,
           processed_units = coalesce(p_processed_units, processed_units)
     WHERE run_fence_v1(connection_runs, p_run_id, p_lease_owner)
    RETURNING * INTO v_run;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE run_attempts
       SET finished_at = clock_timestamp(), outcome = p_status, error = p_error,
           results = p_attempt_results
     WHERE lease_owner = p_lease_owner;
    IF p_disconnect THEN
        UPDATE connections SET status = 'disconnected', updated_at = now()
         WHERE id = v_run.connection_id AND status = 'active';
    END IF;
    IF p_wake THEN
        PERFORM wake_for_freed_lane_v3(v_run.workspace_id, v_run.provider, v_run.kind,
                                       v_run.connection_id);
    END IF;
    RETURN v_run;
END
$$;


-- finish_and_claim_v4: finish_run_v4(), then claim_run_v3(), in one call, then the wake-up for
-- the finished run's lane: after the claim, so a run this worker took itself wakes nobody.
CREATE FUNCTION finish_and_claim_v4(p_run_id bigint, p_lease_owner uuid, p_status text,
                                    p_results jsonb, p_attempt_results jsonb, p_error jsonb,
                                    p_processed_units bigint, p_disconnect boolean,
                                    p_worker_id text, p_lease interval,
                                    p_providers text[] DEFAULT NULL,
                                    p_wakeable boolean DEFAULT false)
RETURNS TABLE (sealed boolean, claimed connection_runs)
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
AS $$
DECLARE
    v_done connection_runs;
    v_next connection_runs;
BEGIN
    v_done := finish_run_v4(p_run_id, p_lease_owner, p_status, p_results, p_attempt_results,
                            p_error, p_processed_units, p_disconnect, false);
    sealed := v_done.id IS NOT NULL;
    SELECT * INTO v_next FROM claim_run_v3(p_worker_id, p_lease, p_providers, p_wakeable);
    IF sealed THEN
        PERFORM wake_for_freed_lane_v3(v_done.workspace_id, v_done.provider, v_done.kind,
                                       v_done.connection_id);
    END IF;
    claimed := v_next;
    RETURN NEXT;
END
$$;


-- seen_keys_intact_v1: whether the seen keys this run saved for a table are all still there.
-- run_seen_keys is unlogged, and a crash restart of Postgres empties it; the checkpoints counted
-- the keys each batch saved in the batch's own transaction, and they are logged.
-- Invariant: a table whose seen keys were lost is never tombstoned by them.
CREATE FUNCTION seen_keys_intact_v1(p_run_id bigint, p_table text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path FROM CURRENT
AS $$
    SELECT (SELECT count(*) FROM run_seen_keys k
             WHERE k.run_id = p_run_id AND k.table_name = p_table)
        >= (SELECT coalesce(sum(c.seen), 0) FROM run_checkpoints c
             WHERE c.run_id = p_run_id AND c.table_name = p_table)
$$;


-- complete_table_v1: the end of a table's tombstone pass: stamps each partition in p_whole
-- (partitions read completely in this run) in complete_passes, so a partition that keeps
-- failing holds back no other's periodic complete pass, and last_full_sync_at when p_stamp
-- (every partition was); drops the table's seen keys, which nothing reads any more.
-- Fenced: returns false, and changes nothing, when this claim no longer holds the run.
CREATE FUNCTION complete_table_v1(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                                  p_table text, p_whole text[], p_stamp boolean)
RETURNS boolean
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_stamp OR cardinality(p_whole) > 0 THEN
        INSERT INTO table_state AS s (connection_id, table_name, last_full_sync_at,
                                      complete_passes)
        SELECT p_connection_id, p_table, CASE WHEN p_stamp THEN now() END,
               coalesce(jsonb_object_agg(p, now()) FILTER (WHERE p IS NOT NULL), '{}')
          FROM unnest(p_whole) p
        ON CONFLICT (connection_id, table_name) DO UPDATE
           SET last_full_sync_at = coalesce(EXCLUDED.last_full_sync_at, s.last_full_sync_at),
               complete_passes = coalesce(s.complete_passes, '{}') || EXCLUDED.complete_passes,
               updated_at = now();
    END IF;
    DELETE FROM run_seen_keys WHERE run_id = p_run_id AND table_name = p_table;
    RETURN true;
END
$$;


-- end_table_v1: the end of a table read completely in this run (every slice done or failed for
-- good), in one call: the seen-key check of seen_keys_intact_v1; the first step of the
-- tombstone pass (tombstone_unseen_v2, over p_partitions, NULL for the whole table); and, when
-- that step reached the end of the table's rows, complete_table_v1. `intact` false: the seen keys
-- were lost, and nothing was written. `completed` false: more steps follow (tombstone_unseen_v2
-- from last_key), then complete_table_v1.
-- Invariants: fenced (the run row is share-locked first and held until commit); never tombstones
-- by lost seen keys; bounded like one tombstone step. An intermediate write of a run: committed
-- asynchronously (see "Durability" in docs/architecture.md).
CREATE FUNCTION end_table_v1(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint,
                             p_table text, p_partitions text[], p_whole text[], p_stamp boolean,
                             p_limit integer)
RETURNS TABLE (fenced boolean, intact boolean, last_key text, scanned bigint, tombstoned jsonb,
               completed boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_step record;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner)
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, false, NULL::text, 0::bigint, '{}'::jsonb, false;
        RETURN;
    END IF;
    IF NOT seen_keys_intact_v1(p_run_id, p_table) THEN
        RETURN QUERY SELECT true, false, NULL::text, 0::bigint, '{}'::jsonb, false;
        RETURN;
    END IF;
    SELECT * INTO v_step
      FROM tombstone_unseen_v2(p_run_id, p_lease_owner, p_connection_id, p_table, p_partitions,
                               '', p_limit);
    completed := v_step.scanned < p_limit OR v_step.last_key IS NULL;
    IF completed THEN
        PERFORM complete_table_v1(p_run_id, p_lease_owner, p_connection_id, p_table, p_whole,
                                  p_stamp);
    END IF;
    RETURN QUERY SELECT true, true, v_step.last_key, v_step.scanned, v_step.tombstoned, completed;
END
$$;
