"""Application queues on the engine's workers: the port application modules depend on, queue
declarations, the pure decisions (retry delays, a job's fate, cron ticks, lanes), and an
in-memory implementation for unit tests. See docs/queues.md."""

from sync.base.clock import Clock, ManualClock, SystemClock
from sync.queues.declarations import QueueSpec, queue_spec, read_queue_file
from sync.queues.lanes import parse_lanes
from sync.queues.memory import InMemoryQueues, InMemoryTransaction
from sync.queues.memory_async import AsyncInMemoryQueues
from sync.queues.models import (
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    QueuePolicy,
    QueueStats,
    Redrive,
    Schedule,
)
from sync.queues.port import (
    MAX_BATCH,
    Abort,
    BatchHandler,
    DeadHook,
    Handler,
    JobRunner,
    JobSender,
    Queues,
)
from sync.queues.port_async import AsyncQueues

__all__ = [
    "MAX_BATCH",
    "Abort",
    "AsyncInMemoryQueues",
    "AsyncQueues",
    "AttemptOutcome",
    "BatchHandler",
    "Clock",
    "DeadHook",
    "Handler",
    "InMemoryQueues",
    "InMemoryTransaction",
    "Job",
    "JobAttempt",
    "JobRunner",
    "JobSender",
    "JobStatus",
    "ManualClock",
    "QueuePolicy",
    "QueueSpec",
    "QueueStats",
    "Queues",
    "Redrive",
    "Schedule",
    "SystemClock",
    "parse_lanes",
    "queue_spec",
    "read_queue_file",
]
