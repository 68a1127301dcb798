-- Typed tables for readers: each connection's rows as typed views in a schema of its own (see
-- docs/querying.md). Runs with search_path set to the target schema, so no name below is
-- schema-qualified.
--
-- The views are built by the server-side functions below, which run as their owner (the role
-- that migrated), so the role the workers run as needs no DDL right: it calls them, fenced by
-- the run it holds, and they create nothing but the connection's schema and its views.

-- The schema a connection's views go to, when its creator chose one (else the default,
-- `<workspace>_<connection>`). Invariant: no two connections choose one schema.
ALTER TABLE connections ADD COLUMN reader_schema text
    CHECK (reader_schema ~ '^[a-z_][a-z0-9_]{0,62}$');
CREATE UNIQUE INDEX connections_reader_schema ON connections (reader_schema)
    WHERE reader_schema IS NOT NULL;

-- The schema each connection's views are in, fixed by its first build. Invariant: a schema
-- holds the views of one connection (the unique name), so a purge drops no one else's.
CREATE TABLE reader_schemas (
    connection_id  bigint PRIMARY KEY REFERENCES connections (id) ON DELETE CASCADE,
    workspace_id   bigint NOT NULL REFERENCES workspaces (id),
    name           text NOT NULL UNIQUE,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- The typed schema of each table of a connection: its view's name and its columns, as a JSON
-- array of {"path": [field, ...], "column": name, "type": type, "from": "model"|"data"} in
-- column order. Invariant: the views in the database are the ones these columns describe (both
-- are written in the transaction of publish_typed_table_v1).
CREATE TABLE typed_tables (
    connection_id  bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    table_name     text NOT NULL,
    view_name      text NOT NULL,
    columns        jsonb NOT NULL,
    version        integer NOT NULL CHECK (version >= 1),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, table_name),
    UNIQUE (connection_id, view_name)
);

-- Every change of a typed schema: the columns added and widened, by which run. Version 1 is the
-- first build.
CREATE TABLE typed_table_changes (
    connection_id  bigint NOT NULL,
    table_name     text NOT NULL,
    version        integer NOT NULL,
    run_id         bigint,
    changes        jsonb NOT NULL,
    changed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, table_name, version),
    FOREIGN KEY (connection_id, table_name) REFERENCES typed_tables (connection_id, table_name)
        ON DELETE CASCADE
);

-- The roles that may read a workspace's typed views (`connector-sync grant --read-only`).
-- Invariant: every view a build creates is granted to each of them in the same transaction.
CREATE TABLE reader_grants (
    workspace_id  bigint NOT NULL REFERENCES workspaces (id),
    role          name NOT NULL,
    granted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, role)
);


-- typed_column_sql_v1: the select-list entry of one typed column. The type is one of a fixed
-- list and every name is quoted by format(), so nothing in a column description becomes SQL.
CREATE FUNCTION typed_column_sql_v1(p_column jsonb)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
AS $$
DECLARE
    v_path text[] := ARRAY(SELECT jsonb_array_elements_text(p_column -> 'path'));
    v_type text := p_column ->> 'type';
    v_text text;
BEGIN
    IF v_type IS NULL OR v_type NOT IN ('text', 'jsonb', 'bigint', 'numeric', 'boolean', 'date',
                                        'timestamptz') THEN
        RAISE EXCEPTION 'no typed column of type %', v_type;
    END IF;
    IF cardinality(v_path) = 1 THEN
        v_text := format('r.data ->> %L', v_path[1]);
    ELSE
        v_text := format('r.data #>> %L', v_path);
    END IF;
    RETURN CASE v_type
        WHEN 'text' THEN v_text
        WHEN 'jsonb' THEN CASE WHEN cardinality(v_path) = 1
                               THEN format('r.data -> %L', v_path[1])
                               ELSE format('r.data #> %L', v_path) END
        WHEN 'bigint' THEN format('(%s)::bigint', v_text)
        WHEN 'numeric' THEN format('(%s)::numeric', v_text)
        WHEN 'boolean' THEN format('(%s)::boolean', v_text)
        WHEN 'date' THEN format('(%s)::date', v_text)
        ELSE format('(%s)::timestamptz', v_text)
    END || format(' AS %I', p_column ->> 'column');
END
$$;


-- typed_value_fits_v1: whether a stored JSON value reads as `p_type` in a typed view (null fits
-- every type). Checks the shape the sync's own typing gives a type, so a column typed from a
-- sample of rows stored before its first build is widened where another stored row would not
-- cast. An inlinable SQL expression.
CREATE FUNCTION typed_value_fits_v1(p_value jsonb, p_type text)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT p_value IS NULL OR jsonb_typeof(p_value) = 'null' OR CASE p_type
        WHEN 'text' THEN jsonb_typeof(p_value) NOT IN ('object', 'array')
        WHEN 'jsonb' THEN true
        WHEN 'boolean' THEN jsonb_typeof(p_value) = 'boolean'
        WHEN 'bigint' THEN jsonb_typeof(p_value) = 'number'
                           AND p_value::text ~ '^-?[0-9]{1,18}$'
        WHEN 'numeric' THEN jsonb_typeof(p_value) = 'number'
                            OR (p_value #>> '{}') ~ '^-?[0-9]+(\.[0-9]+)?$'
        WHEN 'date' THEN (p_value #>> '{}') ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'
        WHEN 'timestamptz' THEN (p_value #>> '{}')
            ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]+)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)$'
        ELSE false
    END
$$;


-- reader_schema_v1: the schema of a connection's views, created on its first call. Invariant:
-- the name is the connection's own (reader_schemas is unique by name) and no schema that
-- exists already is taken over: the chosen name, else `p_default`, else `p_fallback` (the
-- default with the connection's id), else an error.
CREATE FUNCTION reader_schema_v1(p_connection_id bigint, p_default text, p_fallback text)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_name text;
    v_chosen text;
    v_workspace bigint;
BEGIN
    SELECT name INTO v_name FROM reader_schemas WHERE connection_id = p_connection_id;
    IF FOUND THEN
        RETURN v_name;
    END IF;
    SELECT reader_schema, workspace_id INTO v_chosen, v_workspace
      FROM connections WHERE id = p_connection_id;
    FOREACH v_name IN ARRAY CASE WHEN v_chosen IS NOT NULL THEN ARRAY[v_chosen]
                                 ELSE ARRAY[p_default, p_fallback] END LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = v_name)
           AND NOT EXISTS (SELECT 1 FROM reader_schemas WHERE name = v_name) THEN
            INSERT INTO reader_schemas (connection_id, workspace_id, name)
            VALUES (p_connection_id, v_workspace, v_name);
            EXECUTE format('CREATE SCHEMA %I', v_name);
            EXECUTE format('COMMENT ON SCHEMA %I IS %L', v_name,
                           'Typed views of connection ' || p_connection_id
                           || ', kept by connector-sync: read them, do not change them');
            RETURN v_name;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'schema "%" exists already and holds no views of this connection: drop or '
                    'rename it, and the next sync builds the views there', v_name
        USING ERRCODE = 'duplicate_schema';
END
$$;


-- publish_typed_table_v1: one table's typed views as `p_columns` describe them, with their
-- stored description, its history and the readers' grants, in the caller's transaction.
-- Invariants: fenced by the run (nothing changes unless the caller's lease is live, and the
-- FOR SHARE holds it to commit); a reader sees the views before or after, never between (one
-- CREATE OR REPLACE VIEW when columns are only added at the end, else a drop and a create in
-- this one transaction, `p_recreate`); the views never show another connection's or table's
-- rows (the security barrier keeps a reader's functions from seeing the rows they filter out).
CREATE FUNCTION publish_typed_table_v1(
    p_run_id bigint, p_lease_owner uuid, p_connection_id bigint, p_table_name text,
    p_default_schema text, p_fallback_schema text, p_view text, p_columns jsonb,
    p_recreate boolean, p_changes jsonb
)
RETURNS TABLE (fenced boolean, schema_name text, version integer)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_schema text;
    v_version integer;
    v_meta text := 'r.external_id AS _key, r.updated_at AS _synced_at, '
                   'r.first_seen_at AS _first_seen_at';
    v_select text;
    v_role name;
    v_all text := p_view || '__all';
    v_from text;
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner) FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, NULL::text, NULL::integer;
        RETURN;
    END IF;
    v_schema := reader_schema_v1(p_connection_id, p_default_schema, p_fallback_schema);
    -- The meta columns first (the companion's _deleted_at among them), so that a column added
    -- later comes at the end of both views.
    SELECT coalesce(string_agg(', ' || typed_column_sql_v1(c), '' ORDER BY n), '')
      INTO v_select
      FROM jsonb_array_elements(p_columns) WITH ORDINALITY AS e (c, n);
    v_from := format(' FROM %I.records r WHERE r.connection_id = %s AND r.table_name = %L',
                     current_schema(), p_connection_id, p_table_name);
    IF p_recreate THEN
        EXECUTE format('DROP VIEW IF EXISTS %I.%I, %I.%I', v_schema, p_view, v_schema, v_all);
    END IF;
    EXECUTE format('CREATE OR REPLACE VIEW %I.%I WITH (security_barrier) AS SELECT %s%s%s '
                   'AND r.deleted_at IS NULL', v_schema, p_view, v_meta, v_select, v_from);
    EXECUTE format('CREATE OR REPLACE VIEW %I.%I WITH (security_barrier) AS SELECT %s, '
                   'r.deleted_at AS _deleted_at%s%s', v_schema, v_all, v_meta, v_select, v_from);
    -- A granted role dropped since is skipped (its row stays, harmless).
    FOR v_role IN SELECT g.role FROM reader_grants g
                    JOIN reader_schemas s ON s.workspace_id = g.workspace_id
                    JOIN pg_roles pr ON pr.rolname = g.role
                   WHERE s.connection_id = p_connection_id LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', v_schema, v_role);
        EXECUTE format('GRANT SELECT ON %I.%I, %I.%I TO %I',
                       v_schema, p_view, v_schema, v_all, v_role);
    END LOOP;
    INSERT INTO typed_tables AS t (connection_id, table_name, view_name, columns, version)
    VALUES (p_connection_id, p_table_name, p_view, p_columns, 1)
    ON CONFLICT (connection_id, table_name) DO UPDATE
       SET view_name = EXCLUDED.view_name, columns = EXCLUDED.columns,
           version = t.version + 1, updated_at = now()
    RETURNING t.version INTO v_version;
    INSERT INTO typed_table_changes (connection_id, table_name, version, run_id, changes)
    VALUES (p_connection_id, p_table_name, v_version, p_run_id, p_changes);
    RETURN QUERY SELECT true, v_schema, v_version;
END
$$;


-- drop_reader_schema_v1: the purge's end for a connection's views: its schema dropped with
-- everything in it. Fenced by the purge run; true if the fence held.
CREATE FUNCTION drop_reader_schema_v1(p_run_id bigint, p_lease_owner uuid, p_connection_id bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_name text;
BEGIN
    PERFORM 1 FROM connection_runs r
     WHERE run_fence_v1(r, p_run_id, p_lease_owner) FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM reader_schemas WHERE connection_id = p_connection_id RETURNING name INTO v_name;
    IF v_name IS NOT NULL THEN
        EXECUTE format('DROP SCHEMA IF EXISTS %I CASCADE', v_name);
    END IF;
    DELETE FROM typed_tables WHERE connection_id = p_connection_id;
    RETURN true;
END
$$;


-- grant_reader_v1: `p_role` may read the typed views of workspace `p_workspace_id`, those there
-- are and those builds add later, and nothing else of connector-sync. Invariant: the grant
-- names only the workspace's own schemas.
CREATE FUNCTION grant_reader_v1(p_workspace_id bigint, p_role name)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_schema text;
    v_count integer := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        RAISE EXCEPTION 'role "%" does not exist; create it first (CREATE ROLE ... LOGIN)', p_role
            USING ERRCODE = 'undefined_object';
    END IF;
    INSERT INTO reader_grants (workspace_id, role) VALUES (p_workspace_id, p_role)
    ON CONFLICT DO NOTHING;
    FOR v_schema IN SELECT name FROM reader_schemas WHERE workspace_id = p_workspace_id LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', v_schema, p_role);
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA %I TO %I', v_schema, p_role);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END
$$;

-- Only a role given the engine's data rights (connector-sync grant ROLE) calls these.
REVOKE EXECUTE ON FUNCTION reader_schema_v1(bigint, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION publish_typed_table_v1(bigint, uuid, bigint, text, text, text, text,
                                                  jsonb, boolean, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION drop_reader_schema_v1(bigint, uuid, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION grant_reader_v1(bigint, name) FROM PUBLIC;
