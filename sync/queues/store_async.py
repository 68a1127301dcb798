"""The statements of the async API (:class:`sync.queues.postgres_async.AsyncPostgresQueues`), on
connections of the application's psycopg ``AsyncConnectionPool``: the same named statements
of ``sql/queues.sql`` and the same typed rows as :class:`sync.queues.store.JobStore`. Each call
is one transaction that first puts the queues' schema on its search_path (``use_schema``), so
the pool needs no configuration of its own and may stand behind a transaction pooler."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from sync.queues.declarations import QueueSpec
from sync.queues.models import Job, JobAttempt, JobStatus, QueueStats
from sync.queues.sending import Outgoing, SendResult, send_params
from sync.queues.store import (
    QUEUE_QUERIES,
    Cancelled,
    attempt_from_row,
    cancelled_from_row,
    job_from_row,
    spec_from_row,
    stats_from_row,
)

Row = dict[str, Any]


class AsyncJobStore:
    def __init__(self, pool: AsyncConnectionPool[Any], schema: str) -> None:
        self.pool = pool
        self.schema = schema

    @asynccontextmanager
    async def _cursor(self) -> AsyncIterator[psycopg.AsyncCursor[DictRow]]:
        async with (
            self.pool.connection() as conn,
            conn.transaction(),
            conn.cursor(row_factory=dict_row) as cur,
        ):
            await cur.execute(QUEUE_QUERIES.use_schema, {"schema": self.schema}, prepare=False)
            yield cur

    async def _one(self, query: sql.SQL, params: dict[str, Any]) -> Row | None:
        async with self._cursor() as cur:
            await cur.execute(query, params, prepare=False)
            return await cur.fetchone()

    async def _all(self, query: sql.SQL, params: dict[str, Any]) -> list[Row]:
        async with self._cursor() as cur:
            await cur.execute(query, params, prepare=False)
            return await cur.fetchall()

    async def send(self, outgoing: Outgoing, now: datetime | None) -> list[SendResult]:
        rows = await self._all(QUEUE_QUERIES.send_jobs, send_params(outgoing, now))
        return [SendResult(r["job_id"], r["outcome"]) for r in rows]

    async def get_queue(self, name: str) -> QueueSpec | None:
        row = await self._one(QUEUE_QUERIES.get_queue, {"name": name})
        return None if row is None else spec_from_row(row)

    async def list_queues(self) -> list[QueueSpec]:
        return [spec_from_row(r) for r in await self._all(QUEUE_QUERIES.list_queues, {})]

    async def get_job(self, job_id: int) -> Job | None:
        row = await self._one(QUEUE_QUERIES.get_job, {"job_id": job_id})
        return None if row is None else job_from_row(row)

    async def list_jobs(self, queue: str | None, status: JobStatus | None, limit: int) -> list[Job]:
        params = {"queue": queue, "status": status.value if status else None, "limit": limit}
        return [job_from_row(r) for r in await self._all(QUEUE_QUERIES.list_jobs, params)]

    async def attempts(self, job_id: int) -> list[JobAttempt]:
        rows = await self._all(QUEUE_QUERIES.job_attempts, {"job_id": job_id})
        return [attempt_from_row(r) for r in rows]

    async def cancel(self, job_id: int, now: datetime | None) -> Cancelled:
        row = await self._one(QUEUE_QUERIES.cancel_job, {"job_id": job_id, "now": now})
        return cancelled_from_row(row)

    async def make_retrying_due(self, job_id: int, now: datetime | None) -> Job | None:
        row = await self._one(QUEUE_QUERIES.make_retrying_due, {"job_id": job_id, "now": now})
        return None if row is None else job_from_row(row)

    async def requeue(self, job_id: int, now: datetime | None) -> Job | None:
        """Raises psycopg's UniqueViolation when another pending job holds the slot."""
        row = await self._one(QUEUE_QUERIES.requeue_job, {"job_id": job_id, "now": now})
        return None if row is None else job_from_row(row)

    async def slot_holder(self, queue: str, key: str | None) -> int | None:
        row = await self._one(QUEUE_QUERIES.slot_holder, {"queue": queue, "key": key})
        return None if row is None else int(row["id"])

    async def queue_stats(self, now: datetime | None) -> list[QueueStats]:
        rows = await self._all(QUEUE_QUERIES.queue_stats, {"now": now})
        return [stats_from_row(r) for r in rows]
