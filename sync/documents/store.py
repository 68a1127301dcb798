"""Documents and their chunks in Postgres, as the typed methods of :class:`DocumentStore` on the
caller's psycopg connection (its ``search_path`` the engine's schema): the batch upsert, the tail
delete and the search. Statements are the named ones of ``sql/documents.sql``.

None of them commits or opens a transaction: a job writes a batch in its own transaction with
the check of its lease (and the new ``processed_units``), so a worker that lost its lease writes
nothing, and repeats that transaction whole when it fails for a passing reason. A statement that
is its own transaction (an autocommit connection outside one: a search) is repeated after a
transient failure through the one :class:`~sync.store.retry.RetryPolicy`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from sync.documents.chunking import Chunk
from sync.documents.embeddings import Embedder, Vector, words
from sync.store.queries import NamedQueries
from sync.store.retry import DEFAULT, RetryPolicy

# A query's first words; a longer query is cut here (it only adds terms to an OR).
MAX_QUERY_WORDS = 64
# BM25's term-frequency saturation: a chunk holding a term twice scores 1.4 times one holding it
# once, five times 1.8 times, never more than 2.2 times. No length normalization: the chunker
# makes chunks of about the same length.
BM25_K1 = 1.2
# The share of a hit's score its words give; the rest is its vector's similarity. Measured on
# the labelled questions of bench/search_quality.py with the hashing embedder
# (docs/documents.md): the words carry more than the lexical vector does.
TEXT_WEIGHT = 0.7


DOCUMENT_QUERIES = NamedQueries("documents.sql")

T = TypeVar("T")


class VectorStorage(StrEnum):
    PGVECTOR = "vector"
    ARRAY = "real[]"


@dataclass(frozen=True)
class SearchHit:
    document_id: int
    document_name: str
    chunk_index: int
    page: int
    text: str
    # How well it matches, from 0 to 1: TEXT_WEIGHT x text_score + the rest x similarity.
    score: float
    similarity: float | None  # cosine similarity, when among the vector candidates
    # The query's terms it holds, weighed by their rarity (BM25), over all of them: from 0 to 1,
    # when among the full-text candidates.
    text_score: float | None
    # Where the document comes from, when an ingestion made it: a synced file of a connection's
    # table, or a local file; a member of an archive has its path in it.
    scope: str | None = None
    connection_id: int | None = None
    table_name: str | None = None
    external_id: str | None = None
    local_path: str | None = None
    member_path: str = ""


class DocumentStore:
    """The statements of documents and chunks on ``conn``, whatever its row factory."""

    def __init__(self, conn: psycopg.Connection[Any], *, retry: RetryPolicy = DEFAULT) -> None:
        self._conn = conn
        self._retry = retry

    def _run(self, call: Callable[[], T]) -> T:
        """A statement that is its own transaction is repeated after a transient failure; one
        inside the caller's transaction is the caller's to repeat (the failure rolled all of
        that transaction back)."""
        conn = self._conn
        if conn.autocommit and conn.info.transaction_status is TransactionStatus.IDLE:
            return self._retry.run(call)
        return call()

    def _first(self, query: sql.SQL, params: dict[str, Any]) -> tuple[Any, ...]:
        def call() -> tuple[Any, ...]:
            with self._conn.cursor(row_factory=tuple_row) as cur:
                row = cur.execute(query, params).fetchone()
            assert row is not None
            return row

        return self._run(call)

    def _rowcount(self, query: sql.SQL, params: dict[str, Any]) -> int:
        return self._run(lambda: self._conn.execute(query, params).rowcount)

    def vector_storage(self) -> VectorStorage:
        """How this schema stores embeddings: chosen once, when its migration ran."""
        return VectorStorage(self._first(DOCUMENT_QUERIES.vector_storage, {})[0])

    def add_document(self, workspace_id: int, name: str, media_type: str) -> int:
        """A new document of ``workspace_id``; returns its id."""
        params = {"workspace_id": workspace_id, "name": name, "media_type": media_type}
        return int(self._first(DOCUMENT_QUERIES.add_document, params)[0])

    def upsert_chunks(
        self,
        document_id: int,
        chunks: Sequence[Chunk],
        vectors: Sequence[Vector],
        *,
        model: str,
    ) -> int:
        """Write a batch of chunks with their vectors, keyed by chunk index, in one statement.
        Returns how many rows were written: unchanged chunks are not rewritten."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        if not chunks:
            return 0
        dims = len(vectors[0])
        if any(len(v) != dims for v in vectors):
            raise ValueError("the vectors of one batch must all have the same length")
        params = {
            "document_id": document_id,
            "model": model,
            "dims": dims,
            "indexes": [c.index for c in chunks],
            "pages": [c.page for c in chunks],
            "texts": [c.text for c in chunks],
            "vectors": list(itertools.chain.from_iterable(vectors)),
        }
        return self._rowcount(DOCUMENT_QUERIES.upsert_chunks, params)

    def delete_chunks_from(self, document_id: int, tail: int) -> int:
        """Delete the document's chunks with index ``tail`` or more; returns how many."""
        params = {"document_id": document_id, "tail": tail}
        return self._rowcount(DOCUMENT_QUERIES.delete_chunks_from, params)

    def count_chunks(self, document_id: int) -> int:
        return int(self._first(DOCUMENT_QUERIES.count_chunks, {"document_id": document_id})[0])

    def search(
        self,
        workspace_id: int,
        query: str,
        embedder: Embedder,
        *,
        limit: int = 10,
        candidates: int = 50,
        min_similarity: float = 0.0,
    ) -> list[SearchHit]:
        """The ``limit`` best chunks of ``workspace_id`` for ``query``, best first: its English
        terms weighed by their rarity (BM25) and vector similarity (chunks embedded by
        ``embedder``'s model only, above ``min_similarity``), each hit scored from 0 to 1. With
        pgvector every chunk of the workspace is a vector candidate; with the real[] fallback,
        only the full-text candidates are (see docs/documents.md)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        text = " ".join(query.split()[:MAX_QUERY_WORDS])
        if not words(text):
            return []
        vector = embedder.embed([text])[0]
        params = {
            "workspace_id": workspace_id,
            "scan_all": self.vector_storage() is VectorStorage.PGVECTOR,
            "query": text,
            "vector": vector,
            "model": embedder.model,
            "candidates": max(candidates, limit),
            "min_similarity": min_similarity,
            "k1": BM25_K1,
            "text_weight": TEXT_WEIGHT,
            "limit": limit,
        }

        def call() -> list[SearchHit]:
            with self._conn.cursor(row_factory=dict_row) as cur:
                rows = cur.execute(DOCUMENT_QUERIES.search_chunks, params).fetchall()
            return [SearchHit(**row) for row in rows]

        return self._run(call)
