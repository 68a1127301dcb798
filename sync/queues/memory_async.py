"""The async twin of :class:`sync.queues.memory.InMemoryQueues`, for the unit tests of an asyncio
application: the same jobs (it wraps an ``InMemoryQueues``, which declares the queues, registers
the handlers and runs them with ``run_due()``), reached with ``await``. Each call runs in a
thread of its own, so a send that waits for another transaction's key never blocks the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sync.queues.declarations import QueueSpec
from sync.queues.memory import InMemoryQueues
from sync.queues.models import Job, JobAttempt, JobStatus, QueueStats
from sync.queues.port_async import AsyncQueues


class AsyncInMemoryQueues(AsyncQueues):
    def __init__(self, queues: InMemoryQueues) -> None:
        self.queues = queues

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
        return await asyncio.to_thread(
            self.queues.send,
            queue,
            payload,
            key=key,
            start_after=start_after,
            priority=priority,
            conn=conn,
        )

    async def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]:
        return await asyncio.to_thread(
            self.queues.send_many,
            queue,
            list(payloads),
            start_after=start_after,
            priority=priority,
            conn=conn,
        )

    async def get_queue(self, name: str) -> QueueSpec:
        return await asyncio.to_thread(self.queues.get_queue, name)

    async def list_queues(self) -> list[QueueSpec]:
        return await asyncio.to_thread(self.queues.list_queues)

    async def get_job(self, job_id: int) -> Job:
        return await asyncio.to_thread(self.queues.get_job, job_id)

    async def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        return await asyncio.to_thread(
            self.queues.list_jobs, queue=queue, status=status, limit=limit
        )

    async def attempts(self, job_id: int) -> list[JobAttempt]:
        return await asyncio.to_thread(self.queues.attempts, job_id)

    async def cancel_job(self, job_id: int) -> Job:
        return await asyncio.to_thread(self.queues.cancel_job, job_id)

    async def retry_job(self, job_id: int) -> Job:
        return await asyncio.to_thread(self.queues.retry_job, job_id)

    async def queue_stats(self) -> list[QueueStats]:
        return await asyncio.to_thread(self.queues.queue_stats)
