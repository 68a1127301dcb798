"""The typed values the store takes and gives back: a lease, a claimed run, what a control read
says, and the rows of the fenced statements."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple, Self
from uuid import UUID


@dataclass(frozen=True)
class Lease:
    """A claim's hold on one leased row: the row's id, and the fencing token the claim wrote
    as its lease owner. Every write the holder makes re-checks both."""

    id: int
    owner: UUID


class FromRow:
    """A typed row built from a dict row by field name: a store's rows derive from it."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        """The fields of this row type, taken by name from a row with perhaps more columns."""
        return cls(**{name: row[name] for name in _field_names(cls)})


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    # Read once per class: dataclasses.fields() walks the class on every call, and a claimed
    # run is built from a row between every two runs.
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass(frozen=True)
class ClaimedRun(FromRow):
    """A run as the claim returned it, with what executing it needs of its connection."""

    id: int
    connection_id: int | None
    workspace_id: int
    provider: str
    budget_key: str | None
    kind: str
    attempts: int
    max_attempts: int
    lease_owner: UUID
    lease_expires_at: datetime
    started_at: datetime | None
    waits: int
    results: dict[str, Any]
    processed_units: int
    connection_name: str | None
    connection_status: str | None
    config: dict[str, Any] | None
    credentials: bytes | None
    cursors: dict[str, Any] | None

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.lease_owner)


@dataclass(frozen=True)
class ClaimTerms:
    """What a claim asks for: the claiming worker, the lease it takes, and the providers whose
    syncs it can run (None: any). ``wakeable``: the worker listens on its own channel, so an
    empty claim marks it idle, to be woken alone by the next run it can take."""

    worker_id: str
    lease_seconds: float
    providers: list[str] | None
    wakeable: bool = False


@dataclass(frozen=True)
class RunControl:
    """The lease keeper's control read of a run it still holds."""

    cancel_requested: bool


@dataclass(frozen=True)
class Seal:
    """How a run ends: its terminal status, results (the run's totals, and this attempt's own
    counts), error, processed units (a purge's count; None keeps the run's) and whether its
    connection is disconnected (credentials refused for good)."""

    lease: Lease
    status: str
    results: dict[str, Any]
    attempt_results: dict[str, Any]
    error: dict[str, Any] | None
    processed_units: int | None = None
    disconnect: bool = False


@dataclass(frozen=True)
class BatchWritten:
    upserted: int
    unchanged: int
    seen: int


@dataclass(frozen=True)
class TombstoneStep(FromRow):
    last_key: str | None
    scanned: int
    tombstoned: dict[str, int]


@dataclass(frozen=True)
class TableEnd(FromRow):
    """The end of a table read completely (``TableWrites.end_table``): whether its seen keys
    were intact (nothing was written when not), the first tombstone step, and whether that
    step reached the end of the table's rows and the complete passes were stamped."""

    intact: bool
    last_key: str | None
    scanned: int
    tombstoned: dict[str, int]
    completed: bool

    @property
    def step(self) -> TombstoneStep:
        return TombstoneStep(self.last_key, self.scanned, self.tombstoned)


@dataclass(frozen=True)
class UnseenStep(FromRow):
    last_key: str | None
    scanned: int
    unseen: list[dict[str, Any]]


@dataclass(frozen=True)
class SliceRow(FromRow):
    """One slice's checkpoint row (``partition`` '' for a table read whole)."""

    table_name: str
    partition: str
    position: Any
    done: bool
    resync: bool
    pages: int
    records: int
    total: int | None
    total_estimated: bool
    seen: int


@dataclass(frozen=True)
class CompletePasses:
    """When a table was last read completely: every partition of it (``whole``), and each
    partition on its own."""

    whole: datetime | None
    partitions: Mapping[str, datetime]

    def last(self, partition: str) -> datetime | None:
        """The last complete pass of one slice ('' for a table read whole); a partition that
        has none of its own goes by the table's."""
        if not partition:
            return self.whole
        return self.partitions.get(partition, self.whole)


@dataclass(frozen=True)
class WorkerRow(FromRow):
    id: str
    hostname: str
    pid: int
    incarnation: UUID | None
    stopped_at: datetime | None
    since_heartbeat: Any  # a timedelta


@dataclass(frozen=True)
class LockedConnection(FromRow):
    """A connection as a repair reads it under its row lock (its credentials still encrypted)."""

    workspace_id: int
    provider: str
    config: dict[str, Any]
    credentials: bytes | None
    budget_key: str | None


@dataclass(frozen=True)
class ConnectionRepair:
    """What a repair writes over a locked connection: its whole config and budget key; a new
    name (None keeps it); new credentials when ``set_credentials`` (None clears them); a new
    schedule when ``set_schedule`` (None removes it)."""

    config: dict[str, Any]
    budget_key: str | None
    name: str | None = None
    set_credentials: bool = False
    credentials: bytes | None = None
    set_schedule: bool = False
    schedule_seconds: float | None = None


class UnservedProvider(NamedTuple):
    """Queued syncs of a provider that no live worker can take: how many, and the oldest."""

    provider: str
    runs: int
    oldest_run: int


@dataclass(frozen=True)
class FilesQueued:
    """What the end of a files table's sync did: ingestions queued (new or changed files),
    documents deleted (tombstoned files), running ingestions asked to stop. ``fenced`` False:
    the run's lease was lost and nothing was done."""

    fenced: bool
    queued: int = 0
    deleted: int = 0
    stopped: int = 0
