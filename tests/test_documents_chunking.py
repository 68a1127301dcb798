"""Chunking is deterministic and lazy: the same text gives the same chunks however it arrives,
a resumed job can skip what was done, and an endless document is chunked in bounded memory."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sync.documents import Chunk, DocumentLimits, Extraction, MediaType, Segment, chunks
from sync.documents.chunking import cut_point, normalize

LIMITS = DocumentLimits(chunk_chars=120, chunk_overlap=20)

# Words, sentence ends, blank lines, long unbroken runs and odd whitespace, so every kind of
# cut is exercised.
_pieces = st.sampled_from(
    ["steel", "beam", "the", "a", ".", "! ", "\n", "\n\n", "  ", "\t", "x" * 70, "é", " "]
)
_texts = st.lists(_pieces, max_size=200).map("".join)


def _split(text: str, cuts: list[int]) -> list[str]:
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=300)
@given(pages=st.lists(_texts, min_size=1, max_size=4), cuts=st.lists(st.integers(0, 10_000)))
def test_chunks_do_not_depend_on_how_the_text_was_split(pages: list[str], cuts: list[int]) -> None:
    whole = [Segment(n, text) for n, text in enumerate(pages, 1)]
    pieces = [Segment(n, part) for n, text in enumerate(pages, 1) for part in _split(text, cuts)]
    expected = list(chunks(whole, LIMITS))
    assert list(chunks(pieces, LIMITS)) == expected
    assert [c.index for c in expected] == list(range(len(expected)))
    for chunk in expected:
        assert 0 < len(chunk.text) <= LIMITS.chunk_chars
        assert chunk.text == normalize(chunk.text)
        assert chunk.text in normalize(pages[chunk.page - 1])


@settings(max_examples=200)
@given(text=_texts)
def test_chunks_cover_the_whole_text(text: str) -> None:
    made = list(chunks([Segment(1, text)], DocumentLimits(chunk_chars=120, chunk_overlap=0)))
    # Without overlap, the chunks are the text cut in pieces: whitespace aside, nothing is
    # lost, repeated or reordered.
    assert "".join("".join(c.text.split()) for c in made) == "".join(text.split())


def test_cut_prefers_paragraphs_then_sentences_then_spaces() -> None:
    size = 40
    assert cut_point("a" * 25 + "\n\n" + "b" * 14 + "c", size) == 27
    assert cut_point("a" * 25 + ". " + "b" * 14 + "c", size) == 27
    assert cut_point("a" * 25 + " " + "b" * 15 + "c", size) == 26
    assert cut_point("a" * 41, size) == size  # no space at all: cut mid-word
    # A break in the first half would make a short chunk: ignored.
    assert cut_point("a" * 5 + "\n\n" + "b" * 34, size) == size


def test_overlap_repeats_the_end_of_the_previous_chunk_from_a_word_start() -> None:
    text = " ".join(f"w{i:03d}" for i in range(200))
    made = list(chunks([Segment(1, text)], LIMITS))
    for before, after in itertools.pairwise(made):
        first_word = after.text.split()[0]
        assert first_word in before.text.split()  # starts at a whole word of the one before
        assert len(before.text) - before.text.rindex(first_word) <= LIMITS.chunk_overlap


def test_chunks_never_span_pages() -> None:
    made = list(chunks([Segment(1, "alpha beta"), Segment(2, "gamma")], LIMITS))
    assert made == [Chunk(0, 1, "alpha beta"), Chunk(1, 2, "gamma")]


def test_whitespace_only_text_makes_no_chunk_and_takes_no_index() -> None:
    made = list(chunks([Segment(1, " \n\n \t"), Segment(2, "word\x00s")], LIMITS))
    assert made == [Chunk(0, 2, "words")]


def test_a_resumed_job_skips_exactly_what_was_processed(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("\f".join(f"page {p} " + "lorem ipsum dolor " * 40 for p in range(5)))
    full = list(chunks(Extraction(path, MediaType.TEXT, LIMITS), LIMITS))
    processed = 7
    resumed = list(
        itertools.islice(chunks(Extraction(path, MediaType.TEXT, LIMITS), LIMITS), processed, None)
    )
    assert resumed == full[processed:]


@pytest.mark.slow
def test_the_same_file_gives_identical_chunks_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    path.write_text("# Title\n\n" + "Some *marked* text, with [links](http://x). " * 300)
    program = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from sync.documents import DocumentLimits, Extraction, MediaType, chunks\n"
        "limits = DocumentLimits(chunk_chars=120, chunk_overlap=20)\n"
        "e = Extraction(Path(sys.argv[1]), MediaType.MARKDOWN, limits)\n"
        "print(json.dumps([[c.index, c.page, c.text] for c in chunks(e, limits)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    here = [
        [c.index, c.page, c.text]
        for c in chunks(Extraction(path, MediaType.MARKDOWN, LIMITS), LIMITS)
    ]
    assert done.stdout.strip() == json.dumps(here)


def test_chunking_is_lazy() -> None:
    """An endless page still yields its first chunks: nothing waits for the end of the text."""

    def endless() -> Iterator[Segment]:
        while True:
            yield Segment(1, "the quick brown fox jumps over the lazy dog. " * 50)

    first = list(itertools.islice(chunks(endless(), LIMITS), 1000))
    assert [c.index for c in first] == list(range(1000))
