"""Extraction page by page, and the caps, on documents built in code."""

from __future__ import annotations

import codecs
import hashlib
from pathlib import Path

import pytest

from sync.documents import (
    DocumentLimits,
    DocumentTooLarge,
    Extraction,
    MalformedDocument,
    MediaType,
    UnsupportedDocument,
    chunks,
    media_type_of,
    spool,
)
from tests.documents_fixtures import pdf


def _extract(path: Path, media_type: MediaType, **limits: int) -> tuple[dict[int, str], Extraction]:
    extraction = Extraction(path, media_type, DocumentLimits(**limits))
    pages: dict[int, str] = {}
    for segment in extraction:
        pages[segment.page] = pages.get(segment.page, "") + segment.text
    return pages, extraction


def test_plain_text_pages_are_split_at_form_feeds(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"first page\r\nline two\fsecond page\f\fafter an empty page\f")
    pages, extraction = _extract(path, MediaType.TEXT)
    assert pages == {1: "first page\nline two", 2: "second page", 4: "after an empty page"}
    assert extraction.pages == 4  # the closing form feed opens no page
    assert extraction.skipped_pages == 0


def test_text_encodings_never_fail(tmp_path: Path) -> None:
    bom = tmp_path / "bom.txt"
    bom.write_bytes(codecs.BOM_UTF8 + "café".encode())
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("naïve résumé".encode("utf-16"))
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"ok \xff\xfe bytes")
    assert _extract(bom, MediaType.TEXT)[0] == {1: "café"}
    assert _extract(utf16, MediaType.TEXT)[0] == {1: "naïve résumé"}
    assert _extract(broken, MediaType.TEXT)[0] == {1: "ok \ufffd\ufffd bytes"}


def test_html_keeps_readable_text_only(tmp_path: Path) -> None:
    path = tmp_path / "a.html"
    path.write_text(
        "<html><head><title>Site walk</title><style>p {color: red}</style>"
        "<script>var secret = 1;</script></head><body><h1>Level 3</h1>"
        "<p>Rebar &amp; formwork\n   checked</p><table><tr><td>A</td><td>B</td></tr></table>"
        "<pre>keep\n  this</pre></body></html>"
    )
    pages, extraction = _extract(path, MediaType.HTML)
    assert "keep\n  this" in pages[1]  # <pre> keeps its line breaks
    assert extraction.pages == 1
    limits = DocumentLimits()
    made = list(chunks(Extraction(path, MediaType.HTML, limits), limits))
    assert [c.text for c in made] == [
        "Site walk\n\nLevel 3\n\nRebar & formwork checked\n\nA B\n\nkeep\nthis"
    ]


def test_markdown_markup_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "a.md"
    path.write_text(
        "# Specification\n\nUse *grade 60* `rebar`, see [the drawing](http://x/y.pdf).\n\n"
        "| item | qty |\n|---|---|\n| bolts | 40 |\n\n```\nraw ** code\n```\n"
    )
    text = _extract(path, MediaType.MARKDOWN)[0][1]
    assert "Specification" in text and "Use grade 60 rebar, see the drawing." in text
    assert "http://x" not in text and "#" not in text
    assert "bolts  40" in text or "bolts 40" in text
    assert "raw ** code" in text


def test_pdf_pages_and_image_only_pages_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "a.pdf"
    path.write_bytes(pdf(["Steel beams on page one", None, "Concrete on page three", None]))
    pages, extraction = _extract(path, MediaType.PDF)
    assert set(pages) == {1, 3}
    assert "Steel beams" in pages[1] and "Concrete" in pages[3]
    assert (extraction.pages, extraction.skipped_pages) == (4, 2)


def test_pdf_with_only_an_owner_password_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.pdf"
    path.write_bytes(pdf(["Open to read"], user_password=""))
    assert "Open to read" in _extract(path, MediaType.PDF)[0][1]


def test_pdf_with_a_user_password_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.pdf"
    path.write_bytes(pdf(["Secret"], user_password="hunter22"))
    with pytest.raises(MalformedDocument, match="encrypted PDF; index a copy saved without"):
        list(Extraction(path, MediaType.PDF, DocumentLimits(), name="plans.pdf"))


def test_truncated_pdf_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a.pdf"
    path.write_bytes(pdf(["Text"])[:200])
    with pytest.raises(MalformedDocument) as caught:
        list(Extraction(path, MediaType.PDF, DocumentLimits(), name="plans.pdf"))
    message = str(caught.value)
    assert message.startswith("plans.pdf is not a readable PDF") and "\n" not in message


def test_page_caps(tmp_path: Path) -> None:
    text = tmp_path / "a.txt"
    text.write_text("a\fb\fc")
    with pytest.raises(
        DocumentTooLarge, match="more than 2 pages; raise CONNECTOR_SYNC_DOCUMENTS_MAX_PAGES"
    ):
        _extract(text, MediaType.TEXT, max_pages=2)
    assert _extract(text, MediaType.TEXT, max_pages=3)[1].pages == 3
    doc = tmp_path / "a.pdf"
    doc.write_bytes(pdf(["1", "2", "3"]))
    with pytest.raises(DocumentTooLarge, match="more than 2 pages"):
        _extract(doc, MediaType.PDF, max_pages=2)


def test_chunk_cap(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("word " * 1000)
    limits = DocumentLimits(chunk_chars=100, chunk_overlap=0, max_chunks=10)
    made = []
    with pytest.raises(
        DocumentTooLarge, match="more than 10 chunks; raise CONNECTOR_SYNC_DOCUMENTS_MAX_CHUNKS"
    ):
        for chunk in chunks(Extraction(path, MediaType.TEXT, limits), limits, name="a.txt"):
            made.append(chunk)
    assert len(made) == 10


def test_spool_writes_a_stream_to_disk_and_refuses_past_the_cap(tmp_path: Path) -> None:
    blocks = [b"x" * 1000] * 5
    with spool(iter(blocks), max_bytes=5000, directory=tmp_path) as spooled:
        assert spooled.size == 5000 and spooled.path.read_bytes() == b"x" * 5000
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(
        DocumentTooLarge, match="over 4,999 bytes; raise CONNECTOR_SYNC_DOCUMENTS_MAX_BYTES"
    ):
        spool(iter(blocks), max_bytes=4999, directory=tmp_path)
    assert list(tmp_path.iterdir()) == []  # the partial file is gone


def test_spool_reads_file_objects(tmp_path: Path) -> None:
    source = tmp_path / "in.bin"
    source.write_bytes(b"abc" * 10)
    with source.open("rb") as fh, spool(fh, max_bytes=100) as spooled:
        assert spooled.path.read_bytes() == b"abc" * 10
        assert spooled.sha256 == hashlib.sha256(b"abc" * 10).hexdigest()


@pytest.mark.parametrize(
    ("name", "declared", "head", "expected"),
    [
        ("notes.txt", None, b"", MediaType.TEXT),
        ("README.md", None, b"", MediaType.MARKDOWN),
        ("page.htm", None, b"", MediaType.HTML),
        ("scan", None, b"%PDF-1.7", MediaType.PDF),
        ("download", "application/pdf; qs=0.9", b"", MediaType.PDF),
        ("x.bin", "text/x-markdown", b"", MediaType.MARKDOWN),
    ],
)
def test_media_type_of(name: str, declared: str | None, head: bytes, expected: MediaType) -> None:
    assert media_type_of(name, declared, head) is expected


def test_unsupported_media_type_is_one_clear_line() -> None:
    with pytest.raises(
        UnsupportedDocument,
        match=r"^photo.jpg is image/jpeg, which cannot be indexed; supported: text, Markdown, "
        r"HTML and PDF$",
    ):
        media_type_of("photo.jpg")
