"""The documents the simulated provider serves: text, Markdown, HTML, PDF and ZIP files whose
bytes are a pure function of a seed, so a test or a benchmark can predict every byte.

PDFs are written here, with the few objects a text-only PDF needs (a catalog, a page tree, the
standard Helvetica font, a page and a content stream per page, and the cross-reference table),
because the simulated provider runs wherever connector-sync is installed and must not depend on
a PDF library that only the tests install. ZIPs come from the standard library, with fixed
timestamps so the same seed gives the same bytes.
"""

from __future__ import annotations

import io
import random
import zipfile
from dataclasses import dataclass

KINDS = ("txt", "md", "html", "pdf", "zip")
MEDIA_TYPES = {
    "txt": "text/plain",
    "md": "text/markdown",
    "html": "text/html",
    "pdf": "application/pdf",
    "zip": "application/zip",
}
TITLES = {
    "txt": "Site walk",
    "md": "Specification",
    "html": "Meeting notes",
    "pdf": "Drawing set",
    "zip": "Submittals",
}

_VOCABULARY = (
    "steel beam column footing slab rebar concrete pour formwork curing inspection submittal "
    "revision drawing detail section elevation schedule door frame hardware fire rating "
    "guardrail stair landing handrail anchor bolt weld grout membrane flashing roof drain "
    "duct riser valve pump sprinkler conduit panel feeder lighting fixture ceiling partition "
    "drywall finish paint tile joint sealant crane delivery site safety permit architect "
    "engineer contractor owner approved rejected pending closed open clarification change "
    "order bulletin addendum transmittal markup level grid axis north south east west"
)
_WORDS = tuple(_VOCABULARY.split())
_FIXED_TIME = (2024, 1, 2, 3, 4, 6)  # ZIP members' timestamps: the same bytes every time


@dataclass(frozen=True)
class Document:
    """One generated file: its name, media type and bytes."""

    name: str
    media_type: str
    content: bytes


def kind_of(file_id: int) -> str:
    """Files cycle through the kinds by id, so any five consecutive ids hold one of each."""
    return KINDS[(file_id - 1) % len(KINDS)]


def generate(file_id: int, version: int, seed: str) -> Document:
    """The document with this id at this content version (pure)."""
    kind = kind_of(file_id)
    rng = random.Random(f"{seed}:file:{file_id}:{version}")
    title = f"{TITLES[kind]} {file_id}"
    if kind == "txt":
        content = _text(rng, title).encode()
    elif kind == "md":
        content = _markdown(rng, title).encode()
    elif kind == "html":
        content = _html(rng, title).encode()
    elif kind == "pdf":
        content = pdf([_lines(rng, 24) for _ in range(rng.randint(2, 3))])
    else:
        content = _zip(rng, file_id)
    return Document(f"{title}.{kind}", MEDIA_TYPES[kind], content)


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 14))]
    return " ".join(words).capitalize() + "."


def _paragraph(rng: random.Random) -> str:
    return " ".join(_sentence(rng) for _ in range(rng.randint(3, 6)))


def _lines(rng: random.Random, count: int) -> list[str]:
    return [_sentence(rng) for _ in range(count)]


def _text(rng: random.Random, title: str) -> str:
    pages = [
        "\n\n".join(_paragraph(rng) for _ in range(rng.randint(3, 5)))
        for _ in range(rng.randint(1, 3))
    ]
    # A form feed between pages, as pdftotext writes them.
    return f"{title}\n\n" + "\n\f".join(pages) + "\n"


def _markdown(rng: random.Random, title: str) -> str:
    parts = [f"# {title}"]
    for number in range(1, rng.randint(3, 5)):
        parts.append(f"## {number}. {rng.choice(_WORDS).title()} {rng.choice(_WORDS)}")
        parts.append(_paragraph(rng))
        parts.append("\n".join(f"- **{rng.choice(_WORDS)}**: {_sentence(rng)}" for _ in range(3)))
    parts.append(f"See [the drawing set](https://example.test/drawings/{rng.randint(1, 99)}).")
    return "\n\n".join(parts) + "\n"


def _html(rng: random.Random, title: str) -> str:
    body = "".join(f"<p>{_paragraph(rng)}</p>" for _ in range(rng.randint(2, 4)))
    items = "".join(f"<li>{_sentence(rng)}</li>" for _ in range(3))
    return (
        f"<!DOCTYPE html><html><head><title>{title}</title>"
        "<style>p { margin: 0 }</style></head>"
        f"<body><h1>{title}</h1>{body}<ul>{items}</ul>"
        "<script>console.log('not indexed')</script></body></html>\n"
    )


def _zip(rng: random.Random, file_id: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, text in (
            ("readme.txt", _paragraph(rng)),
            (f"submittals/{file_id}-shop-drawings.md", f"# Shop drawings\n\n{_paragraph(rng)}"),
            (f"submittals/{file_id}-product-data.txt", _paragraph(rng)),
        ):
            member = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, text + "\n")
    return buffer.getvalue()


def pdf(pages: list[list[str]]) -> bytes:
    """A PDF with one page per list of lines, set in Helvetica (pure). Lines must be Latin-1."""
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids ["
        + b" ".join(b"%d 0 R" % (4 + 2 * i) for i in range(len(pages)))
        + b"] /Count %d >>" % len(pages),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>",
    ]
    for i, lines in enumerate(pages):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (5 + 2 * i)
        )
        shown = b" ".join(b"(" + _pdf_string(line) + b") Tj T*" for line in lines)
        stream = b"BT /F1 10 Tf 13 TL 56 750 Td " + shown + b" ET"
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def _pdf_string(text: str) -> bytes:
    raw = text.encode("latin-1")
    return raw.replace(b"\\", b"\\\\").replace(b"(", b"\\(").replace(b")", b"\\)")
