"""What ``ingest PATH...`` means on disk: each file named, and the files of each folder named (of
its subfolders too, in name order), leaving out hidden files and folders (a name that starts with
a dot) and, in folders, files of a type that cannot be indexed. Reads directories only."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sync.documents import indexable
from sync.errors import InvalidInput


@dataclass(frozen=True)
class LocalFiles:
    files: tuple[Path, ...]  # absolute, each once, in the order given (a folder's by name)
    skipped: tuple[Path, ...]  # files found in a folder whose type cannot be indexed


def local_files(paths: Sequence[str | Path]) -> LocalFiles:
    """The files to index for ``paths``, or :class:`InvalidInput` (before anything is queued)
    for a path that is neither a file nor a folder, or when there is no file to index."""
    if not paths:
        raise InvalidInput("give the files or folders to index")
    files: dict[Path, None] = {}
    skipped: list[Path] = []
    for given in paths:
        path = Path(given).expanduser()
        if path.is_dir():
            for found in _walk(path.resolve()):
                if indexable(found.name):
                    files.setdefault(found)
                else:
                    skipped.append(found)
        elif path.is_file():
            files.setdefault(path.resolve())
        else:
            raise InvalidInput(f"{given} is not a file or a folder; give files or folders to index")
    if not files:
        kinds = sorted({p.suffix or p.name for p in skipped})
        raise InvalidInput(
            "no file that can be indexed (text, Markdown, HTML, PDF or ZIP) in "
            + ", ".join(str(p) for p in paths)
            + (f"; found only {', '.join(kinds[:8])}" if kinds else "")
        )
    return LocalFiles(tuple(files), tuple(skipped))


def _walk(folder: Path) -> Iterator[Path]:
    for root, folders, names in os.walk(folder):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        for name in sorted(names):
            if not name.startswith("."):
                yield Path(root) / name
