-- The full-text side of search reads chunks in English: words are stemmed ("renewed" and
-- "renewal" are one term) and stop words ("is", "the", "how") are left out, so a question in
-- plain words matches by the words that carry its meaning, not by the ones every chunk holds.
-- Words the English dictionary does not know (part numbers, codes, identifiers) are kept as
-- written. The column is generated, so every chunk already stored is read again here.
ALTER TABLE document_chunks DROP COLUMN tsv;
ALTER TABLE document_chunks
    ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED;
CREATE INDEX document_chunks_tsv ON document_chunks USING gin (tsv);
