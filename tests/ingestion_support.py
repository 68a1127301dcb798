"""What the ingestion tests share: deterministic text files, an embedder that counts what it
embeds and can act between two batches, and reads of what a document holds."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from sync import Engine
from sync.documents import (
    DocumentLimits,
    Embedder,
    Extraction,
    HashingEmbedder,
    MediaType,
    chunks,
)
from sync.documents.embeddings import Vector
from sync.worker import Worker

VOCABULARY = (
    "steel beam column footing slab rebar concrete pour formwork curing inspection submittal "
    "revision drawing detail section elevation schedule door frame hardware fire rating "
    "guardrail stair landing handrail anchor bolt weld grout membrane flashing roof drain"
)
WORDS = tuple(VOCABULARY.split())


def write_text(path: Path, paragraphs: int, seed: int = 1) -> Path:
    """A text file of ``paragraphs`` paragraphs of about 600 characters, the same for a seed."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for n in range(paragraphs):
            words = " ".join(rng.choice(WORDS) for _ in range(90))
            out.write(f"Paragraph {n}. {words.capitalize()}.\n\n")
    return path


def chunk_count(path: Path) -> int:
    limits = DocumentLimits()
    return sum(1 for _ in chunks(Extraction(path, MediaType.TEXT, limits), limits))


class CountingEmbedder:
    """The default embedder (or ``inner``), counting each batch it embeds (and the first chunk
    text of each), and calling ``before(n)`` before it embeds its ``n``-th batch."""

    def __init__(
        self, before: Callable[[int], object] | None = None, inner: Embedder | None = None
    ) -> None:
        self._inner = inner or HashingEmbedder()
        self.batches: list[int] = []
        self.first_texts: list[str] = []
        self._before = before

    @property
    def model(self) -> str:
        return self._inner.model

    @property
    def dimensions(self) -> int:
        return self._inner.dimensions

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        if self._before is not None:
            self._before(len(self.batches) + 1)
        self.batches.append(len(texts))
        self.first_texts.append(texts[0] if texts else "")
        return self._inner.embed(texts)

    @property
    def embedded(self) -> int:
        return sum(self.batches)


def worker_with(engine: Engine, embedder: CountingEmbedder | None = None) -> Worker:
    worker = engine.worker(listen=False)
    if embedder is not None:
        worker.slot("ingestion").kind.embedder = embedder
    return worker


def drain(worker: Worker, polls: int = 50) -> None:
    """Poll until a poll finds nothing to do."""
    for _ in range(polls):
        if not worker.poll():
            return
    raise AssertionError(f"the worker still had work after {polls} polls")


def stored_chunks(admin: psycopg.Connection[Any], document_id: int) -> list[tuple[Any, ...]]:
    """A document's chunks as stored, byte for byte: index, page, text, model, vector."""
    rows = admin.execute(
        "SELECT chunk_index, page, text, embedding_model, embedding::text AS vector "
        "FROM document_chunks WHERE document_id = %s ORDER BY chunk_index",
        (document_id,),
    ).fetchall()
    return [tuple(r.values()) for r in rows]


def without_ingestions(worker: Worker) -> Worker:
    """The worker with its ingestion stage left out: it only syncs (and the test decides
    which worker ingests what)."""
    worker._stages = [(name, stage) for name, stage in worker._stages if name != "ingestion"]
    return worker
