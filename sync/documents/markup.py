"""Markup to plain text, streamed: HTML through the standard library's incremental parser,
Markdown through markdown-it-py one section at a time.

Both keep the structure that matters for chunking: a block element (a paragraph, a heading, a
list item, a table row) ends with a blank line, which the chunker prefers as a cut point. Each
returns text pieces whose concatenation depends only on the input text, not on how it was
split into blocks, so the chunks built from them are the same however the file was read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser

from markdown_it import MarkdownIt
from markdown_it.token import Token

# HTML elements whose content is not text a person reads.
_HTML_SKIP = frozenset({"script", "style", "noscript", "template", "svg"})
# Elements that end a paragraph or a line of text.
_HTML_BLOCKS = frozenset(
    {
        "address", "article", "aside", "blockquote", "dd", "details", "div", "dl", "dt",
        "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5",
        "h6", "header", "hr", "li", "main", "nav", "ol", "p", "pre", "section", "summary",
        "table", "tr", "ul", "title",
    }
)  # fmt: skip
_HTML_CELLS = frozenset({"td", "th"})
# HTML collapses whitespace; mapping each whitespace character to a space (the chunker
# collapses runs) keeps the output independent of where the input was split.
_WHITESPACE = str.maketrans({c: " " for c in "\t\n\r\x0b\x0c"})


class _HtmlText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._skipping: list[str] = []
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HTML_SKIP:
            self._skipping.append(tag)
        elif tag == "br":
            self.out.append("\n")
        elif tag in _HTML_CELLS:
            self.out.append(" ")
        elif tag == "pre":
            self._pre += 1
            self.out.append("\n\n")
        elif tag in _HTML_BLOCKS:
            self.out.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self._skipping:
            if tag == self._skipping[-1]:
                self._skipping.pop()
            return
        if tag == "pre":
            self._pre = max(self._pre - 1, 0)
        if tag in _HTML_BLOCKS:
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._skipping:
            return
        self.out.append(data if self._pre else data.translate(_WHITESPACE))

    def drain(self) -> str:
        text = "".join(self.out)
        self.out.clear()
        return text


def html_text(blocks: Iterable[str]) -> Iterator[str]:
    """The readable text of an HTML document given as decoded blocks."""
    parser = _HtmlText()
    for block in blocks:
        parser.feed(block)
        if text := parser.drain():
            yield text
    parser.close()
    if text := parser.drain():
        yield text


# Markdown is rendered a section at a time: a section ends at a blank line outside a code
# fence once it holds this many characters. Reference-style links whose definition sits in
# another section keep their brackets; their text is indexed all the same.
SECTION_CHARS = 64 * 1024
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_BLOCK_END = frozenset(
    {
        "paragraph_close", "heading_close", "list_item_close", "blockquote_close",
        "tr_close", "table_close", "bullet_list_close", "ordered_list_close",
    }
)  # fmt: skip


def _markdown() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _sections(lines: Iterable[str]) -> Iterator[str]:
    section: list[str] = []
    size = 0
    fence: str | None = None
    for line in lines:
        match = _FENCE.match(line)
        if match:
            mark = match.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence):
                fence = None
        section.append(line)
        size += len(line)
        if size >= SECTION_CHARS and fence is None and not line.strip():
            yield "".join(section)
            section, size = [], 0
    if section:
        yield "".join(section)


def _inline_text(token: Token) -> str:
    parts = []
    for child in token.children or []:
        if child.type in ("text", "code_inline", "html_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif child.type == "image":
            parts.append(_inline_text(child))
    return "".join(parts)


def markdown_text(lines: Iterable[str]) -> Iterator[str]:
    """The text of a Markdown document given as lines (each at most ``SECTION_CHARS`` long),
    without its markup: emphasis, link targets and fences go, their text stays."""
    md = _markdown()
    for section in _sections(lines):
        parts: list[str] = []
        for token in md.parse(section):
            if token.type == "inline":
                parts.append(_inline_text(token))
            elif token.type in ("fence", "code_block", "html_block"):
                parts.append(token.content + "\n\n")
            elif token.type in ("th_close", "td_close"):
                parts.append(" ")
            elif token.type in _BLOCK_END:
                parts.append("\n\n")
        if text := "".join(parts):
            yield text
