"""What every store over the pool shares: a statement, or a transaction of several, run on a
connection borrowed from the pool and repeated through the one
:class:`~sync.store.retry.RetryPolicy`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from psycopg import sql
from psycopg.rows import DictRow

from sync.store.db import Connection, Pool
from sync.store.retry import DEFAULT, RetryPolicy

T = TypeVar("T")


class PooledStore:
    """Statements on connections borrowed from ``pool``, repeated by ``retry``."""

    def __init__(self, pool: Pool, *, retry: RetryPolicy = DEFAULT) -> None:
        self.pool = pool
        self.retry_policy = retry

    def _on_pool(self, call: Callable[[Connection], T], *, idempotent: bool = False) -> T:
        """``call`` on a connection of the pool (a fresh one for each try). Repeated after a
        transient failure; after a lost connection only if ``idempotent``."""

        def attempt() -> T:
            with self.pool.connection() as conn:
                return call(conn)

        return self.retry_policy.run(attempt, idempotent=idempotent)

    def _in_transaction(self, call: Callable[[Connection], T]) -> T:
        """``call`` inside one transaction, repeated whole after a transient failure (which
        rolled all of it back): ``call`` must do nothing outside the database that a second
        try would do twice."""

        def attempt() -> T:
            with self.pool.connection() as conn, conn.transaction():
                return call(conn)

        return self.retry_policy.run(attempt)

    def _one(
        self, query: sql.SQL, params: dict[str, Any], *, idempotent: bool = False
    ) -> DictRow | None:
        """The first row of one statement, through :meth:`_on_pool`."""
        return self._on_pool(lambda c: c.execute(query, params).fetchone(), idempotent=idempotent)

    def _all(
        self, query: sql.SQL, params: dict[str, Any], *, idempotent: bool = False
    ) -> list[DictRow]:
        """Every row of one statement, through :meth:`_on_pool`."""
        return self._on_pool(lambda c: c.execute(query, params).fetchall(), idempotent=idempotent)
