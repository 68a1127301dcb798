"""How the command line prints for people: a console as wide as the terminal (or ``$COLUMNS``
when there is none), tables that fit that width, times with their date and zone, durations and
errors in words.

A table fits by giving up what matters least first: long text (names) wraps between words, a
hyphen or a slash ending a word too, or is cut at its end; identifiers (field names, providers)
and times wrap only at spaces, so never inside one; then optional columns leave in a fixed
order. Errors are not squeezed into a column: the commands print them below their table,
whole. Key columns (ids, statuses) never shrink and never leave, so a listing at 60 columns
still says which run is which and how it stands.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from rich import box
from rich.cells import cell_len, chop_cells
from rich.console import Console
from rich.table import Table
from rich.text import Text

from sync.vocabulary import JobError

Cell = str | Text

STATUS_STYLE = {
    "succeeded": "green",
    "ready": "green",
    "skipped": "dim",
    "partial": "yellow",
    "failed": "red",
    "cancelled": "magenta",
    "running": "cyan",
    "queued": "blue",
    "waiting": "blue",
    "active": "green",
    "paused": "yellow",
    "disconnected": "red",
    "deleting": "magenta",
    "alive": "green",
    "stale": "red",
    "stopped": "dim",
}


def console() -> Console:
    """The console for stdout: the terminal's width, or ``$COLUMNS`` (80 when unset) when the
    output goes to a pipe or a file."""
    return Console(highlight=False)


def styled(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


# -- times and durations -----------------------------------------------------------------------


def when(value: datetime | None, *, seconds: bool = True) -> str:
    """A time in the local zone, with its date and zone: ``2025-03-04 14:05:09 CET``."""
    if value is None:
        return "-"
    local = value.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def format_duration(seconds: float | None) -> str:
    """How long something took: ``3.2s``, ``1m05s``, ``1h30m``, ``2d07h``."""
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


# -- errors -------------------------------------------------------------------------------------


def error_text(error: JobError | Mapping[str, Any] | None, *, status: str | None = None) -> str:
    """A run's or table's error in words: ``kind: message``, without repeating the kind when
    it only restates the status (a cancelled run's error of kind ``cancelled``)."""
    if not error:
        return ""
    if isinstance(error, JobError):
        kind, message = str(error.kind), error.message
    else:
        kind, message = str(error.get("kind") or "error"), str(error.get("message") or "")
    if kind == status or message.startswith(kind):
        return message or kind
    return f"{kind}: {message}" if message else kind


# -- tables that fit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column of a fitted table.

    ``key``: never cut, never dropped (ids, statuses). ``text``: long text that may wrap
    (``fold``), be cut at its end (``ellipsis``), or wrap only at its spaces (``words``: lists
    of identifiers, times), to make room; it shrinks before any column is dropped. Other
    columns are dropped when there is still no room, the lowest ``keep`` first."""

    header: str
    key: bool = False
    text: Literal["fold", "ellipsis", "words"] | None = None
    keep: int = 0
    justify: Literal["left", "right"] = "left"


GAP = 2  # the space between two columns
TEXT_MIN = 12  # long text keeps at least this many cells (or its header's) before columns go
WORD_MAX = 24  # a list keeps room for its longest word, up to this: longer ones are cut


def fit_widths(columns: Sequence[Col], rows: Sequence[Sequence[Cell]], width: int) -> list[int]:
    """The width of each column (0: dropped) so the table fits ``width`` cells (pure). Text
    columns shrink to a floor first; then optional columns leave, the lowest ``keep`` first
    (text ones last); key columns keep their full width whatever happens."""
    count = len(columns)
    natural = [
        max([_cells(c.header)] + [_cells(row[i]) for row in rows]) for i, c in enumerate(columns)
    ]
    floor = [
        min(natural[i], max(_cells(c.header), TEXT_MIN, _longest_word(c, rows, i)))
        for i, c in enumerate(columns)
    ]
    shown = set(range(count))

    def shrunk() -> list[int] | None:
        widths = [natural[i] if i in shown else 0 for i in range(count)]
        excess = sum(widths) + GAP * (len(shown) - 1) - width
        while excess > 0:
            texts = [i for i in shown if columns[i].text and widths[i] > floor[i]]
            if not texts:
                return None
            widest = max(texts, key=lambda i: widths[i] - floor[i])
            widths[widest] -= 1
            excess -= 1
        return widths

    while (widths := shrunk()) is None:
        optional = [i for i in shown if not columns[i].key]
        if not optional:  # the key columns alone are wider than the console: let them be
            return [natural[i] if i in shown else 0 for i in range(count)]
        shown.remove(min(optional, key=lambda i: (bool(columns[i].text), columns[i].keep, -i)))
    return widths


def fitted_table(
    columns: Sequence[Col],
    rows: Sequence[Sequence[Cell]],
    width: int,
    *,
    title: str | None = None,
) -> Table:
    widths = fit_widths(columns, rows, width)
    table = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    shown = [i for i, w in enumerate(widths) if w]
    for i in shown:
        col = columns[i]
        table.add_column(
            col.header,
            width=widths[i],
            no_wrap=col.text != "fold",
            overflow="fold" if col.text == "fold" else "ellipsis",
            justify=col.justify,
            header_style="bold",
        )
    wrap = {"fold": break_words, "words": break_words_only}
    for row in rows:
        table.add_row(
            *(
                wrap[text](row[i], widths[i]) if (text := columns[i].text) in wrap else row[i]
                for i in shown
            )
        )
    return table


def _longest_word(col: Col, rows: Sequence[Sequence[Cell]], i: int) -> int:
    """The widest word of a ``words`` column (at most ``WORD_MAX``): it never breaks."""
    if col.text != "words":
        return 0
    words = (w for row in rows if isinstance(row[i], str) for w in str(row[i]).split())
    return min(max(map(cell_len, words), default=0), WORD_MAX)


def break_words_only(value: Cell, width: int) -> Cell:
    """``value`` wrapped to ``width`` cells at its spaces only, after a comma first: a list
    such as ``base_url (optional), token`` wraps between its items and never reads as
    ``base_`` / ``url``, a time as ``2025-03-04`` / ``14:05:09 CET``. Only a word wider than the
    column is cut, at its end (pure). Styled text is left to the table."""
    if not isinstance(value, str) or width <= 0 or cell_len(value) <= width:
        return value
    *heads, last = value.split(", ")
    lines: list[str] = []
    line = ""
    for item in [f"{head}," for head in heads] + [last]:
        if line and cell_len(f"{line} {item}") <= width:
            line = f"{line} {item}"
            continue
        if line:
            lines.append(line)
            line = ""
        for word in item.split():
            if cell_len(word) > width:
                word = chop_cells(word, width - 1)[0] + "…"
            if line and cell_len(f"{line} {word}") <= width:
                line = f"{line} {word}"
            else:
                if line:
                    lines.append(line)
                line = word
    if line:
        lines.append(line)
    return "\n".join(lines)


_WORD = re.compile(r"[^\s\-_/.,:;]+[\s\-_/.,:;]*|[\s\-_/.,:;]+")


def break_words(value: Cell, width: int) -> Cell:
    """``value`` wrapped to ``width`` cells at its word boundaries: spaces, and after the
    ``-_/.,:;`` that join the words of names, paths and URLs, so ``acme-engineering-monorepo``
    wraps as ``acme-engineering-`` / ``monorepo``, never mid-word; only a word wider than the
    column is cut (pure). Styled text is left to the table."""
    if not isinstance(value, str) or width <= 0 or cell_len(value) <= width:
        return value
    lines: list[str] = []
    line = ""
    for piece in _WORD.findall(value):
        if cell_len((line + piece).rstrip()) <= width:
            line += piece
            continue
        if line.strip():
            lines.append(line.rstrip())
        line = piece.lstrip() if lines else piece
        while cell_len(line.rstrip()) > width:
            head, *_ = chop_cells(line, width)
            lines.append(head)
            line = line[len(head) :]
    if line.strip():
        lines.append(line.rstrip())
    return "\n".join(lines)


def details(rows: Sequence[tuple[str, Cell]]) -> Table:
    """A two-column grid of labels and values; values wrap at the console's width."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="bold")
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, value)
    return grid


def _cells(value: Cell) -> int:
    text = value if isinstance(value, Text) else Text(value)
    return max((line.cell_len for line in text.split()), default=0)


def retry_when(at: datetime, now: datetime, *, countdown: bool) -> str:
    """When a retry starts: ``in 28s`` for a live view that counts down, ``at 14:05:12 UTC``
    for output without a terminal, which prints a line only when it changes."""
    if countdown:
        return f"in {(at - now).total_seconds():.0f}s"
    return f"at {at.astimezone(UTC):%H:%M:%S} UTC"
