-- What a claimed run comes back with besides its own row, written once: claim_run and
-- finish_and_claim (sql/queries.sql) both return it beside the run they claimed.
--
-- claimed_run_extras_v1(connection_id): the run's connection's name, status, config and
-- (encrypted) credentials, and its tables' incremental cursors, so the executor needs no second
-- round trip before it starts. No row when the run has no connection (a deleted one's purge
-- whose row is gone); the statements join it LEFT, so those columns are then NULL.
-- Invariant: none of its own; it reads what the claim's transaction sees.
--
-- A plpgsql function (its one statement planned once per session, as the claim's own are), so
-- the claim statements that call it plan a join with one function call instead of the select
-- list: measured against the select list written out (2,000 queued runs, one claim per
-- rolled-back transaction, 3,000 each, interleaved), the claim statement took 5-8% less time,
-- prepared or not; the connection is read by its primary key (tests/test_claim_plan.py).
-- Versioned like every function workers call (see "Upgrading" in docs/operations.md).
CREATE FUNCTION claimed_run_extras_v1(p_connection_id bigint)
RETURNS TABLE (connection_name text, connection_status text, config jsonb, credentials bytea,
               cursors jsonb)
LANGUAGE plpgsql
STABLE
ROWS 1
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT c.name, c.status, c.config, c.credentials,
           (SELECT jsonb_object_agg(s.table_name, s.cursor) FROM table_state s
             WHERE s.connection_id = c.id AND s.cursor IS NOT NULL)
      FROM connections c
     WHERE c.id = p_connection_id;
END
$$;
