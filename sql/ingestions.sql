-- Named statements of ingestions (sync/ingestions/store.py), in the format of queries.sql. An
-- ingestion's writes are fenced by its lease owner: each statement re-checks, on the ingestion
-- row, the owner, status 'running' and a live lease, written once as ingestion_fence_v1
-- (0001_baseline.sql), and locks the row until commit, so no claim can slip
-- between the check and the write. The ends too: a worker whose lease ran out ends nothing,
-- even before another worker has claimed the ingestion. An archive expansion has no lease;
-- its writes are guarded by the processing_since its claim stamped instead.


-- name: queue_local_ingestion
-- Queues the ingestion of a local file of a workspace that is not deleted; one already pending
-- for that path is returned, updated to the bytes now on disk.
INSERT INTO ingestions (workspace_id, source, local_path, name, scope, source_hash,
                        content_sha256, max_attempts)
SELECT w.id, 'local', %(path)s, %(name)s, %(scope)s, %(source_hash)s, NULL, %(max_attempts)s
  FROM workspaces w
 WHERE w.id = %(workspace_id)s AND w.deleted_at IS NULL
ON CONFLICT (source_key, member_path)
   WHERE status IN ('queued', 'running') AND source_key IS NOT NULL
DO UPDATE SET source_hash = EXCLUDED.source_hash
RETURNING *;

-- name: claim_ingestion
-- The claim of one document ingestion (claim_ingestion_v1), with its connection, in one round
-- trip. Invariant: one live lease per ingestion, its owner a fresh fencing token.
SELECT i.*, c.provider, c.config, c.credentials, c.status AS connection_status, c.budget_key
  FROM claim_ingestion_v1(%(worker_id)s, %(lease)s, %(providers)s) i
  LEFT JOIN connections c ON c.id = i.connection_id;

-- name: claim_archive
-- The claim of one archive expansion (claim_archive_v1), with its connection.
SELECT i.*, c.provider, c.config, c.credentials, c.status AS connection_status, c.budget_key
  FROM claim_archive_v1(%(worker_id)s, %(reclaim_after)s, %(providers)s) i
  LEFT JOIN connections c ON c.id = i.connection_id;

-- name: renew_ingestion_lease
-- Extends the lease of an ingestion this claim still owns. Zero rows: the lease is lost (it
-- expired, or another worker claimed the ingestion) and the worker stops at once. An expired
-- lease is never revived: another worker may already be claiming it.
UPDATE ingestions SET lease_expires_at = now() + %(lease)s
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
RETURNING lease_expires_at;

-- name: read_ingestion_control
-- What the lease keeper polls: no row means the lease is lost; stop means a cancel was asked
-- for, or the file's connection is gone or being deleted.
SELECT i.cancel_requested_at IS NOT NULL
       OR (i.source = 'file' AND NOT EXISTS (
               SELECT 1 FROM connections c
                WHERE c.id = i.connection_id AND c.status <> 'deleting')) AS cancel_requested
  FROM ingestions i
 WHERE ingestion_fence_v1(i, %(ingestion_id)s, %(lease_owner)s);

-- name: file_record
-- The stored record of a synced file, tombstoned or not (no row: never synced, or purged).
SELECT data, content_hash, deleted_at FROM records
 WHERE connection_id = %(connection_id)s AND table_name = %(table_name)s
   AND external_id = %(external_id)s;

-- name: document_of_source
-- The document a file (or an archive member) is indexed into, if it has one yet.
SELECT id, status, scope, version, content_sha256, indexed_with, chunks FROM documents
 WHERE source_key = file_source_key(%(connection_id)s, %(table_name)s, %(external_id)s,
                                    %(workspace_id)s, %(local_path)s)
   AND member_path = %(member_path)s;

-- name: begin_ingestion
-- An attempt's first write, fenced: the file's document (made now if it has none) is marked
-- indexing, and the ingestion records it, the file's name and scope, the SHA-256 of the bytes
-- it indexes, the embedding model and chunk settings it indexes them with, and how many chunks
-- they make. Its processed_units is kept when the bytes and the settings are those an earlier
-- attempt worked with (it resumes there), and set to 0 when either differs: the chunks of other
-- bytes, or of other settings, are another list, and a document never mixes two models.
WITH fence AS (
    SELECT i.* FROM ingestions i
     WHERE ingestion_fence_v1(i, %(ingestion_id)s, %(lease_owner)s)
       FOR NO KEY UPDATE
), doc AS (
    INSERT INTO documents AS d (workspace_id, name, media_type, connection_id, table_name,
                                external_id, local_path, member_path, scope, status)
    SELECT f.workspace_id, %(name)s, %(media_type)s, f.connection_id, f.table_name,
           f.external_id, f.local_path, f.member_path, %(scope)s, 'indexing'
      FROM fence f
    ON CONFLICT (source_key, member_path) WHERE source_key IS NOT NULL DO UPDATE
       SET status = 'indexing', name = EXCLUDED.name, media_type = EXCLUDED.media_type
    RETURNING d.id
)
UPDATE ingestions i
   SET document_id = doc.id, name = %(name)s, scope = %(scope)s,
       content_sha256 = %(content_sha256)s, indexed_with = %(indexed_with)s,
       total_units = %(total_units)s,
       processed_units = CASE WHEN i.content_sha256 IS NOT DISTINCT FROM %(content_sha256)s
                               AND i.indexed_with IS NOT DISTINCT FROM %(indexed_with)s
                              THEN least(i.processed_units, %(total_units)s) ELSE 0 END,
       results = i.results || %(results)s
  FROM doc
 WHERE i.id = %(ingestion_id)s
RETURNING i.processed_units, i.document_id;

-- name: record_ingestion_batch
-- The fence of one batch's transaction, and its checkpoint: the new processed_units, written
-- only while this claim holds the ingestion, with the row locked until the batch's chunks are
-- written in the same transaction, and only onto the checkpoint the batch follows
-- (from_units): batches commit without waiting for their WAL flush, so a crash may lose the
-- last ones while the worker goes on, and a checkpoint moved past them would leave a hole of
-- chunks in a document marked ready. Zero rows: the lease is lost; advanced = false: the
-- checkpoint is not the one the batch follows (checkpoint says where it is), and nothing is
-- written. cancel_requested: stop here. It also renews the lease, in the row update it makes
-- anyway: under the same conditions as renew_ingestion_lease (this owner, running, a live
-- lease), so an expired lease is never revived, and a batch's progress is proof of life even
-- when the lease keeper is slow.
WITH held AS (
    SELECT i.id, i.processed_units, i.cancel_requested_at FROM ingestions i
     WHERE ingestion_fence_v1(i, %(ingestion_id)s, %(lease_owner)s)
       FOR NO KEY UPDATE
), moved AS (
    UPDATE ingestions i
       SET processed_units = %(processed_units)s, lease_expires_at = now() + %(lease)s
      FROM held
     WHERE i.id = held.id AND held.processed_units = %(from_units)s
    RETURNING i.id
)
SELECT held.cancel_requested_at IS NOT NULL AS cancel_requested,
       held.processed_units AS checkpoint,
       EXISTS (SELECT 1 FROM moved) AS advanced
  FROM held;

-- name: fence_ingestion
-- Locks an ingestion this claim still holds, for a fenced write that follows in the same
-- transaction. Zero rows: the lease is lost.
SELECT id FROM ingestions
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
   FOR NO KEY UPDATE;

-- name: finish_ingestion
-- Marks the file's document ready, fenced, and only under the scope it was indexed for: a
-- synced file's record must still hold the content hash the attempt described (so the same
-- name, scope and version) and be live, and its connection must still exist in the
-- ingestion's workspace, not being deleted. An attempt that wrote chunks passes how many
-- (written): its checkpoint must still say so, since a crash may have lost the last batches'
-- commits (see record_ingestion_batch), and a document is never ready with a hole. fenced = 0:
-- the lease is lost; finished = 0 with fenced = 1: the file changed or moved meanwhile, or the
-- checkpoint is short of written (checkpoint says where it is), and nothing was marked ready.
WITH fence AS (
    SELECT i.* FROM ingestions i
     WHERE ingestion_fence_v1(i, %(ingestion_id)s, %(lease_owner)s)
       FOR NO KEY UPDATE
), still AS (
    SELECT f.id FROM fence f
     WHERE (%(written)s::integer IS NULL OR f.processed_units = %(written)s)
       AND (f.source = 'local'
        OR (EXISTS (SELECT 1 FROM connections c
                     WHERE c.id = f.connection_id AND c.workspace_id = f.workspace_id
                       AND c.status <> 'deleting')
            AND EXISTS (SELECT 1 FROM records r
                         WHERE r.connection_id = f.connection_id
                           AND r.table_name = f.table_name AND r.external_id = f.external_id
                           AND r.deleted_at IS NULL
                           AND r.content_hash = %(record_hash)s)))
), doc AS (
    UPDATE documents d
       SET status = 'ready', ready_at = now(), name = %(name)s, scope = %(scope)s,
           version = %(version)s, content_sha256 = %(content_sha256)s,
           source_hash = %(source_hash)s, indexed_with = %(indexed_with)s,
           chunks = %(total_units)s
      FROM still
     WHERE d.id = %(document_id)s
    RETURNING d.id
), done AS (
    UPDATE ingestions i
       SET status = 'ready', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
           document_id = doc.id,
           processed_units = %(total_units)s, total_units = %(total_units)s,
           scope = %(scope)s, name = %(name)s,
           results = i.results || %(results)s, error = NULL
      FROM doc
     WHERE i.id = %(ingestion_id)s
    RETURNING i.id
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM done) AS finished,
       (SELECT processed_units FROM fence) AS checkpoint;

-- name: end_ingestion
-- Ends an ingestion skipped, failed or cancelled, fenced: a stale worker ends nothing.
UPDATE ingestions
   SET status = %(status)s, finished_at = now(), lease_owner = NULL, lease_expires_at = NULL,
       processing_since = NULL, error = %(error)s, results = results || %(results)s
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
RETURNING id;

-- name: requeue_ingestion
-- A retryable failure: the same row back to the queue after the delay, lease cleared, its
-- processed_units kept for the next attempt; fenced. A rate limit's wait spends no attempt. A
-- cancel asked for meanwhile ends it cancelled instead.
UPDATE ingestions
   SET status = CASE WHEN cancel_requested_at IS NULL THEN 'queued' ELSE 'cancelled' END,
       attempts = CASE WHEN %(spend_attempt)s THEN attempts ELSE greatest(attempts - 1, 0) END,
       finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END,
       queued_at = now() + make_interval(secs => %(delay_seconds)s),
       lease_owner = NULL, lease_expires_at = NULL, error = %(error)s
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
RETURNING status;

-- name: hand_back_ingestion
-- A graceful shutdown, or a file that changed while it was indexed: back to the queue at
-- once without spending an attempt, processed_units kept; fenced.
UPDATE ingestions
   SET status = 'queued', queued_at = now(), attempts = greatest(attempts - 1, 0),
       lease_owner = NULL, lease_expires_at = NULL
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
RETURNING id;

-- name: hand_over_to_archive
-- The file is an archive: the same row becomes an archive expansion, queued at once without
-- spending an attempt; fenced.
UPDATE ingestions
   SET kind = 'archive', status = 'queued', queued_at = now(),
       attempts = greatest(attempts - 1, 0), lease_owner = NULL, lease_expires_at = NULL,
       name = %(name)s, scope = %(scope)s
 WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
RETURNING id;

-- name: lock_ingestion_credentials
-- Locks the connection's row for a credential refresh, once this claim is known to still hold
-- the ingestion (which stays locked until the save): two jobs never spend one single-use
-- refresh token, and a stale worker never refreshes.
WITH fence AS (
    SELECT id FROM ingestions
     WHERE ingestion_fence_v1(ingestions, %(ingestion_id)s, %(lease_owner)s)
       FOR SHARE
)
SELECT c.credentials FROM connections c, fence
 WHERE c.id = %(connection_id)s
   FOR UPDATE OF c;

-- name: expand_archive
-- An archive's members, queued, and the archive ready, in one statement guarded by the
-- processing_since the claim stamped (a reclaimed expansion's old worker writes nothing) and
-- by the absence of a cancel request.
-- Members whose document already holds their bytes, indexed the same way and ready, are not
-- queued; documents of members the archive no longer holds are deleted.
WITH guard AS (
    SELECT i.* FROM ingestions i
     WHERE i.id = %(ingestion_id)s AND i.status = 'running' AND i.kind = 'archive'
       AND i.processing_since = %(processing_since)s AND i.cancel_requested_at IS NULL
       FOR NO KEY UPDATE
), members AS (
    SELECT m.path, m.sha256, m.name
      FROM unnest(%(paths)s::text[], %(sha256s)s::text[], %(names)s::text[]) AS m (path, sha256, name)
), fresh AS (
    SELECT m.* FROM members m, guard g
     WHERE NOT EXISTS (
               SELECT 1 FROM documents d
                WHERE d.source_key = g.source_key AND d.member_path = m.path
                  AND d.status = 'ready' AND d.content_sha256 = m.sha256
                  AND d.indexed_with = %(indexed_with)s)
), queued AS (
    INSERT INTO ingestions (workspace_id, source, connection_id, table_name, external_id,
                            local_path, member_path, archive_id, archive_sha256, source_hash,
                            name, scope, max_attempts)
    SELECT g.workspace_id, g.source, g.connection_id, g.table_name, g.external_id, g.local_path,
           m.path, g.id, %(archive_sha256)s, decode(m.sha256, 'hex'), m.name, %(scope)s,
           g.max_attempts
      FROM fresh m, guard g
    ON CONFLICT (source_key, member_path)
       WHERE status IN ('queued', 'running') AND source_key IS NOT NULL
    DO UPDATE SET source_hash = EXCLUDED.source_hash, archive_id = EXCLUDED.archive_id,
                  archive_sha256 = EXCLUDED.archive_sha256
    RETURNING 1
), dropped AS (
    DELETE FROM documents d
     USING guard g
     WHERE d.source_key = g.source_key AND d.member_path <> ''
       AND d.member_path <> ALL (%(paths)s::text[])
    RETURNING 1
), done AS (
    UPDATE ingestions i
       SET status = 'ready', finished_at = now(), processing_since = NULL, error = NULL,
           name = %(name)s, scope = %(scope)s, content_sha256 = %(archive_sha256)s,
           processed_units = %(members)s, total_units = %(members)s,
           results = i.results || %(results)s
      FROM guard g
     WHERE i.id = g.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM done) AS finished, (SELECT count(*) FROM queued) AS queued,
       (SELECT count(*) FROM dropped) AS dropped;

-- name: end_archive
-- Ends an archive expansion failed or cancelled (a refused archive: the error says why), or
-- hands it back to the queue (status queued, after a delay; spend_attempt false for a
-- shutdown), guarded by its processing_since.
UPDATE ingestions
   SET status = %(status)s,
       finished_at = CASE WHEN %(status)s = 'queued' THEN NULL ELSE now() END,
       queued_at = CASE WHEN %(status)s = 'queued'
                        THEN now() + make_interval(secs => %(delay_seconds)s) ELSE queued_at END,
       attempts = CASE WHEN %(spend_attempt)s THEN attempts ELSE greatest(attempts - 1, 0) END,
       processing_since = NULL, error = %(error)s, results = results || %(results)s
 WHERE id = %(ingestion_id)s AND status = 'running' AND kind = 'archive'
   AND processing_since = %(processing_since)s
RETURNING id;

-- name: cancel_ingestion
-- A queued ingestion is cancelled at once; a running one is asked to stop (its worker ends it
-- within a batch). Scoped to a workspace when one is given.
UPDATE ingestions
   SET status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
       finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,
       cancel_requested_at = coalesce(cancel_requested_at, now()),
       error = CASE WHEN status = 'queued'
                    THEN jsonb_build_object('kind', 'cancelled',
                                            'message', 'a cancel was requested')
                    ELSE error END
 WHERE id = %(ingestion_id)s AND status IN ('queued', 'running')
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
RETURNING *;

-- name: documents_by_settings
-- The ready documents of one workspace that have chunks, counted by the embedding model and
-- chunk settings they were indexed with: what a search says of the documents embedded by
-- another model than its own (it compares their vectors with nothing, so it finds them by
-- their words only).
SELECT indexed_with, count(*) AS documents, sum(chunks)::bigint AS chunks
  FROM documents
 WHERE workspace_id = %(workspace_id)s AND status = 'ready' AND chunks > 0
   AND indexed_with IS NOT NULL
 GROUP BY indexed_with
 ORDER BY indexed_with;

-- name: queue_reindex
-- Queues an ingestion of each file of a workspace whose ready document was indexed otherwise
-- than `indexed_with` (another embedding model or other chunk settings), once per file: the
-- members of an archive are indexed again through their archive's ingestion, whose expansion
-- queues the members indexed otherwise. Only live files of connections that are not being
-- deleted, and local files; a file with an ingestion already queued or running is left to it
-- (its worker indexes it with its own settings).
INSERT INTO ingestions (workspace_id, source, connection_id, table_name, external_id,
                        local_path, name, scope, source_hash, max_attempts)
SELECT DISTINCT ON (d.source_key)
       d.workspace_id, CASE WHEN d.connection_id IS NULL THEN 'local' ELSE 'file' END,
       d.connection_id, d.table_name, d.external_id, d.local_path,
       CASE WHEN d.member_path = '' THEN d.name END, d.scope,
       coalesce(r.content_hash, d.source_hash), %(max_attempts)s
  FROM documents d
  LEFT JOIN connections c ON c.id = d.connection_id
  LEFT JOIN records r ON r.connection_id = d.connection_id AND r.table_name = d.table_name
                     AND r.external_id = d.external_id
 WHERE d.workspace_id = %(workspace_id)s AND d.source_key IS NOT NULL AND d.status = 'ready'
   AND d.indexed_with IS DISTINCT FROM %(indexed_with)s
   AND (d.connection_id IS NULL
        OR (c.status <> 'deleting' AND r.content_hash IS NOT NULL AND r.deleted_at IS NULL))
 ORDER BY d.source_key, d.member_path
ON CONFLICT (source_key, member_path)
   WHERE status IN ('queued', 'running') AND source_key IS NOT NULL
DO NOTHING
RETURNING id;

-- name: get_ingestion
-- One ingestion, scoped to a workspace when one is given.
SELECT * FROM ingestions
 WHERE id = %(ingestion_id)s
   AND (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s);

-- name: list_ingestions
-- Recent ingestions, newest first, of one workspace (or all), one status (or all), and the
-- members of one archive (or all).
SELECT * FROM ingestions
 WHERE (%(workspace_id)s::bigint IS NULL OR workspace_id = %(workspace_id)s)
   AND (%(status)s::text IS NULL OR status = %(status)s)
   AND (%(archive_id)s::bigint IS NULL OR archive_id = %(archive_id)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: commit_asynchronously
-- A batch's transaction commits without waiting for its WAL flush: a crash can lose a suffix of
-- batches with their checkpoints, never a checkpoint without its chunks, and the finish commits
-- synchronously after them (see "Durability" in docs/architecture.md).
SELECT set_config('synchronous_commit', 'off', true);
