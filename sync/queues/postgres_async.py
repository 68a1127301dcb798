"""The async API on Postgres: :class:`AsyncPostgresQueues` over the application's psycopg
``AsyncConnectionPool``::

    pool = AsyncConnectionPool(DATABASE_URL, open=False)
    queues = AsyncPostgresQueues(pool, schema="sync")

    async with pool.connection() as conn, conn.transaction():
        await conn.execute("INSERT INTO documents ...")
        await queues.send("docs.ingest", {"document": 7}, conn=conn)

It takes the same checks, statements and rows as :class:`sync.queues.postgres.PostgresQueues`
and gives the same answers and errors; ``clock`` as there (tests pass a ManualClock)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from sync.base.clock import Clock
from sync.queues.caller import send_on_async
from sync.queues.declarations import QueueSpec
from sync.queues.models import Job, JobAttempt, JobStatus, QueueStats
from sync.queues.port_async import AsyncQueues
from sync.queues.postgres import PostgresQueues
from sync.queues.refusals import (
    cannot_cancel,
    cannot_retry,
    check_list_limit,
    no_job,
    no_such_queue,
    queue_gone,
    slot_taken,
)
from sync.queues.sending import Outgoing, no_queue, not_a_connection, outgoing, sent_ids
from sync.queues.store_async import AsyncJobStore


class AsyncPostgresQueues(AsyncQueues):
    """``pool``: any psycopg ``AsyncConnectionPool`` on the engine's database (its connections
    need no search_path); ``schema``: the engine's schema (``sync`` by default). ``workers``:
    the sync queues of this process, when it also runs jobs: a cancel stops an attempt running
    here at once (attempts elsewhere learn it from their lease keeper's next control read)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        schema: str,
        clock: Clock | None = None,
        workers: PostgresQueues | None = None,
    ) -> None:
        self.store = AsyncJobStore(pool, schema)
        self.schema = schema
        self._clock = clock
        self._workers = workers

    def _now(self) -> datetime | None:
        return None if self._clock is None else self._clock.now()

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
        now = self._now()
        sent = outgoing(
            queue, [payload], key=key, start_after=start_after, priority=priority, now=now
        )
        return (await self._send(sent, now, conn))[0]

    async def send_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        start_after: datetime | timedelta | None = None,
        priority: int | None = None,
        conn: object | None = None,
    ) -> list[int]:
        now = self._now()
        sent = outgoing(
            queue, payloads, key=None, start_after=start_after, priority=priority, now=now
        )
        return await self._send(sent, now, conn)

    async def _send(self, sent: Outgoing, now: datetime | None, conn: object | None) -> list[int]:
        if conn is not None and not isinstance(conn, psycopg.AsyncConnection):
            raise not_a_connection(conn, "a psycopg AsyncConnection")
        try:
            if conn is None:
                results = await self.store.send(sent, now)
            else:
                results = await send_on_async(conn, self.schema, sent, now)
        except psycopg.errors.ForeignKeyViolation:  # the queue was deleted meanwhile
            raise no_queue(sent.queue) from None
        return sent_ids(sent.queue, results)

    async def get_queue(self, name: str) -> QueueSpec:
        spec = await self.store.get_queue(name)
        if spec is None:
            raise no_such_queue(name)
        return spec

    async def list_queues(self) -> list[QueueSpec]:
        return await self.store.list_queues()

    async def get_job(self, job_id: int) -> Job:
        job = await self.store.get_job(job_id)
        if job is None:
            raise no_job(job_id)
        return job

    async def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        check_list_limit(limit)
        return await self.store.list_jobs(queue, status, limit)

    async def attempts(self, job_id: int) -> list[JobAttempt]:
        found = await self.store.attempts(job_id)
        if not found:
            await self.get_job(job_id)
        return found

    async def cancel_job(self, job_id: int) -> Job:
        cancelled = await self.store.cancel(job_id, self._now())
        if cancelled.previous is None:
            raise no_job(job_id)
        if cancelled.job is None:
            raise cannot_cancel(job_id, cancelled.previous)
        if cancelled.lease_owner is not None and self._workers is not None:
            self._workers.cancelled_here(job_id, cancelled.lease_owner)
        return cancelled.job

    async def retry_job(self, job_id: int) -> Job:
        job = await self.get_job(job_id)
        now = self._now()
        if job.status is JobStatus.RETRYING:
            due = await self.store.make_retrying_due(job_id, now)
            if due is not None:
                return due
            job = await self.get_job(job_id)  # it was claimed meanwhile
        if job.status not in (JobStatus.DEAD, JobStatus.CANCELLED):
            raise cannot_retry(job_id, job.status)
        try:
            requeued = await self.store.requeue(job.id, now)
        except psycopg.errors.UniqueViolation:
            holder = await self.store.slot_holder(job.origin_queue, job.key)
            raise slot_taken(job, holder) from None
        if requeued is not None:
            return requeued
        if await self.store.get_queue(job.origin_queue) is None:
            raise queue_gone(job)
        raise cannot_retry(job.id, (await self.get_job(job.id)).status)

    async def queue_stats(self) -> list[QueueStats]:
        return await self.store.queue_stats(self._now())
