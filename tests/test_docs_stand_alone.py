"""The docs and the code's comments stand alone: they cite no document outside the repository
(a specification's sections, a tracker's tickets, files beside the repository)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
SCANNED = (
    "README.md",
    "docs",
    "sync",
    "connectors",
    "sql",
    "bench",
    "examples",
    "scripts",
    "tests",
)
SUFFIXES = {".md", ".py", ".sql", ".toml", ".html", ".css", ".sh", ".txt", ".cfg", ".ini"}

OUTSIDE = re.compile(
    # A specification by name or section (a constant named SPEC in a test is no citation, and
    # "§5" alone may be a section of the same document).
    r"\bSPEC(?:\.md|'s|\s*§|\s+section)|\.\./shared\b|\bSTYLE\.md\b"
    # A tracker's ticket.
    r"|(?i:\b(?:of|in|per|from|by|see) (?:issue|ticket) #?\d+\b|\bin the (?:issue|ticket)\b)"
)


def citations(text: str) -> list[tuple[int, str]]:
    """The lines of ``text`` (numbered from 1) that cite something outside the repository."""
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE.search(line)
    ]


def test_nothing_in_the_repository_cites_a_document_outside_it() -> None:
    found = []
    for top in SCANNED:
        paths = [ROOT / top] if (ROOT / top).is_file() else sorted((ROOT / top).rglob("*"))
        for path in paths:
            if path.suffix not in SUFFIXES or path == Path(__file__):
                continue
            name = path.relative_to(ROOT).as_posix()
            for number, line in citations(path.read_text(encoding="utf-8", errors="replace")):
                found.append(f"{name}:{number}: {line}")
    assert not found, "\n".join(found)


def test_the_check_finds_the_citations_it_is_for() -> None:
    cited = [
        "## Summary against the targets of issue 6",
        "(`tests/test_retry_policy.py`), and the claim against a model of SPEC §4: random",
        "reference figure in the issue (bare ≈ 2.3 ms) must have been taken",
        "see ../shared/STYLE.md",
    ]
    assert [n for n, _ in citations("\n".join(cited))] == [1, 2, 3, 4]
    fine = [
        "queues.declare_queue(queue_spec(DEAD, retention=30 * 86400))",
        "# The complete pass: issue #50 is deleted after page 1 was served",
        'SPEC = "01BYE5RZ2KXWOTNNU3ZFAJ5K2BDQQFJ5FN"  # Pump station spec.docx',
    ]
    assert citations("\n".join(fine)) == []
