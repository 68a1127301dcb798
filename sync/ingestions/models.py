"""What the Python API returns about ingestions: a plain frozen record of one ingestion (never
the credentials of its connection), its statuses and its kinds."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Self
from uuid import UUID


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
