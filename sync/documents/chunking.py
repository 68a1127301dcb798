"""Deterministic chunking: a document's segments become one ordered sequence of chunks, built
lazily, so a file of any size passes through in bounded memory.

The same text always gives the same chunks, byte for byte, with the same indexes, whatever
machine builds them and however the text arrived in pieces. Where a chunk ends is a pure
function of the next ``chunk_chars + 1`` characters of its page (:func:`cut_point`), and the
chunker always holds that many before it decides. So a job that resumes a document on another
worker rebuilds the identical sequence and skips the first ``processed_units`` chunks.

A chunk never spans two pages. Within a page it ends, by preference, after a blank line, else
after the end of a sentence or line, else after a space, in the second half of its window; only
a run of text with no space at all is cut mid-word. The next chunk starts ``chunk_overlap``
characters before the cut (moved forward to the start of a word), so a passage cut in two is
still found whole in one of them. Whitespace inside a chunk's text is collapsed to single
spaces and blank lines; a chunk that would be only whitespace is not made and takes no index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby

from sync.documents.errors import DocumentTooLarge
from sync.documents.extract import Segment
from sync.documents.limits import DocumentLimits, env_name


@dataclass(frozen=True)
class Chunk:
    index: int  # from 0, dense, in reading order
    page: int
    text: str


_PARAGRAPH = re.compile(r"\n[ \t]*\n")
_SENTENCE = re.compile(r"[.!?;:][\"')\]]*\s|\n")
_SPACE = re.compile(r"\s")
_SPACES = re.compile(r"[^\S\n]+")
_NEWLINES = re.compile(r"\s*\n\s*\n\s*")
_NEWLINE = re.compile(r"[^\S\n]*\n[^\S\n]*")


def _last_end(pattern: re.Pattern[str], text: str, lo: int, hi: int) -> int | None:
    last = None
    for match in pattern.finditer(text, lo, hi):
        last = match.end()
    return last


def cut_point(window: str, size: int) -> int:
    """Where a chunk whose page continues past ``window`` ends: an offset in ``(size // 2,
    size]``, chosen from ``window[:size]`` alone (the window is ``size + 1`` characters or
    more). Pure: the same window always gives the same cut."""
    lo = size // 2
    for pattern in (_PARAGRAPH, _SENTENCE, _SPACE):
        end = _last_end(pattern, window, lo, size)
        if end is not None and end > lo:
            return end
    return size


def next_start(window: str, cut: int, overlap: int) -> int:
    """Where the chunk after a cut at ``cut`` starts: ``overlap`` characters back, moved
    forward past the next space so it starts at a word; at the cut if there is no space."""
    if overlap <= 0:
        return cut
    match = _SPACE.search(window, cut - overlap, cut)
    return match.end() if match else cut


def normalize(text: str) -> str:
    """A chunk's text as stored: runs of spaces become one, blank lines one blank line, and
    NUL characters (which a Postgres text cannot hold) are dropped."""
    text = _SPACES.sub(" ", text.replace("\x00", ""))
    text = _NEWLINES.sub("\n\n", text)
    return _NEWLINE.sub("\n", text).strip()


def _page_chunks(pieces: Iterable[str], size: int, overlap: int) -> Iterator[str]:
    buffer = ""
    for piece in pieces:
        buffer += piece
        start = 0
        # Decide only with more than `size` characters in hand: the cut then never depends on
        # how the page's text was split into pieces.
        while len(buffer) - start > size:
            window = buffer[start : start + size + 1]
            cut = cut_point(window, size)
            yield window[:cut]
            start += next_start(window, cut, overlap)
        buffer = buffer[start:]
    while len(buffer) > size:
        window = buffer[: size + 1]
        cut = cut_point(window, size)
        yield window[:cut]
        buffer = buffer[next_start(window, cut, overlap) :]
    if buffer:
        yield buffer


def chunks(
    segments: Iterable[Segment], limits: DocumentLimits, *, name: str = "the document"
) -> Iterator[Chunk]:
    """The chunks of a document's segments, in order, indexes from 0. Raises
    :class:`DocumentTooLarge` before making chunk number ``max_chunks + 1``."""
    index = 0
    for page, group in groupby(segments, key=lambda s: s.page):
        for raw in _page_chunks((s.text for s in group), limits.chunk_chars, limits.chunk_overlap):
            text = normalize(raw)
            if not text:
                continue
            if index >= limits.max_chunks:
                raise DocumentTooLarge(
                    f"{name} makes more than {limits.max_chunks:,} chunks; raise "
                    f"{env_name('max_chunks')} to index it, or split it"
                )
            yield Chunk(index, page, text)
            index += 1
