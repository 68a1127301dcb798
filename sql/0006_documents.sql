-- Documents and their chunks, for search: each chunk's text, page, embedding and tsvector.
--
-- Embeddings are stored with pgvector where it can be had, else in a real[] column. The choice
-- is made here, once per schema:
--   1. the `vector` extension is already installed in this database, in any schema: use it;
--   2. else, if the server has it and this role may create it: create it, in this schema;
--   3. else (no pgvector on the server, or a role that may not create extensions): real[].
-- Two functions hide the difference from every statement in sql/documents.sql:
-- document_embedding(real[]) makes a column value, document_similarity(column, real[]) gives
-- the cosine similarity (0 when either vector is all zeros). docs/documents.md says how to move
-- a real[] schema to pgvector later.

CREATE TABLE documents (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id bigint NOT NULL REFERENCES workspaces (id),
    name         text NOT NULL CHECK (name <> ''),
    media_type   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- The target of the chunks' (document_id, workspace_id) key: a chunk is always in the
    -- workspace of its document.
    UNIQUE (id, workspace_id)
);

CREATE INDEX documents_workspace ON documents (workspace_id);

CREATE TABLE document_chunks (
    document_id     bigint NOT NULL,
    workspace_id    bigint NOT NULL,
    chunk_index     integer NOT NULL CHECK (chunk_index >= 0),
    page            integer NOT NULL CHECK (page >= 1),
    text            text NOT NULL,
    -- The vector space of `embedding` (see sync/documents/embeddings.py); a search compares
    -- only vectors of its own model.
    embedding_model text NOT NULL,
    embedding       real[] NOT NULL,  -- the pgvector type instead, where chosen (below)
    tsv             tsvector GENERATED ALWAYS AS (to_tsvector('simple', text)) STORED,
    PRIMARY KEY (document_id, chunk_index),
    FOREIGN KEY (document_id, workspace_id) REFERENCES documents (id, workspace_id)
        ON DELETE CASCADE
);

-- A search reads one workspace's chunks of one model (the vector side), and the chunks whose
-- words match (the full-text side).
CREATE INDEX document_chunks_workspace ON document_chunks (workspace_id, embedding_model);
CREATE INDEX document_chunks_tsv ON document_chunks USING gin (tsv);

CREATE FUNCTION document_embedding(v real[]) RETURNS real[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN v;

CREATE FUNCTION document_similarity(a real[], b real[]) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (SELECT coalesce(sum(x::float8 * y) / nullif(sqrt(sum(x::float8 * x))
                                                   * sqrt(sum(y::float8 * y)), 0), 0)
          FROM unnest(a, b) AS t (x, y));

DO $$
DECLARE
    v_schema text;
BEGIN
    SELECT n.nspname INTO v_schema
      FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
     WHERE e.extname = 'vector';
    IF v_schema IS NULL AND EXISTS (SELECT 1 FROM pg_available_extensions
                                     WHERE name = 'vector') THEN
        BEGIN
            EXECUTE format('CREATE EXTENSION vector SCHEMA %I', current_schema());
            v_schema := current_schema();
        EXCEPTION WHEN insufficient_privilege OR undefined_file THEN
            RAISE NOTICE 'pgvector is on the server but cannot be created here (%); '
                         'embeddings are stored as real[]', SQLERRM;
        END;
    END IF;
    IF v_schema IS NULL THEN
        RETURN;
    END IF;
    EXECUTE format('ALTER TABLE document_chunks ALTER COLUMN embedding TYPE %1$I.vector '
                   'USING embedding::%1$I.vector', v_schema);
    DROP FUNCTION document_similarity(real[], real[]);
    DROP FUNCTION document_embedding(real[]);
    EXECUTE format('CREATE FUNCTION document_embedding(v real[]) RETURNS %1$I.vector '
                   'LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN v::%1$I.vector', v_schema);
    -- pgvector's cosine distance is NaN when a vector is all zeros; similarity 0 instead.
    EXECUTE format('CREATE FUNCTION document_similarity(a %1$I.vector, b real[]) '
                   'RETURNS double precision LANGUAGE sql IMMUTABLE PARALLEL SAFE '
                   'RETURN coalesce(nullif(1 - (a OPERATOR(%1$I.<=>) b::%1$I.vector), ''NaN''), 0)',
                   v_schema);
END
$$;
