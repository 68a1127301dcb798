-- Ingestions: the checkpointed job that turns one file into searchable chunks, and the lighter
-- archive expansion that turns one ZIP into member files to ingest.
--
-- 1. A document knows its source: a synced file (connection, table, the record's key, and a
--    member path inside an archive) or a local file (`connector-sync ingest PATH`), its scope,
--    what it was indexed from, and whether it is ready. Search reads ready documents only.
-- 2. `file_sources` remembers the record version of each synced file that was last queued, so a
--    file is queued again only when its record's content hash changes.
-- 3. `ingestions`: one row per ingestion of one file. kind 'document' is leased (lease owner and
--    expiry, renewed by the worker's lease keeper) and resumes at `processed_units`; kind
--    'archive' carries a `processing_since` timestamp instead of a lease.

ALTER TABLE documents
    ADD COLUMN connection_id  bigint REFERENCES connections (id) ON DELETE CASCADE,
    ADD COLUMN table_name     text,
    ADD COLUMN external_id    text,
    ADD COLUMN local_path     text,
    -- '' for the file itself; a member's path inside the archive it came from.
    ADD COLUMN member_path    text NOT NULL DEFAULT '',
    ADD COLUMN scope          text,
    -- The record's content hash (a synced file) or the bytes' SHA-256 (a local file) that the
    -- document was last indexed from, the provider's version, and the SHA-256 of the bytes.
    ADD COLUMN source_hash    bytea,
    ADD COLUMN version        text,
    ADD COLUMN content_sha256 text,
    -- The embedding model and chunk settings of the stored chunks: a change re-indexes.
    ADD COLUMN indexed_with   text,
    ADD COLUMN chunks         integer,
    ADD COLUMN status         text NOT NULL DEFAULT 'ready'
                              CHECK (status IN ('indexing', 'ready')),
    ADD COLUMN ready_at       timestamptz,
    ADD CONSTRAINT documents_one_source CHECK (connection_id IS NULL OR local_path IS NULL);

-- A file's identity as one value: its connection, table and external id, or its workspace and
-- local path (NULL for neither). Documents and ingestions are keyed by it and a member path.
CREATE FUNCTION file_source_key(p_connection_id bigint, p_table_name text, p_external_id text,
                                p_workspace_id bigint, p_local_path text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
           WHEN p_connection_id IS NOT NULL
               THEN 'file' || chr(31) || p_connection_id::text || chr(31) || p_table_name
                    || chr(31) || p_external_id
           WHEN p_local_path IS NOT NULL
               THEN 'local' || chr(31) || p_workspace_id::text || chr(31) || p_local_path
       END;

ALTER TABLE documents ADD COLUMN source_key text GENERATED ALWAYS AS (
    file_source_key(connection_id, table_name, external_id, workspace_id, local_path)) STORED;

-- One document per file (and per member of an archive file).
CREATE UNIQUE INDEX documents_of_source ON documents (source_key, member_path)
    WHERE source_key IS NOT NULL;
-- A connection's documents, for deleting those of tombstoned files.
CREATE INDEX documents_of_connection ON documents (connection_id, table_name, external_id)
    WHERE connection_id IS NOT NULL;


-- The record version of each synced file last queued for ingestion. A file whose record's
-- content hash equals the one here is not queued again; a tombstoned file's row goes with its
-- documents, so a file that comes back is indexed again.
CREATE TABLE file_sources (
    connection_id bigint NOT NULL REFERENCES connections (id) ON DELETE CASCADE,
    table_name    text NOT NULL,
    external_id   text NOT NULL,
    content_hash  bytea NOT NULL,
    queued_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connection_id, table_name, external_id)
);


CREATE TABLE ingestions (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id        bigint NOT NULL REFERENCES workspaces (id),
    kind                text NOT NULL DEFAULT 'document' CHECK (kind IN ('document', 'archive')),
    status              text NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'running', 'ready', 'skipped', 'failed',
                                          'cancelled')),
    -- The source: a synced file (connection, table, external id) or a local file (path).
    source              text NOT NULL CHECK (source IN ('file', 'local')),
    -- History outlives the connection; a deleted connection's documents go with it.
    connection_id       bigint REFERENCES connections (id) ON DELETE SET NULL,
    table_name          text,
    external_id         text,
    local_path          text,
    member_path         text NOT NULL DEFAULT '',
    -- A member's archive: the ingestion that expanded it and the SHA-256 of its bytes then.
    archive_id          bigint REFERENCES ingestions (id) ON DELETE SET NULL,
    archive_sha256      text,
    -- What was queued: the record's content hash (a synced file), the SHA-256 of the bytes (a
    -- local file or an archive member). A sync that finds the file changed again while it is
    -- being ingested updates it; the finish then sees the record moved on.
    source_hash         bytea NOT NULL,
    name                text,
    scope               text,
    document_id         bigint REFERENCES documents (id) ON DELETE SET NULL,
    -- The SHA-256 of the bytes the chunks are being made from: a later attempt whose bytes
    -- differ starts again from chunk 0.
    content_sha256      text,
    attempts            integer NOT NULL DEFAULT 0,
    max_attempts        integer NOT NULL CHECK (max_attempts >= 1),
    queued_at           timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    worker_id           text,
    lease_owner         uuid,
    lease_expires_at    timestamptz,
    processing_since    timestamptz,
    cancel_requested_at timestamptz,
    processed_units     integer NOT NULL DEFAULT 0 CHECK (processed_units >= 0),
    total_units         integer,
    results             jsonb NOT NULL DEFAULT '{}',
    error               jsonb,
    source_key          text GENERATED ALWAYS AS (
        file_source_key(connection_id, table_name, external_id, workspace_id, local_path)) STORED,
    CHECK (source <> 'local' OR local_path IS NOT NULL)
);

-- At most one pending (queued or running) ingestion per file: a file is never indexed by two
-- workers at once, and queueing a file that is already pending updates the pending one.
CREATE UNIQUE INDEX ingestions_pending ON ingestions (source_key, member_path)
    WHERE status IN ('queued', 'running') AND source_key IS NOT NULL;

-- The claims walk this in order; finished ingestions are not in it.
CREATE INDEX ingestions_claimable ON ingestions (kind, queued_at, id)
    WHERE status IN ('queued', 'running');
CREATE INDEX ingestions_by_workspace ON ingestions (workspace_id, id);
CREATE INDEX ingestions_of_archive ON ingestions (archive_id) WHERE archive_id IS NOT NULL;


-- claim_ingestion_v1: take the oldest claimable document ingestion and make it running under a
-- fresh fencing token (its lease owner). Claimable: queued and due, or running with an expired
-- lease (its worker died); a synced file's only if the claiming worker has its provider
-- (p_providers NULL: any). A reclaimed row keeps its processed_units: the next attempt resumes
-- there. An expired row that has used its last attempt is dead-lettered on the way.
-- Invariant: one live lease per ingestion; SKIP LOCKED keeps two claimers off one row.
CREATE FUNCTION claim_ingestion_v1(p_worker_id text, p_lease interval,
                                   p_providers text[] DEFAULT NULL)
RETURNS SETOF ingestions
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    candidate ingestions;
BEGIN
    FOR round IN 1..20 LOOP
        SELECT i.* INTO candidate
          FROM ingestions i
         WHERE i.kind = 'document'
           AND i.status IN ('queued', 'running')
           AND i.queued_at <= now()
           AND CASE i.status WHEN 'queued' THEN true ELSE i.lease_expires_at <= now() END
           AND (i.source = 'local' OR p_providers IS NULL OR i.connection_id IS NULL
                OR EXISTS (SELECT 1 FROM connections c
                            WHERE c.id = i.connection_id AND c.provider = ANY (p_providers)))
         ORDER BY i.kind, i.queued_at, i.id
         LIMIT 1
           FOR NO KEY UPDATE OF i SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF candidate.status = 'running' AND candidate.attempts >= candidate.max_attempts THEN
            UPDATE ingestions
               SET status = 'failed', finished_at = now(),
                   lease_owner = NULL, lease_expires_at = NULL,
                   error = jsonb_build_object(
                       'kind', 'lease_expired',
                       'message', 'the worker running the last attempt stopped renewing its lease')
             WHERE id = candidate.id;
            CONTINUE;
        END IF;
        RETURN QUERY
            UPDATE ingestions
               SET status = 'running',
                   attempts = attempts + 1,
                   lease_owner = gen_random_uuid(),
                   lease_expires_at = now() + p_lease,
                   worker_id = p_worker_id,
                   started_at = coalesce(started_at, now()),
                   error = NULL
             WHERE id = candidate.id
            RETURNING *;
        RETURN;
    END LOOP;
END
$$;


-- claim_archive_v1: take the oldest archive expansion that is queued and due, or whose
-- processing began more than p_reclaim_after ago (its worker died, or is far slower than an
-- expansion should be), and stamp processing_since. There is no lease: an expansion is quick
-- and safe to redo, and every write it makes is guarded by the processing_since it was given.
-- One that has used its last attempt is failed on the way.
CREATE FUNCTION claim_archive_v1(p_worker_id text, p_reclaim_after interval,
                                 p_providers text[] DEFAULT NULL)
RETURNS SETOF ingestions
LANGUAGE plpgsql
ROWS 1
SET search_path FROM CURRENT
SET enable_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    candidate ingestions;
BEGIN
    FOR round IN 1..20 LOOP
        SELECT i.* INTO candidate
          FROM ingestions i
         WHERE i.kind = 'archive'
           AND i.status IN ('queued', 'running')
           AND i.queued_at <= now()
           AND CASE i.status
                   WHEN 'queued' THEN true
                   ELSE i.processing_since <= now() - p_reclaim_after
               END
           AND (i.source = 'local' OR p_providers IS NULL OR i.connection_id IS NULL
                OR EXISTS (SELECT 1 FROM connections c
                            WHERE c.id = i.connection_id AND c.provider = ANY (p_providers)))
         ORDER BY i.kind, i.queued_at, i.id
         LIMIT 1
           FOR NO KEY UPDATE OF i SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF candidate.status = 'running' AND candidate.attempts >= candidate.max_attempts THEN
            UPDATE ingestions
               SET status = 'failed', finished_at = now(), processing_since = NULL,
                   error = jsonb_build_object(
                       'kind', 'abandoned',
                       'message', 'the worker expanding the archive on its last attempt never '
                                  'finished')
             WHERE id = candidate.id;
            CONTINUE;
        END IF;
        RETURN QUERY
            UPDATE ingestions
               SET status = 'running',
                   attempts = attempts + 1,
                   processing_since = clock_timestamp(),
                   worker_id = p_worker_id,
                   started_at = coalesce(started_at, now()),
                   error = NULL
             WHERE id = candidate.id
            RETURNING *;
        RETURN;
    END LOOP;
END
$$;
