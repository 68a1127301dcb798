"""Content arrives as a stream (an HTTP body, an archive member, a local file) and is written
to a temporary file as it comes, so a document is never held whole in memory. The byte cap is
enforced while writing: a stream that goes past it is refused at that point, whatever its
declared size, and its partial file is deleted."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sync.documents.errors import DocumentTooLarge
from sync.documents.limits import env_name

BLOCK = 1024 * 1024


@dataclass(frozen=True)
class SpooledFile:
    """A document's bytes on local disk. ``sha256`` identifies the content: a file whose hash
    did not change need not be indexed again. Delete it with :meth:`close` (or ``with``)."""

    path: Path
    size: int
    sha256: str

    def close(self) -> None:
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SpooledFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _blocks(source: Iterable[bytes] | BinaryIO) -> Iterable[bytes]:
    if hasattr(source, "read"):
        reader: BinaryIO = source  # type: ignore[assignment]
        while block := reader.read(BLOCK):
            yield block
    else:
        yield from source


def spool(
    source: Iterable[bytes] | BinaryIO,
    *,
    max_bytes: int,
    name: str = "the document",
    directory: Path | None = None,
) -> SpooledFile:
    """Write ``source`` (byte blocks, or a binary file object) to a new temporary file."""
    fd, raw = tempfile.mkstemp(prefix="connector-sync-", suffix=".spool", dir=directory)
    path = Path(raw)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for block in _blocks(source):
                size += len(block)
                if size > max_bytes:
                    raise DocumentTooLarge(
                        f"{name} is over {max_bytes:,} bytes; raise {env_name('max_bytes')} "
                        "to index it, or split it"
                    )
                digest.update(block)
                out.write(block)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return SpooledFile(path, size, digest.hexdigest())
