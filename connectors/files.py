"""Files a connector exposes: documents (drawing sets, specifications, SharePoint files) whose
content the engine can fetch later and turn into searchable chunks.

A table whose records include files says so with ``Table(..., files=True)``. Its records are
stored like every other table's: synced, skipped when their content hash did not change, and
tombstoned when they disappear upstream. Two methods of the connector do the rest:

- ``describe_file(table, record)`` reads a stored record and says whether it is a file and, if
  so, the :class:`File` the engine needs to know about (name, media type, size, version, scope).
  It is pure: it needs neither the provider nor the connection, so any worker can call it on any
  stored row.
- ``download(table, record, out, max_bytes=...)`` streams that file's content into ``out``,
  given only the stored record and the connection's config and credentials. It runs on
  whichever worker indexes the file, long after the listing that produced the row.

Why the record is described, rather than yielded as a separate kind of item: the stored row
stays the provider's own record (a Graph driveItem, as the provider sent it), so a table that
mixes files and folders, or that starts exposing files later, changes nothing in what is
stored, and every file's description can be recomputed from rows already in Postgres.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class File:
    """What the engine knows of one file, read from its stored record. The file's identity is its
    row's: the connection, the table and the record's primary key."""

    name: str
    """The file's name, with its extension (``Site plan rev C.pdf``)."""
    scope: str
    """Where the file lives, as the provider groups files and grants access to them: a project
    (``project:12``), a folder of a drive (``drive:b!x/folder:01AB``). A file whose scope
    changes has moved."""
    media_type: str | None = None
    """The media type the provider declares (``application/pdf``); None when it declares none."""
    size: int | None = None
    """The size in bytes the provider declares; None when it declares none."""
    version: str | None = None
    """Changes when the file's content changes: a content hash the provider computes (a
    SHA-256, Graph's quickXorHash) or its content tag (Graph's cTag), else a tag that may also
    change with the file's metadata (an eTag). None when the provider gives none: only the
    downloaded bytes tell then."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a file needs a name")
        if not self.scope:
            raise ValueError(f"file {self.name!r} needs a scope (its project, folder or drive)")
        if self.size is not None and self.size < 0:
            raise ValueError(f"file {self.name!r} has a negative size ({self.size})")


@dataclass(frozen=True)
class Download:
    """What a download wrote: ``size`` bytes whose SHA-256 is ``sha256``, and the media type the
    server sent them as. ``status`` is the final response's status: 200, or a status the caller
    expected (a 404 of a deleted item), in which case nothing was written."""

    status: int
    size: int
    sha256: str
    media_type: str | None
