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
-- only (one being indexed, or indexed again, is not searched until it is ready). Candidates: the
-- `candidates` best by their words and, with `scan_all` (pgvector), the `candidates` nearest the
-- query's vector among every chunk of the workspace (real[], whose similarity is SQL and about
-- 60 times slower, ranks the word candidates only). Each candidate is then scored on both sides:
--   text_score: the query's English terms (stemmed, stop words left out), each weighed by how
--   rare it is among the workspace's chunks (BM25's inverse document frequency); a chunk scores
--   the weights of the terms it holds, each saturating with how often it holds it (BM25's k1),
--   over what a chunk holding every term would score: from 0 to 1;
--   similarity: the cosine of its vector and the query's (of the query's model only, else 0).
-- score = text_weight x text_score + (1 - text_weight) x similarity (never below 0): it says how
-- well a chunk matches, so a good match scores far above a poor one whatever else the workspace
-- holds. Ties are broken by document and chunk index, so the order is stable.
-- The chunks holding any term are read once (`held`: each term a chunk holds, with how often,
-- cut from its tsvector by setweight and ts_filter), and each term's document frequency is
-- counted from them; a term no chunk holds weighs the most, so a chunk holding the other terms
-- of the query does not score as if it held them all. A lexeme is quoted into a tsquery of its own (the parser never puts a quote
-- or a backslash in one; they are escaped all the same).
WITH terms AS (
    SELECT DISTINCT t.lexeme,
           ('''' || replace(replace(t.lexeme, '\', '\\'), '''', '''''') || '''')::tsquery AS tsq
      FROM unnest(to_tsvector('english', %(query)s)) AS t
),
query AS (
    SELECT (SELECT string_agg(tsq::text, ' | ') FROM terms)::tsquery AS tsq,
           (SELECT array_agg(lexeme) FROM terms) AS lexemes
),
held AS MATERIALIZED (
    SELECT c.document_id, c.chunk_index, u.lexeme, cardinality(u.positions) AS tf
      FROM document_chunks c
     CROSS JOIN query q
     CROSS JOIN LATERAL unnest(ts_filter(setweight(c.tsv, 'A', q.lexemes), '{a}')) AS u
     WHERE c.workspace_id = %(workspace_id)s AND c.tsv @@ q.tsq
),
weighted AS (
    SELECT t.lexeme, ln(1 + (k.n - coalesce(h.df, 0) + 0.5) / (coalesce(h.df, 0) + 0.5)) AS idf
      FROM terms t
      LEFT JOIN (SELECT lexeme, count(*) AS df FROM held GROUP BY lexeme) h USING (lexeme)
     CROSS JOIN (SELECT count(*) AS n FROM document_chunks
                  WHERE workspace_id = %(workspace_id)s) k
),
text_scored AS (
    SELECT h.document_id, h.chunk_index,
           sum(w.idf * h.tf * (%(k1)s + 1) / (h.tf + %(k1)s))
           / ((SELECT sum(idf) FROM weighted) * (%(k1)s + 1)) AS text_score
      FROM held h JOIN weighted w USING (lexeme)
     GROUP BY h.document_id, h.chunk_index
),
by_text AS (
    SELECT t.document_id, t.chunk_index
      FROM text_scored t
      JOIN documents d ON d.id = t.document_id AND d.status = 'ready'
     ORDER BY t.text_score DESC, t.document_id, t.chunk_index
     LIMIT %(candidates)s
),
by_vector AS (
    SELECT document_id, chunk_index
      FROM (SELECT c.document_id, c.chunk_index,
                   document_similarity(c.embedding, %(vector)s::real[]) AS similarity
              FROM document_chunks c
              JOIN documents d ON d.id = c.document_id AND d.status = 'ready'
             WHERE %(scan_all)s AND c.workspace_id = %(workspace_id)s
               AND c.embedding_model = %(model)s
             ORDER BY similarity DESC, c.document_id, c.chunk_index
             LIMIT %(candidates)s) AS nearest
     WHERE similarity > %(min_similarity)s
),
scored AS (
    SELECT c.document_id, c.chunk_index,
           CASE WHEN c.embedding_model = %(model)s
                THEN document_similarity(c.embedding, %(vector)s::real[]) END AS similarity,
           t.text_score
      FROM (SELECT * FROM by_text UNION SELECT * FROM by_vector) AS candidate
      JOIN document_chunks c USING (document_id, chunk_index)
      LEFT JOIN text_scored t USING (document_id, chunk_index)
)
SELECT s.document_id, d.name AS document_name, s.chunk_index, c.page, c.text,
       (%(text_weight)s * coalesce(s.text_score, 0)
        + (1 - %(text_weight)s) * greatest(coalesce(s.similarity, 0), 0))::float8 AS score,
       s.similarity, s.text_score::float8 AS text_score,
       d.scope, d.connection_id, d.table_name, d.external_id, d.local_path, d.member_path
  FROM scored s
  JOIN document_chunks c USING (document_id, chunk_index)
  JOIN documents d ON d.id = s.document_id
 ORDER BY score DESC, s.document_id, s.chunk_index
 LIMIT %(limit)s;

-- name: vector_storage
-- How this schema stores embeddings: 'vector' (pgvector) or 'real[]' (the fallback).
SELECT CASE WHEN t.typname = 'vector' THEN 'vector' ELSE 'real[]' END AS storage
  FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
 WHERE a.attrelid = 'document_chunks'::regclass AND a.attname = 'embedding';
