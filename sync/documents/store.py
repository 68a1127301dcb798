"""Chunks in Postgres: the batch upsert, the tail delete and the search, as functions taking a
psycopg connection whose ``search_path`` is the engine's schema.

None of them commits or opens a transaction: each is one statement, run in the caller's
transaction, so a job writes a batch in the same transaction as the check of its lease (and the
new ``processed_units``), and a worker that lost its lease writes nothing. Statements are the
named ones of ``sql/documents.sql``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from sync.documents.chunking import Chunk
from sync.documents.embeddings import Embedder, Vector, words
from sync.store.queries import NamedQueries

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


def _first(conn: psycopg.Connection[Any], name: str, params: dict[str, Any]) -> tuple[Any, ...]:
    """The first row of a statement as a tuple, whatever the connection's row factory."""
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(DOCUMENT_QUERIES[name], params).fetchone()
    assert row is not None
    return row


class VectorStorage(StrEnum):
    PGVECTOR = "vector"
    ARRAY = "real[]"


def vector_storage(conn: psycopg.Connection[Any]) -> VectorStorage:
    """How this schema stores embeddings: chosen once, when its migration ran."""
    row = _first(conn, "vector_storage", {})
    return VectorStorage(row[0])


def add_document(
    conn: psycopg.Connection[Any], workspace_id: int, name: str, media_type: str
) -> int:
    """A new document of ``workspace_id``; returns its id."""
    row = _first(
        conn, "add_document", {"workspace_id": workspace_id, "name": name, "media_type": media_type}
    )
    return int(row[0])


def upsert_chunks(
    conn: psycopg.Connection[Any],
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
    cur = conn.execute(
        DOCUMENT_QUERIES.upsert_chunks,
        {
            "document_id": document_id,
            "model": model,
            "dims": dims,
            "indexes": [c.index for c in chunks],
            "pages": [c.page for c in chunks],
            "texts": [c.text for c in chunks],
            "vectors": list(itertools.chain.from_iterable(vectors)),
        },
    )
    return cur.rowcount


def delete_chunks_from(conn: psycopg.Connection[Any], document_id: int, tail: int) -> int:
    """Delete the document's chunks with index ``tail`` or more; returns how many."""
    return conn.execute(
        DOCUMENT_QUERIES.delete_chunks_from, {"document_id": document_id, "tail": tail}
    ).rowcount


def count_chunks(conn: psycopg.Connection[Any], document_id: int) -> int:
    row = _first(conn, "count_chunks", {"document_id": document_id})
    return int(row[0])


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


def search(
    conn: psycopg.Connection[Any],
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
    pgvector every chunk of the workspace is a vector candidate; with the real[] fallback, only
    the full-text candidates are (see docs/documents.md)."""
    if limit < 1:
        raise ValueError("limit must be at least 1")
    text = " ".join(query.split()[:MAX_QUERY_WORDS])
    if not words(text):
        return []
    vector = embedder.embed([text])[0]
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            DOCUMENT_QUERIES.search_chunks,
            {
                "workspace_id": workspace_id,
                "scan_all": vector_storage(conn) is VectorStorage.PGVECTOR,
                "query": text,
                "vector": vector,
                "model": embedder.model,
                "candidates": max(candidates, limit),
                "min_similarity": min_similarity,
                "k1": BM25_K1,
                "text_weight": TEXT_WEIGHT,
                "limit": limit,
            },
        ).fetchall()
    return [SearchHit(**row) for row in rows]
