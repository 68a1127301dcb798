-- Named statements for connections that reach Postgres through a transaction pooler
-- (PgBouncer in `pool_mode = transaction`), called from sync/store/transaction_pooler.py. Behind
-- such a pooler each transaction may run on another server connection, so nothing set for a
-- session survives: the engine's settings are sent again at the start of every transaction.
-- Same form as queries.sql: `-- name:`, the invariant it protects, one statement.


-- name: bind_transaction_settings
-- The engine's session settings, for this transaction only (`set_config(..., true)` is SET
-- LOCAL). Invariant: every statement the engine sends through a transaction pooler runs with
-- its schema first on the search path and bounded by its statement, lock and
-- idle-in-transaction timeouts, with JIT off, whichever server connection the pooler gave it;
-- and none of it outlives the transaction to reach the next client of that server connection.
SELECT set_config('search_path', %(search_path)s, true),
       set_config('statement_timeout', %(statement_timeout)s, true),
       set_config('lock_timeout', %(lock_timeout)s, true),
       set_config('idle_in_transaction_session_timeout', %(idle_in_transaction_session_timeout)s, true),
       set_config('jit', %(jit)s, true);
