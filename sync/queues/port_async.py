"""The async twin of the queues port, for asyncio applications (FastAPI and the like): send, read
and operate jobs without blocking the event loop. Declaring queues, registering handlers and
running jobs stay on the sync port, in the workers. Implementations:
:class:`sync.queues.postgres_async.AsyncPostgresQueues` on psycopg's ``AsyncConnectionPool``,
and :class:`sync.queues.memory_async.AsyncInMemoryQueues` for an application's unit tests; both
pass the contract suite the sync implementations pass."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Protocol

from sync.queues.declarations import QueueSpec
from sync.queues.models import Job, JobAttempt, JobStatus, QueueStats


class AsyncQueues(Protocol):
    async def send(
        self,
        queue: str,
        payload: Any,
        *,
        key: str | None = None,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> int:
        """As :meth:`sync.queues.port.JobSender.send`; ``conn`` is the caller's psycopg
        ``AsyncConnection`` (for the in-memory twin, one of its transactions)."""
        ...

    async def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]: ...

    async def get_queue(self, name: str) -> QueueSpec: ...

    async def list_queues(self) -> list[QueueSpec]: ...

    async def get_job(self, job_id: int) -> Job: ...

    async def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]: ...

    async def attempts(self, job_id: int) -> list[JobAttempt]: ...

    async def cancel_job(self, job_id: int) -> Job:
        """Cancel a queued, retrying or active job; a worker running it stops at its next
        control read."""
        ...

    async def retry_job(self, job_id: int) -> Job: ...

    async def queue_stats(self) -> list[QueueStats]: ...
