"""The embedding port, and the default embedder.

An :class:`Embedder` turns texts into vectors of a fixed length. Its ``model`` names the vector
space (model and length): vectors of different models are never compared, so each stored chunk
records the model that embedded it and a search compares only chunks of its own model.

:class:`HashingEmbedder` is the default. It needs no network and no model file: each word is
hashed to one of ``dimensions`` coordinates (the "hashing trick"), weighted by how often it
occurs, and the vector is scaled to length 1. Two texts are close when they share words. It is
lexical, not semantic: "car" and "automobile" are unrelated to it. For meaning, point
:class:`~sync.documents.openai_embeddings.OpenAIEmbeddings` at an embeddings endpoint.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol

Vector = list[float]


class Embedder(Protocol):
    @property
    def model(self) -> str:
        """The vector space: the same text embedded by the same model gives the same vector
        (or one that compares as the same)."""
        ...

    @property
    def dimensions(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """One vector of ``dimensions`` floats per text, in order."""
        ...


_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """The words of ``text`` as the hashing embedder and the full-text query see them."""
    return _WORD.findall(text.casefold())


@lru_cache(maxsize=200_000)
def _bucket(word: str, dimensions: int) -> tuple[int, float]:
    # BLAKE2b, not hash(): the same word must land in the same coordinate in every process.
    digest = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
    return digest % dimensions, (1.0 if digest >> 63 else -1.0)


class HashingEmbedder:
    """Deterministic feature hashing of words, with sublinear term frequency (1 + ln tf) and
    signed buckets (collisions cancel out on average instead of adding up). No network."""

    def __init__(self, dimensions: int = 256) -> None:
        if not 16 <= dimensions <= 16_000:
            raise ValueError("dimensions must be between 16 and 16000")
        self._dimensions = dimensions

    @property
    def model(self) -> str:
        return f"hashing-v1-{self._dimensions}"

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> Vector:
        vector = [0.0] * self._dimensions
        for word, count in Counter(words(text)).items():
            index, sign = _bucket(word, self._dimensions)
            vector[index] += sign * (1.0 + math.log(count))
        norm = math.sqrt(sum(x * x for x in vector))
        if norm:
            vector = [x / norm for x in vector]
        return vector
