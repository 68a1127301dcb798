"""Extraction: a spooled document's text, page by page, in reading order.

Plain text, Markdown and HTML are one page each, except that a form feed (``\\f``, which
``pdftotext`` and printers use between pages) starts a new page in plain text. PDF pages are
read one at a time with pypdf; there is no OCR, so a page with no text layer (a scan) yields
nothing and is counted in :attr:`Extraction.skipped_pages`.

Text is read in blocks from the file and never held whole; bytes that are not valid in the
document's encoding become U+FFFD, so extraction never fails on them and always gives the same
text for the same bytes.
"""

from __future__ import annotations

import codecs
import io
import logging
import mimetypes
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pypdf
from pypdf.errors import FileNotDecryptedError, PyPdfError

from sync.documents.errors import DocumentTooLarge, MalformedDocument, UnsupportedDocument
from sync.documents.limits import DocumentLimits, env_name
from sync.documents.markup import SECTION_CHARS, html_text, markdown_text

log = logging.getLogger(__name__)

READ_CHARS = 64 * 1024


class MediaType(StrEnum):
    TEXT = "text/plain"
    MARKDOWN = "text/markdown"
    HTML = "text/html"
    PDF = "application/pdf"


_ALIASES = {
    "text/x-markdown": MediaType.MARKDOWN,
    "application/xhtml+xml": MediaType.HTML,
    "application/x-pdf": MediaType.PDF,
}
_SUFFIXES = {
    ".txt": MediaType.TEXT,
    ".text": MediaType.TEXT,
    ".log": MediaType.TEXT,
    ".csv": MediaType.TEXT,
    ".md": MediaType.MARKDOWN,
    ".markdown": MediaType.MARKDOWN,
    ".htm": MediaType.HTML,
    ".html": MediaType.HTML,
    ".xhtml": MediaType.HTML,
    ".pdf": MediaType.PDF,
}


def indexable(name: str) -> bool:
    """Whether a file's name says it can be indexed: a type extraction reads, or an archive."""
    suffix = Path(name).suffix.lower()
    return suffix in _SUFFIXES or suffix == ".zip"


def media_type_of(name: str, declared: str | None = None, head: bytes = b"") -> MediaType:
    """The media type to extract ``name`` as: the declared one (a provider's Content-Type) if
    we read it, else by the file name's suffix, else by its first bytes."""
    if declared:
        kind = declared.split(";")[0].strip().lower()
        if kind in _ALIASES:
            return _ALIASES[kind]
        try:
            return MediaType(kind)
        except ValueError:
            pass
    suffix = Path(name).suffix.lower()
    if suffix in _SUFFIXES:
        return _SUFFIXES[suffix]
    if head.startswith(b"%PDF-"):
        return MediaType.PDF
    guessed = declared or mimetypes.guess_type(name)[0] or "an unknown type"
    raise UnsupportedDocument(
        f"{name} is {guessed}, which cannot be indexed; supported: text, Markdown, HTML and PDF"
    )


@dataclass(frozen=True)
class Segment:
    """A piece of a page's text; a page's segments, in order, are its whole text."""

    page: int  # from 1
    text: str


class Extraction:
    """The text of one document, as :class:`Segment` s in reading order. Iterate it once;
    ``pages`` and ``skipped_pages`` are final when the iteration ends."""

    def __init__(
        self, path: Path, media_type: MediaType, limits: DocumentLimits, *, name: str = ""
    ) -> None:
        self.path = path
        self.media_type = media_type
        self.limits = limits
        self.name = name or path.name
        self.pages = 0
        self.skipped_pages = 0

    def __iter__(self) -> Iterator[Segment]:
        self.pages = self.skipped_pages = 0
        if self.media_type is MediaType.PDF:
            yield from self._pdf()
        elif self.media_type is MediaType.TEXT:
            yield from self._text()
        else:
            self.pages = 1
            with self._open_text() as text:
                if self.media_type is MediaType.HTML:
                    pieces = html_text(iter(lambda: text.read(READ_CHARS), ""))
                else:
                    pieces = markdown_text(iter(lambda: text.readline(SECTION_CHARS), ""))
                for piece in pieces:
                    yield Segment(1, piece)

    def _open_text(self) -> io.TextIOWrapper:
        with self.path.open("rb") as probe:
            head = probe.read(4)
        encoding = "utf-8-sig"
        if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
            encoding = "utf-16"
        # newline=None: \r\n and \r become \n, also across block boundaries.
        return io.TextIOWrapper(
            self.path.open("rb"), encoding=encoding, errors="replace", newline=None
        )

    def _text(self) -> Iterator[Segment]:
        page = 1
        self.pages = 1
        ended_with_feed = False
        with self._open_text() as text:
            while block := text.read(READ_CHARS):
                for i, part in enumerate(block.split("\f")):
                    if i:
                        page += 1
                        self._check_pages(page)
                    if part:
                        yield Segment(page, part)
                ended_with_feed = block.endswith("\f")
        # A form feed that ends the file closes its last page; it opens no new one.
        self.pages = page - 1 if ended_with_feed and page > 1 else page

    def _check_pages(self, pages: int) -> None:
        if pages > self.limits.max_pages:
            raise DocumentTooLarge(
                f"{self.name} has more than {self.limits.max_pages:,} pages; raise "
                f"{env_name('max_pages')} to index it, or split it"
            )

    def _pdf(self) -> Iterator[Segment]:
        with self.path.open("rb") as raw:
            try:
                # A file object, not a path: given a path, pypdf reads the whole file into memory.
                reader = pypdf.PdfReader(raw)
                if reader.is_encrypted and not reader.decrypt(""):
                    raise FileNotDecryptedError("a password is needed")
                count = len(reader.pages)
            except (PyPdfError, ValueError, KeyError, TypeError, OSError) as exc:
                raise MalformedDocument(_pdf_problem(self.name, exc)) from None
            self._check_pages(count)
            self.pages = count
            for number in range(1, count + 1):
                try:
                    text = reader.pages[number - 1].extract_text()
                except Exception as exc:  # pypdf raises many types on a damaged page
                    log.warning("%s: page %d has unreadable text (%s)", self.name, number, exc)
                    text = ""
                if text.strip():
                    yield Segment(number, text)
                else:
                    self.skipped_pages += 1


def _pdf_problem(name: str, exc: Exception) -> str:
    if isinstance(exc, FileNotDecryptedError) or "decrypt" in str(exc).lower():
        return f"{name} is an encrypted PDF; index a copy saved without a password"
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return f"{name} is not a readable PDF ({reason}); check that the file is complete"
