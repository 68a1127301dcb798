"""The four harnesses the queues' contract suite runs on: the in-memory and the Postgres
implementations, each through the sync port and through the async one. The async harnesses
send, read and operate jobs through the async API, on an event loop of their own in a thread
(the contract's threads call it as they call the sync port), and declare, register and run
jobs through the sync port, as an application's workers do."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg_pool import AsyncConnectionPool

from sync.queues import InMemoryQueues, ManualClock, Queues
from sync.queues.memory_async import AsyncInMemoryQueues
from sync.queues.port_async import AsyncQueues
from sync.queues.postgres import PostgresQueues
from sync.queues.postgres_async import AsyncPostgresQueues
from tests.conftest import DATABASE_URL
from tests.queues_contract import WAIT, Harness, Transaction
from tests.waiting import wait_until_blocked

T = TypeVar("T")
KINDS = ["sync", "async"]
# The async API's own routes: every other call of the port goes to the sync implementation.
ASYNC_CALLS = {
    "send", "send_many", "get_queue", "list_queues", "get_job", "list_jobs", "attempts",
    "cancel_job", "retry_job", "queue_stats",
}  # fmt: skip


class LoopThread:
    """An event loop running in a thread; :meth:`run` a coroutine on it from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(WAIT)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT)
        self.loop.close()


class ThroughAsync:
    """The sync port, with the calls the async API has made through it."""

    def __init__(self, sync: Queues, async_queues: AsyncQueues, loop: LoopThread) -> None:
        self._sync = sync
        self._async = async_queues
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        if name not in ASYNC_CALLS:
            return getattr(self._sync, name)
        call = getattr(self._async, name)

        def routed(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run(call(*args, **kwargs))

        return routed


def memory_harness(kind: str) -> Iterator[Harness]:
    clock = ManualClock()
    queues = InMemoryQueues(clock=clock)

    def begin() -> Transaction:
        tx = queues.transaction()
        return Transaction(tx, tx.commit, tx.rollback)

    def until_blocked() -> None:
        assert queues.sender_waits.wait_for(1, WAIT), "no send waited for another's key"

    if kind == "sync":
        yield Harness(queues, queues, clock, begin, until_blocked)
        return
    loop = LoopThread()
    try:
        through = cast(Queues, ThroughAsync(queues, AsyncInMemoryQueues(queues), loop))
        yield Harness(through, queues, clock, begin, until_blocked)
    finally:
        loop.close()


@contextmanager
def _connections() -> Iterator[list[Any]]:
    opened: list[Any] = []
    try:
        yield opened
    finally:
        for conn in opened:
            conn.close()


def postgres_harness(kind: str, pool: Any, schema: str) -> Iterator[Harness]:
    """``pool``: the engine's; the application's transactions are connections of their own,
    whose search_path knows nothing of ``schema``."""
    clock = ManualClock()
    queues = PostgresQueues(pool, clock=clock)
    until_blocked = functools.partial(wait_until_blocked, schema)
    with _connections() as opened:
        if kind == "sync":

            def begin() -> Transaction:
                conn = psycopg.connect(DATABASE_URL)
                opened.append(conn)
                return Transaction(conn, conn.commit, conn.rollback)

            yield Harness(queues, queues, clock, begin, until_blocked)
            return
        loop = LoopThread()
        async_pool = AsyncConnectionPool(
            DATABASE_URL,
            min_size=1,
            max_size=24,
            open=False,
            kwargs={"application_name": f"connector-sync/{schema}"},
        )
        loop.run(async_pool.open(wait=True))
        try:

            def begin_async() -> Transaction:
                conn = loop.run(psycopg.AsyncConnection.connect(DATABASE_URL))
                opened.append(_Closing(conn, loop))
                return Transaction(
                    conn, lambda: loop.run(conn.commit()), lambda: loop.run(conn.rollback())
                )

            async_queues = AsyncPostgresQueues(
                async_pool, schema=schema, clock=clock, workers=queues
            )
            through = cast(Queues, ThroughAsync(queues, async_queues, loop))
            yield Harness(through, queues, clock, begin_async, until_blocked)
        finally:
            for conn in opened:
                conn.close()
            opened.clear()
            loop.run(async_pool.close())
            loop.close()


class _Closing:
    def __init__(self, conn: psycopg.AsyncConnection[Any], loop: LoopThread) -> None:
        self._conn = conn
        self._loop = loop

    def close(self) -> None:
        self._loop.run(self._conn.close())
