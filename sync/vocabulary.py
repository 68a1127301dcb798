"""The words the engine, its SQL, its API and its command line share: the statuses of runs,
connections and tables, the kinds of runs and of errors, and :class:`JobError`, what a failed
attempt of any kind of work says went wrong.

Each enum is a ``StrEnum`` whose values are the strings stored in Postgres, so a member is
passed to a statement as is and compares equal to what a row returns. This module imports
nothing of the engine: every layer may use it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from connectors.errors import ConnectorError, RateLimited


class RunStatus(StrEnum):
    """``connection_runs.status``."""

    WAITING = "waiting"  # a purge draining behind the sync still running
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PARTIAL = "partial"  # some tables failed for good, the others were read
    FAILED = "failed"
    CANCELLED = "cancelled"


# A run in one of these has ended: nothing claims it again unless an operator retries it.
TERMINAL_STATUSES = frozenset(
    {RunStatus.SUCCEEDED, RunStatus.PARTIAL, RunStatus.FAILED, RunStatus.CANCELLED}
)


class RunKind(StrEnum):
    """``connection_runs.kind``."""

    SYNC = "sync"
    PURGE = "purge"  # deletes a deleted connection's data


class ConnectionStatus(StrEnum):
    """``connections.status``."""

    ACTIVE = "active"
    PAUSED = "paused"
    DISCONNECTED = "disconnected"  # its credentials were refused: it needs new ones
    DELETING = "deleting"  # its purge is queued or running


class TableStatus(StrEnum):
    """The status of one table (or partition) in a run's per-table results."""

    PENDING = "pending"  # not read yet in any attempt
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # a permanent failure: no retry will help
    RETRY = "retry"  # a retryable failure: the next attempt reads it again
    CANCELLED = "cancelled"
    PARTIAL = "partial"  # some partitions failed for good, the others were read


# A table in one of these is not read again by a later attempt of the run.
SETTLED = frozenset({TableStatus.SUCCEEDED, TableStatus.FAILED, TableStatus.PARTIAL})


class ErrorKind(StrEnum):
    """``error.kind`` of any kind of work (a run, a table of it, an application job, an
    ingestion): what went wrong, in one word. The connector's errors (``connectors.errors``)
    carry the first seven as their ``kind``."""

    ERROR = "error"  # a connector error of no more precise kind
    RETRYABLE = "retryable"  # a transient fault of the provider
    RATE_LIMITED = "rate_limited"  # the provider's budget is spent
    PERMANENT = "permanent"  # retrying cannot help
    TOO_LARGE = "too_large"  # a download went past its byte limit
    GONE = "gone"  # not there upstream (404, 410): a deleted file, a partition out of reach
    AUTH = "auth"  # the credentials were refused: the connection is disconnected
    CONFIG = "config"  # the connection's config or credentials do not validate
    RECORD = "record"  # Postgres refused a record or a value (data error, constraint)
    DOCUMENT = "document"  # a file that cannot be indexed: unreadable, or an archive refused
    DATABASE = "database"  # a database error the next attempt may not meet
    INTERNAL = "internal"  # a bug: an unexpected exception
    TIMEOUT = "timeout"  # the run exceeded its timeout
    CANCELLED = "cancelled"
    DEADLINE = "deadline"  # the run waited past its deadline
    LEASE_EXPIRED = "lease_expired"  # the worker stopped renewing the lease (written in SQL)

    @classmethod
    def of(cls, exc: ConnectorError) -> ErrorKind:
        """The kind of a connector's error: its own, or that of the nearest class above it
        that has one of ours (a third party's subclass may name a kind of its own)."""
        for klass in type(exc).__mro__:
            kind = vars(klass).get("kind")
            if isinstance(kind, str) and kind in cls._value2member_map_:
                return cls(kind)
        return cls.ERROR


# Error kinds a later attempt may fix.
RETRYABLE_KINDS = frozenset(
    {
        ErrorKind.RETRYABLE,
        ErrorKind.RATE_LIMITED,
        ErrorKind.DATABASE,
        ErrorKind.INTERNAL,
        ErrorKind.TIMEOUT,
    }
)


@dataclass(frozen=True)
class JobError:
    """What went wrong with an attempt of any kind of work (a run, one table or partition of
    it, an application job, an ingestion), as stored in their ``error`` column: a kind, a
    message for people, and, for a run, where it happened."""

    kind: ErrorKind
    message: str
    retry_after: float | None = None  # seconds, when the provider said when to come back
    table: str | None = None
    partition: str | None = None

    @classmethod
    def of(cls, exc: ConnectorError) -> JobError:
        """The error a connector raised, as the attempt records it."""
        retry_after = exc.retry_after if isinstance(exc, RateLimited) else None
        return cls(ErrorKind.of(exc), exc.message, retry_after)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobError:
        """Read back what :meth:`to_json` stored (a kind this version does not know reads as
        ``error``)."""
        kind = str(data.get("kind"))
        retry_after = data.get("retry_after")
        return cls(
            kind=ErrorKind(kind) if kind in ErrorKind._value2member_map_ else ErrorKind.ERROR,
            message=str(data.get("message") or ""),
            retry_after=float(retry_after) if retry_after is not None else None,
            table=data.get("table"),
            partition=data.get("partition"),
        )

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None) -> JobError | None:
        return cls.from_json(data) if data else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "message": self.message}
        for name in ("retry_after", "table", "partition"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def with_message(self, message: str) -> JobError:
        return replace(self, message=message)

    @property
    def is_retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS
