"""The typed store of the engine's own statements (``sql/queries.sql``), each a typed method with
typed parameters and rows: every statement a run's life takes, from its claim to its end
(``RunStore``, and ``TableWrites`` for the record writer's fenced statements on the connection
it holds); workspaces, connections and their records (``TenantStore``); what operators look at
(``OverviewStore``). With them, the one way to repeat a statement that failed for a passing
reason (``RetryPolicy``) and the clock decisions are taken on. Only the stores import
``sync.store.queries`` (an import-linter contract in ``pyproject.toml``).

The statements themselves live in ``sql/queries.sql``, by name, each with the invariant it
protects; the fence they share is ``run_fence_v1`` (``sql/0001_baseline.sql``)."""

from sync.base.clock import Clock, ManualClock, SystemClock
from sync.store.fenced import SliceSave, TableWrites
from sync.store.overview import OverviewStore
from sync.store.retry import RetryPolicy, is_connection_lost, is_transient
from sync.store.rows import (
    BatchWritten,
    ClaimedRun,
    ClaimTerms,
    CompletePasses,
    ConnectionRepair,
    Lease,
    LockedConnection,
    RunControl,
    Seal,
    SliceRow,
    TableEnd,
    TombstoneStep,
    UnseenStep,
    UnservedProvider,
    WorkerRow,
)
from sync.store.runs import RunStore
from sync.store.tenants import TenantStore

__all__ = [
    "BatchWritten",
    "ClaimTerms",
    "ClaimedRun",
    "Clock",
    "CompletePasses",
    "ConnectionRepair",
    "Lease",
    "LockedConnection",
    "ManualClock",
    "OverviewStore",
    "RetryPolicy",
    "RunControl",
    "RunStore",
    "Seal",
    "SliceRow",
    "SliceSave",
    "SystemClock",
    "TableEnd",
    "TableWrites",
    "TenantStore",
    "TombstoneStep",
    "UnseenStep",
    "UnservedProvider",
    "WorkerRow",
    "is_connection_lost",
    "is_transient",
]
