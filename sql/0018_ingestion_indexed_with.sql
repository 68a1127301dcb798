-- What an ingestion's processed units were made with: the embedding model and chunk settings
-- (the `indexed_with` of documents). An attempt resumes at `processed_units` only when its
-- bytes and these are the ones an earlier attempt worked with: chunks embedded by another model,
-- or cut with other chunk settings, are another list, and a document must never mix two.
-- NULL (an ingestion begun before this column existed) starts again from chunk 0.
ALTER TABLE ingestions ADD COLUMN indexed_with text;
