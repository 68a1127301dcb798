-- Named statements of document search (sync/documents/store.py), in the format of queries.sql.
-- None commits: each runs inside its caller's transaction, so a job can fence it (check its
-- lease on the job row first, in the same transaction). Names resolve through the connection's
-- search_path, which is the configured schema.


-- name: add_document
-- Creates a document in a workspace; its chunks can only ever live in that workspace.
INSERT INTO documents (workspace_id, name, media_type)
VALUES (%(workspace_id)s, %(name)s, %(media_type)s)
RETURNING id;

-- name: upsert_chunks
-- Writes a batch of chunks keyed by (document, chunk index), each into its document's
-- workspace. A chunk stored with the same page, text and model is not rewritten (no new row
-- version, no WAL), so a batch replayed by a resumed job costs reads only. A document deleted
-- meanwhile matches nothing: no chunk outlives its document. Vectors arrive as one flat array,
-- `dims` floats per chunk, in the order of the chunks.
-- The vectors' CTE is MATERIALIZED so the array is cast once per batch: inlined, a prepared
-- (generic) plan cast the whole array again for every row (200 x 51,200 floats per batch).
WITH v AS MATERIALIZED (SELECT %(vectors)b::real[] AS flat)
INSERT INTO document_chunks AS stored
       (document_id, workspace_id, chunk_index, page, text, embedding_model, embedding)
SELECT d.id, d.workspace_id, c.chunk_index, c.page, c.text, %(model)s,
       document_embedding(v.flat[(c.n - 1) * %(dims)s + 1 : c.n * %(dims)s])
  FROM documents d,
       v,
       unnest(%(indexes)s::integer[], %(pages)s::integer[], %(texts)s::text[])
           WITH ORDINALITY AS c (chunk_index, page, text, n)
 WHERE d.id = %(document_id)s
ON CONFLICT (document_id, chunk_index) DO UPDATE
   SET page = EXCLUDED.page, text = EXCLUDED.text,
       embedding_model = EXCLUDED.embedding_model, embedding = EXCLUDED.embedding
 WHERE (stored.page, stored.text, stored.embedding_model)
       IS DISTINCT FROM (EXCLUDED.page, EXCLUDED.text, EXCLUDED.embedding_model);

-- name: delete_chunks_from
-- Deletes a document's chunks from chunk index `tail` on: what an earlier, longer version of
-- the document left past the end of the new one.
DELETE FROM document_chunks
 WHERE document_id = %(document_id)s AND chunk_index >= %(tail)s;

-- name: count_chunks
-- How many chunks a document has stored.
SELECT count(*) AS chunks FROM document_chunks WHERE document_id = %(document_id)s;

-- name: search_chunks
-- The best chunks of one workspace for a query, never another workspace's, of ready documents
-- only (one being indexed, or indexed again, is not searched until it is ready): the `candidates`
-- best by full-text rank (any of the query's words) and the `candidates` nearest by vector (of
-- the query's model only), fused by reciprocal rank: score = sum of 1 / (rrf_k + rank) over
-- the two lists a chunk is in. Ties are broken by document and chunk index, so the order is
-- stable. With `scan_all` (pgvector) the vector side ranks every chunk of the workspace; without
-- (real[], whose similarity is SQL, about 60 times slower) it ranks the full-text candidates.
WITH query AS (
    SELECT (SELECT string_agg(q::text, ' | ')
              FROM unnest(%(words)s::text[]) AS w,
                   plainto_tsquery('simple', w) AS q
             WHERE numnode(q) > 0)::tsquery AS tsq
),
by_text AS (
    SELECT c.document_id, c.chunk_index, ts_rank_cd(c.tsv, q.tsq) AS text_rank
      FROM document_chunks c
      JOIN documents d ON d.id = c.document_id AND d.status = 'ready'
     CROSS JOIN query q
     WHERE c.workspace_id = %(workspace_id)s AND c.tsv @@ q.tsq
     ORDER BY text_rank DESC, c.document_id, c.chunk_index
     LIMIT %(candidates)s
),
by_vector AS (
    SELECT c.document_id, c.chunk_index,
           document_similarity(c.embedding, %(vector)s::real[]) AS similarity
      FROM document_chunks c
      JOIN documents d ON d.id = c.document_id AND d.status = 'ready'
     WHERE c.workspace_id = %(workspace_id)s AND c.embedding_model = %(model)s
       AND (%(scan_all)s OR (c.document_id, c.chunk_index) IN (SELECT document_id, chunk_index
                                                                 FROM by_text))
     ORDER BY similarity DESC, c.document_id, c.chunk_index
     LIMIT %(candidates)s
),
ranked_vector AS (
    SELECT *, row_number() OVER (ORDER BY similarity DESC, document_id, chunk_index) AS rank
      FROM by_vector
     WHERE similarity > %(min_similarity)s
),
ranked_text AS (
    SELECT *, row_number() OVER (ORDER BY text_rank DESC, document_id, chunk_index) AS rank
      FROM by_text
),
fused AS (
    SELECT document_id, chunk_index, v.similarity, t.text_rank,
           coalesce(1.0 / (%(rrf_k)s + v.rank), 0)
           + coalesce(1.0 / (%(rrf_k)s + t.rank), 0) AS score
      FROM ranked_vector v FULL JOIN ranked_text t USING (document_id, chunk_index)
)
SELECT f.document_id, d.name AS document_name, f.chunk_index, c.page, c.text,
       f.score::float8 AS score, f.similarity, f.text_rank::float8 AS text_rank,
       d.scope, d.connection_id, d.table_name, d.external_id, d.local_path, d.member_path
  FROM fused f
  JOIN document_chunks c USING (document_id, chunk_index)
  JOIN documents d ON d.id = f.document_id
 ORDER BY f.score DESC, f.document_id, f.chunk_index
 LIMIT %(limit)s;

-- name: vector_storage
-- How this schema stores embeddings: 'vector' (pgvector) or 'real[]' (the fallback).
SELECT CASE WHEN t.typname = 'vector' THEN 'vector' ELSE 'real[]' END AS storage
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = 'document_chunks'::regclass AND a.attname = 'embedding';
