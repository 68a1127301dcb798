"""What the Python API returns about ingestions: a plain frozen record of one ingestion (never
the credentials of its connection), its statuses and its kinds; and a search's results."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Self, overload
from uuid import UUID

from sync.documents import SearchHit


class IngestionStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    READY = "ready"  # the file's chunks are stored and searchable
    SKIPPED = "skipped"  # nothing to index: the record is not a file (a folder)
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset(
    {
        IngestionStatus.READY,
        IngestionStatus.SKIPPED,
        IngestionStatus.FAILED,
        IngestionStatus.CANCELLED,
    }
)


class IngestionKind(StrEnum):
    DOCUMENT = "document"  # leased; resumes at processed_units
    ARCHIVE = "archive"  # a ZIP expanded into member ingestions; processing_since, no lease


@dataclass(frozen=True)
class Ingestion:
    """One ingestion of one file: a synced file (connection, table, external id), or a local
    file (``local_path``); ``member_path`` names a member of an archive."""

    id: int
    workspace_id: int
    kind: IngestionKind
    status: IngestionStatus
    source: str  # "file" or "local"
    connection_id: int | None
    table_name: str | None
    external_id: str | None
    local_path: str | None
    member_path: str
    archive_id: int | None
    name: str | None
    scope: str | None
    document_id: int | None
    content_sha256: str | None
    attempts: int
    max_attempts: int
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    lease_owner: UUID | None
    lease_expires_at: datetime | None
    processing_since: datetime | None
    cancel_requested_at: datetime | None
    processed_units: int
    total_units: int | None
    results: dict[str, Any]
    error: dict[str, Any] | None
    # The embedding model and chunk settings of its chunks (set when an attempt begins them).
    indexed_with: str | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        values["kind"] = IngestionKind(values["kind"])
        values["status"] = IngestionStatus(values["status"])
        return cls(**values)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def file(self) -> str:
        """The file for people: its name, else where it comes from."""
        where = self.local_path or f"{self.table_name}/{self.external_id}"
        base = self.name or where
        if self.member_path:
            return f"{base} ({self.member_path})" if self.name else f"{where}/{self.member_path}"
        return base

    @property
    def source_text(self) -> str:
        """Where the file comes from: ``connection 3, files/17`` or a local path."""
        if self.source == "local":
            where = f"{self.local_path}"
        elif self.connection_id is None:
            where = f"a deleted connection, {self.table_name}/{self.external_id}"
        else:
            where = f"connection {self.connection_id}, {self.table_name}/{self.external_id}"
        return where + (f" ({self.member_path})" if self.member_path else "")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, UUID):
                value = str(value)
            elif isinstance(value, StrEnum):
                value = value.value
            out[f.name] = value
        return out


@dataclass(frozen=True)
class IngestedPaths:
    """What an ingest of paths queued: an ingestion per file (one already pending for a file is
    returned as it is), and the files of its folders left out for their type."""

    ingestions: tuple[Ingestion, ...]
    skipped: tuple[Path, ...] = ()


@dataclass(frozen=True)
class OtherModel:
    """Ready documents of a workspace whose chunks another embedding model made."""

    model: str
    documents: int
    chunks: int


@dataclass(frozen=True)
class SearchResults(Sequence[SearchHit]):
    """The hits of a search, best first (a sequence of :class:`SearchHit`), and what it could
    not do: the documents embedded by another model than the configured one (``words_only``),
    which it matched by their words only, since vectors of two models are never compared."""

    hits: tuple[SearchHit, ...]
    workspace_id: int
    model: str  # the configured embedder's, the only one compared by vector
    words_only: tuple[OtherModel, ...] = ()

    @overload
    def __getitem__(self, index: int) -> SearchHit: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[SearchHit]: ...

    def __getitem__(self, index: int | slice) -> SearchHit | Sequence[SearchHit]:
        return self.hits[index]

    def __len__(self) -> int:
        return len(self.hits)

    def __iter__(self) -> Iterator[SearchHit]:
        return iter(self.hits)

    @property
    def notice(self) -> str | None:
        """One line about the documents matched by their words only, or None."""
        if not self.words_only:
            return None
        documents = sum(m.documents for m in self.words_only)
        chunks = sum(m.chunks for m in self.words_only)
        models = " and ".join(m.model for m in self.words_only)
        return (
            f"{documents:,} document(s) ({chunks:,} chunks) were embedded by {models}, not "
            f"the configured {self.model}, so they match by their words only; "
            f"`connector-sync ingestions reindex -w {self.workspace_id}` embeds them again"
        )
