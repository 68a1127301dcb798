"""connector-sync: keeps third-party SaaS data synced into your own Postgres, with Postgres as
the queue. The public face is small: open an :class:`Engine`, create workspaces and
connections, queue syncs, and run :class:`Worker` processes."""

from sync.api import Engine
from sync.base.settings import Settings
from sync.errors import (
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    MigrationError,
    NotFound,
    SchemaBehind,
    SyncError,
)
from sync.models import Attempt, Connection, Record, Run, WorkerInfo, Workspace
from sync.worker import Worker

__all__ = [
    "Attempt",
    "Conflict",
    "Connection",
    "DatabaseUnavailable",
    "Engine",
    "InvalidInput",
    "MigrationError",
    "NotFound",
    "Record",
    "Run",
    "SchemaBehind",
    "Settings",
    "SyncError",
    "Worker",
    "WorkerInfo",
    "Workspace",
]
