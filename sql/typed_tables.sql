-- The statements of typed tables for readers (see docs/querying.md): a table's stored typed
-- schema, a sample of its rows to infer one from, the build of its views, and what `schema
-- show` and `grant --read-only` need. The views themselves are written by the functions of
-- 0003_typed_tables.sql.

-- name: typed_table
-- A table's typed schema as its views show it now (none before its first build).
SELECT view_name, columns, version FROM typed_tables
 WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s;

-- name: typed_view_names
-- The views of the connection's other tables, companions included: a new table's view takes
-- none of these names.
SELECT v.name
  FROM typed_tables t, LATERAL (VALUES (t.view_name), (t.view_name || '__all')) AS v (name)
 WHERE t.connection_id = %(connection_id)s AND t.table_name <> %(table_name)s;

-- name: sample_records
-- A bounded sample of a table's stored rows, tombstones included (the companion view shows
-- them), the latest written first: the types of a table's first build over rows stored before.
SELECT data FROM records
 WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
 ORDER BY updated_at DESC
 LIMIT %(limit)s;

-- name: stored_misfits
-- Which typed columns (by their 1-based place in %(columns)s) some stored row of the table does
-- not fit, and whether one holds an object or a list there: the first build of a table whose
-- rows were stored before it widens those, so no view casts a value it cannot show. One scan.
SELECT c.ord::int AS ord,
       bool_or(jsonb_typeof(r.data #> c.path) IN ('object', 'array')) AS nested
  FROM records r
 CROSS JOIN (SELECT x.ord, ARRAY(SELECT jsonb_array_elements_text(x.col -> 'path')) AS path,
                    x.col ->> 'type' AS type
               FROM jsonb_array_elements(%(columns)s) WITH ORDINALITY AS x (col, ord)) c
 WHERE r.connection_id = %(connection_id)s AND r.table_name = %(table_name)s
   AND NOT typed_value_fits_v1(r.data #> c.path, c.type)
 GROUP BY c.ord;

-- name: connection_names
-- The names the default schema of a connection is made of.
SELECT w.name AS workspace, c.name AS connection
  FROM connections c JOIN workspaces w ON w.id = c.workspace_id
 WHERE c.id = %(connection_id)s;

-- name: publish_typed_table
-- A table's views as its columns say, fenced by the run: nothing changes (fenced false) once
-- the run's lease is lost. One transaction: a reader sees the views before or after.
SELECT fenced, schema_name, version
  FROM publish_typed_table_v1(%(run_id)s, %(lease_owner)s, %(connection_id)s, %(table_name)s,
                              %(default_schema)s, %(fallback_schema)s, %(view_name)s,
                              %(columns)s, %(recreate)s, %(changes)s);

-- name: drop_reader_schema
-- A purged connection's schema goes with its views; fenced by the purge run.
SELECT drop_reader_schema_v1(%(run_id)s, %(lease_owner)s, %(connection_id)s) AS fenced;

-- name: reader_schema_of
-- The schema a connection's views are in (none before its first build).
SELECT name FROM reader_schemas WHERE connection_id = %(connection_id)s;

-- name: typed_tables_of
-- Every typed table of a connection, or one, for `schema show`.
SELECT t.table_name, t.view_name, t.columns, t.version, t.updated_at
  FROM typed_tables t
 WHERE t.connection_id = %(connection_id)s
   AND (%(table_name)s::text IS NULL OR t.table_name = %(table_name)s)
 ORDER BY t.table_name;

-- name: typed_table_history
-- The changes of a connection's typed tables (or one's), oldest first.
SELECT table_name, version, run_id, changes, changed_at FROM typed_table_changes
 WHERE connection_id = %(connection_id)s
   AND (%(table_name)s::text IS NULL OR table_name = %(table_name)s)
 ORDER BY table_name, version;

-- name: grant_reader
-- A role reads the typed views of one workspace, those built later too, and nothing else.
SELECT grant_reader_v1(%(workspace_id)s, %(role)s) AS schemas;

-- name: set_reader_schema
-- The schema a connection's views will be in, chosen before its first build. Invariant: a
-- connection whose views are built keeps its schema (the row of reader_schemas says which).
UPDATE connections c SET reader_schema = %(reader_schema)s
 WHERE c.id = %(connection_id)s
   AND NOT EXISTS (SELECT 1 FROM reader_schemas s WHERE s.connection_id = c.id)
RETURNING c.id;
