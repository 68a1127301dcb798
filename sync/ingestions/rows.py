"""The typed values the ingestion store takes and gives back: a claimed ingestion, the reads of
the recipe, and what its fenced writes and an archive's expansion report."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sync.store.rows import FromRow, Lease


@dataclass(frozen=True)
class ClaimedIngestion(FromRow):
    """An ingestion (or an archive expansion) as its claim returned it, with what fetching its
    file needs of its connection (None for a local file, or a connection since deleted)."""

    id: int
    workspace_id: int
    source: str  # "file" or "local"
    connection_id: int | None
    table_name: str | None
    external_id: str | None
    local_path: str | None
    member_path: str  # '' for the file itself
    archive_sha256: str | None  # a member's: the archive's bytes when it was expanded
    name: str | None
    scope: str | None
    attempts: int
    max_attempts: int
    lease_owner: UUID | None  # None for an archive expansion, which holds no lease
    processing_since: datetime | None  # an archive expansion's guard
    provider: str | None
    config: dict[str, Any] | None
    credentials: bytes | None
    connection_status: str | None
    budget_key: str | None

    @property
    def lease(self) -> Lease:
        """The hold of a claimed document ingestion (an expansion has none)."""
        assert self.lease_owner is not None, "an archive expansion holds no lease"
        return Lease(self.id, self.lease_owner)


@dataclass(frozen=True)
class FileRecord(FromRow):
    """The stored record of a synced file, tombstoned (``deleted_at``) or not."""

    data: dict[str, Any]
    content_hash: bytes
    deleted_at: datetime | None


@dataclass(frozen=True)
class IndexedDocument(FromRow):
    """A ready document a file is indexed into, as an attempt finds it: the bytes its chunks
    were made from (their SHA-256 and the provider's version), how many, and with what
    embedding model and chunk settings (all written by the finish that made it ready)."""

    id: int
    version: str | None
    content_sha256: str
    indexed_with: str
    chunks: int


@dataclass(frozen=True)
class Begun:
    document_id: int
    processed_units: int  # where this attempt starts


@dataclass(frozen=True)
class Finished:
    fenced: bool  # False: the lease is lost
    finished: bool  # False (fenced): the file changed or moved meanwhile; nothing marked ready
    checkpoint: int | None = None  # the ingestion's processed_units as the finish found them


@dataclass(frozen=True)
class Member:
    path: str
    sha256: str
    name: str


@dataclass(frozen=True)
class Expanded:
    """What an archive's expansion wrote: ``finished`` False when it was reclaimed by another
    worker or cancelled (then nothing was written)."""

    finished: bool
    queued: int  # members queued for ingestion


@dataclass(frozen=True)
class IndexedWith(FromRow):
    """A workspace's ready documents with chunks made by one embedding model and chunk
    settings (``indexed_with``)."""

    indexed_with: str
    documents: int
    chunks: int
