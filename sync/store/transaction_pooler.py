"""Connections that keep no session state, for a database reached through a transaction pooler
(PgBouncer in ``pool_mode = transaction``; ``CONNECTOR_SYNC_POOLER=transaction``).

Behind such a pooler each transaction may run on another server connection, so a setting made
for the session (the ``options`` startup parameter, a plain ``SET``) is lost or, worse, left
for the next client of that server connection. These connections send the engine's settings
(``search_path`` and the timeouts) at the start of every transaction instead, as ``SET LOCAL``:

- ``conn.transaction()`` sends them right after its ``BEGIN``;
- a statement run outside a transaction (the pool's connections are autocommit) is wrapped in
  one, so it too runs with them, and so are the statements of a pipeline opened outside one
  (they would share an implicit transaction).

The cost is one round trip per transaction, and three for a statement alone (``BEGIN``, the
settings, ``COMMIT``); docs/operations.md measures it. Statements that cannot run inside a
transaction block (``VACUUM``, ``CREATE INDEX CONCURRENTLY``) are not sent by the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import Copy, Pipeline, Transaction
from psycopg.abc import Params, Query
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import DictRow

from sync.store.queries import NamedQueries

_POOLER = NamedQueries("pooler.sql")


class PoolerCursor(psycopg.Cursor[DictRow]):
    """Runs a statement sent outside a transaction inside one, so that
    :class:`PoolerConnection` gives it the engine's settings."""

    connection: PoolerConnection

    def _alone(self) -> bool:
        return self.connection.info.transaction_status == TransactionStatus.IDLE

    def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> PoolerCursor:
        run = super().execute
        statement: Any = query  # psycopg's overloads set templates apart; both go through
        # An empty query is the pool's liveness check: no statement, nothing to bind.
        if not self._alone() or query == "":
            run(statement, params, prepare=prepare, binary=binary)
            return self
        with self.connection.transaction():
            run(statement, params, prepare=prepare, binary=binary)
        return self

    def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        if not self._alone():
            return super().executemany(query, params_seq, returning=returning)
        with self.connection.transaction():
            return super().executemany(query, params_seq, returning=returning)

    @contextmanager
    def copy(
        self,
        statement: Query,
        params: Params | None = None,
        *,
        writer: Any = None,
    ) -> Iterator[Copy]:
        if not self._alone():
            with super().copy(statement, params, writer=writer) as copy:
                yield copy
            return
        with self.connection.transaction(), super().copy(statement, params, writer=writer) as copy:
            yield copy

    def stream(
        self,
        query: Query,
        params: Params | None = None,
        *,
        binary: bool | None = None,
        size: int = 1,
    ) -> Iterator[DictRow]:
        if not self._alone():
            yield from super().stream(query, params, binary=binary, size=size)
            return
        with self.connection.transaction():
            yield from super().stream(query, params, binary=binary, size=size)


class PoolerConnection(psycopg.Connection[DictRow]):
    """An autocommit connection that sends ``transaction_settings`` (set it after connecting,
    see :func:`bind`) at the start of every transaction, and whose cursors put a statement sent
    alone into a transaction of its own."""

    transaction_settings: Mapping[str, str] = {}

    @contextmanager
    def transaction(
        self, savepoint_name: str | None = None, force_rollback: bool = False
    ) -> Iterator[Transaction]:
        outer = self.info.transaction_status == TransactionStatus.IDLE
        with super().transaction(savepoint_name, force_rollback) as tx:
            if outer:
                # A plain cursor: inside the transaction now, nothing to wrap.
                psycopg.Cursor(self).execute(
                    _POOLER.bind_transaction_settings, self.transaction_settings
                )
            yield tx

    @contextmanager
    def pipeline(self) -> Iterator[Pipeline]:
        # Statements pipelined in autocommit share one implicit transaction, which ends at the
        # pipeline's sync: here they share an explicit one, which carries the settings.
        if self.info.pipeline_status != PipelineStatus.OFF or not self._idle():
            with super().pipeline() as pipeline:
                yield pipeline
            return
        with super().pipeline() as pipeline, self.transaction():
            yield pipeline

    def _idle(self) -> bool:
        return self.info.transaction_status == TransactionStatus.IDLE


def bind(conn: psycopg.Connection[Any], settings: Mapping[str, str]) -> None:
    """Give a :class:`PoolerConnection` the settings it sends in every transaction."""
    if isinstance(conn, PoolerConnection):
        conn.transaction_settings = dict(settings)
