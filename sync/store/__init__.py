"""The typed store of the runs path: every statement a run's life takes, from its claim to its
end, as a typed method with typed parameters and rows (``RunStore``, and ``TableWrites`` for
the record writer's fenced statements on the connection it holds); the one way to repeat a
statement that failed for a passing reason (``RetryPolicy``); the clock decisions are taken on.

The statements themselves live in ``sql/queries.sql``, by name, each with the invariant it
protects; the fence they share is ``run_fence_v1`` (``sql/0012_fence_and_versions.sql``)."""

from sync.queues.clock import Clock, ManualClock, SystemClock
from sync.store.fenced import SliceSave, TableWrites
from sync.store.retry import RetryPolicy, is_connection_lost, is_transient
from sync.store.rows import (
    BatchWritten,
    ClaimedRun,
    ClaimTerms,
    CompletePasses,
    Lease,
    RunControl,
    Seal,
    SliceRow,
    TombstoneStep,
    UnseenStep,
    WorkerRow,
)
from sync.store.runs import RunStore

__all__ = [
    "BatchWritten",
    "ClaimTerms",
    "ClaimedRun",
    "Clock",
    "CompletePasses",
    "Lease",
    "ManualClock",
    "RetryPolicy",
    "RunControl",
    "RunStore",
    "Seal",
    "SliceRow",
    "SliceSave",
    "SystemClock",
    "TableWrites",
    "TombstoneStep",
    "UnseenStep",
    "WorkerRow",
    "is_connection_lost",
    "is_transient",
]
