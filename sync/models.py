"""What the Python API returns: plain frozen records, never the credentials themselves."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Self
from uuid import UUID

from sync.vocabulary import TERMINAL_STATUSES, ConnectionStatus, JobError, RunKind, RunStatus


class _FromRow:
    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in row.items() if k in names})

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, datetime):
                value = value.isoformat()
            elif isinstance(value, timedelta):
                value = value.total_seconds()
            elif isinstance(value, UUID):
                value = str(value)
            elif isinstance(value, JobError):
                value = value.to_json()
            out[f.name] = value
        return out


@dataclass(frozen=True)
class Workspace(_FromRow):
    id: int
    name: str
    created_at: datetime
    deleted_at: datetime | None = None  # set: deleted (its connections are purged, then hidden)
    connections: int = 0  # how many connections it has (being purged, once deleted)


@dataclass(frozen=True)
class Connection(_FromRow):
    id: int
    workspace_id: int
    name: str
    provider: str
    config: dict[str, Any]
    status: ConnectionStatus
    schedule_every: timedelta | None
    next_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    has_credentials: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        row = dict(row)
        row["has_credentials"] = row.pop("credentials", None) is not None
        row["status"] = ConnectionStatus(row["status"])
        return super().from_row(row)


@dataclass(frozen=True)
class Run(_FromRow):
    id: int
    connection_id: int | None
    workspace_id: int
    provider: str
    kind: RunKind
    status: RunStatus
    trigger: str
    attempts: int
    max_attempts: int
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    lease_owner: UUID | None
    lease_expires_at: datetime | None
    worker_id: str | None
    cancel_requested_at: datetime | None
    results: dict[str, Any]
    error: JobError | None
    processed_units: int
    total_units: int | None
    waits: int = 0
    waiting_for: str | None = None
    waiting_until: datetime | None = None
    progress: dict[str, Any] | None = None
    # The id of the run's connection once that connection is deleted (connection_id is None).
    deleted_connection_id: int | None = None
    # When the run was first queued; queued_at is when its next attempt may start.
    first_queued_at: datetime | None = None  # from_row always sets it

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        row = dict(row)
        row["kind"], row["status"] = RunKind(row["kind"]), RunStatus(row["status"])
        row["error"] = JobError.parse(row.get("error"))
        if row.get("first_queued_at") is None:  # the column allows NULL
            row["first_queued_at"] = min(
                t for t in (row["queued_at"], row.get("started_at")) if t is not None
            )
        return super().from_row(row)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def cancel_came_late(self) -> bool:
        """A cancel was asked for while the run was finishing: its work was done before its
        worker read the request, so it ended as the work did, not cancelled."""
        return (
            self.cancel_requested_at is not None
            and self.is_terminal
            and self.status != RunStatus.CANCELLED
        )

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "cancel_came_late": self.cancel_came_late}


@dataclass(frozen=True)
class Attempt(_FromRow):
    run_id: int
    attempt: int
    worker_id: str
    lease_owner: UUID
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None  # a run status, or retry, rate_limited, handed_back
    error: JobError | None
    results: dict[str, Any] | None
    waiting_for: str | None = None
    waiting_until: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Self:
        row = dict(row)
        row["error"] = JobError.parse(row.get("error"))
        return super().from_row(row)


@dataclass(frozen=True)
class WorkerInfo(_FromRow):
    id: str
    hostname: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    current_run_id: int | None
    since_heartbeat: timedelta
    providers: list[str] | None = None  # what it can run; None: a worker of an older version
    incarnation: UUID | None = None  # one per start of this worker id
    lanes: dict[str, int] | None = None  # lanes per application queue; None: serves none

    def can_run(self, provider: str) -> bool:
        return self.providers is None or provider in self.providers


@dataclass(frozen=True)
class Record(_FromRow):
    table_name: str
    external_id: str
    data: dict[str, Any]
    first_seen_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
