"""The statements of what the engine syncs for whom, as typed methods: workspaces, connections
(created, repaired under their row lock, paused and resumed), the re-encryption of their
credentials, and the records they synced. Each method is one named statement of
``sql/queries.sql``, or one transaction of several; none takes or returns a dict row.

Each is repeated after a transient failure (a deadlock, a lock timeout: nothing was written),
a transaction as a whole, through the one :class:`~sync.store.retry.RetryPolicy`; none after a
lost connection (as the API's run statements in :class:`~sync.store.runs.RunStore`: the
caller sees the failure at once). Any other error reaches the caller: a name already taken is
``psycopg.errors.UniqueViolation``, which the API turns into a conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from sync.models import Connection, Record, Run, Workspace
from sync.store.db import Connection as Conn
from sync.store.pooled import PooledStore
from sync.store.queries import QUERIES
from sync.store.rows import ConnectionRepair, LockedConnection
from sync.vocabulary import ConnectionStatus


class TenantStore(PooledStore):
    """Workspaces, connections and their records over a pool. ``workspace_id`` None in a
    method's parameters: any workspace (an engine not scoped to one)."""

    # -- workspaces ------------------------------------------------------------------------

    def create_workspace(self, name: str) -> Workspace:
        """A new workspace (``UniqueViolation``: the name is taken)."""
        created = self._workspace(QUERIES.create_workspace, {"name": name})
        assert created is not None  # an INSERT ... RETURNING that did not raise
        return created

    def workspaces(self) -> list[Workspace]:
        """The workspaces, and deleted ones whose connections are still being purged."""
        return self._on_pool(
            lambda c: [Workspace.from_row(r) for r in c.execute(QUERIES.list_workspaces).fetchall()]
        )

    def workspace_by_id(self, workspace_id: int) -> Workspace | None:
        """A workspace by id, deleted or not."""
        return self._workspace(QUERIES.get_workspace_by_id, {"workspace_id": workspace_id})

    def workspace_by_name(self, name: str) -> Workspace | None:
        """The workspace that is not deleted by that name."""
        return self._workspace(QUERIES.get_workspace_by_name, {"name": name})

    def rename_workspace(self, workspace_id: int, name: str) -> Workspace | None:
        """None: the workspace is deleted (``UniqueViolation``: the name is taken)."""
        params = {"workspace_id": workspace_id, "name": name}
        return self._workspace(QUERIES.rename_workspace, params)

    def delete_workspace(self, workspace_id: int, max_attempts: int) -> list[Run]:
        """Mark a workspace deleted and delete each of its connections (each marked deleting,
        its purge queued), in one transaction; the purges (those still pending, called
        again)."""

        def call(conn: Conn) -> list[Run]:
            conn.execute(QUERIES.mark_workspace_deleted, {"workspace_id": workspace_id})
            ids = conn.execute(
                QUERIES.connections_of_workspace, {"workspace_id": workspace_id}
            ).fetchall()
            purges = []
            for row in ids:
                purge = conn.execute(
                    QUERIES.delete_connection,
                    {
                        "connection_id": row["id"],
                        "workspace_id": workspace_id,
                        "max_attempts": max_attempts,
                    },
                ).fetchone()
                if purge is not None:
                    purges.append(Run.from_row(purge))
            return purges

        return self._in_transaction(call)

    def _workspace(self, query: Any, params: dict[str, Any]) -> Workspace | None:
        row = self._on_pool(lambda c: c.execute(query, params).fetchone())
        return None if row is None else Workspace.from_row(row)

    # -- connections -----------------------------------------------------------------------

    def create_connection(
        self,
        *,
        workspace_id: int,
        name: str,
        provider: str,
        config: dict[str, Any],
        credentials: bytes | None,
        budget_key: str | None,
        schedule_seconds: float | None,
        declared: bool = False,
        reader_schema: str | None = None,
    ) -> Connection | None:
        """A new connection (``credentials`` encrypted); None: no such workspace, or it is
        deleted, or (``declared``: the provider is a declared one) the provider was removed
        (``UniqueViolation``: the workspace has a connection by that name)."""
        params = {
            "workspace_id": workspace_id,
            "name": name,
            "provider": provider,
            "config": Jsonb(config),
            "credentials": credentials,
            "budget_key": budget_key,
            "schedule_seconds": schedule_seconds,
            "declared": declared,
            "reader_schema": reader_schema,
        }
        return self._connection(QUERIES.create_connection, params)

    def connections(self, workspace_id: int | None) -> list[Connection]:
        params = {"workspace_id": workspace_id}
        return self._on_pool(
            lambda c: [
                Connection.from_row(r)
                for r in c.execute(QUERIES.list_connections, params).fetchall()
            ]
        )

    def connection(self, connection_id: int, workspace_id: int | None) -> Connection | None:
        params = {"connection_id": connection_id, "workspace_id": workspace_id}
        return self._connection(QUERIES.get_connection, params)

    def set_connection_status(
        self,
        connection_id: int,
        workspace_id: int | None,
        status: ConnectionStatus,
        allowed: Sequence[ConnectionStatus],
    ) -> Connection | None:
        """Pause or resume a connection that is in one of the ``allowed`` statuses; None: it
        is not (or there is no such connection)."""
        params = {
            "connection_id": connection_id,
            "workspace_id": workspace_id,
            "status": status,
            "from_statuses": list(allowed),
        }
        return self._connection(QUERIES.set_connection_status, params)

    def repair_connection(
        self,
        connection_id: int,
        workspace_id: int | None,
        repair: Callable[[LockedConnection], ConnectionRepair],
    ) -> Connection | None:
        """Lock a connection's row (the lock a run's token refresh takes, so the two never
        interleave), let ``repair`` say what to write given what is stored, and write it, in
        one transaction; None: no such connection, or it is being deleted. An error ``repair``
        raises rolls it back and reaches the caller. ``repair`` may be called again if the
        transaction is repeated."""

        def call(conn: Conn) -> Connection | None:
            row = conn.execute(
                QUERIES.lock_connection_credentials,
                {"connection_id": connection_id, "workspace_id": workspace_id},
            ).fetchone()
            if row is None:
                return None
            change = repair(LockedConnection.from_row(row))
            saved = conn.execute(
                QUERIES.update_connection,
                {
                    "connection_id": connection_id,
                    "name": change.name,
                    "config": Jsonb(change.config),
                    "set_credentials": change.set_credentials,
                    "credentials": change.credentials,
                    "budget_key": change.budget_key,
                    "set_schedule": change.set_schedule,
                    "schedule_seconds": change.schedule_seconds,
                },
            ).fetchone()
            assert saved is not None  # the row is locked: it is still there
            return Connection.from_row(saved)

        return self._in_transaction(call)

    def rotate_credentials(self, reencrypt: Callable[[bytes], bytes], *, batch: int) -> int:
        """Re-encrypt every connection's stored credentials with ``reencrypt``, ``batch``
        connections per transaction (each batch locked while it is rewritten); how many."""
        done, after = 0, 0

        def one_batch(conn: Conn) -> list[int]:
            rows = conn.execute(
                QUERIES.credentials_to_rotate, {"after_id": after, "limit": batch}
            ).fetchall()
            for row in rows:
                conn.execute(
                    QUERIES.store_rotated_credentials,
                    {"connection_id": row["id"], "credentials": reencrypt(row["credentials"])},
                )
            return [row["id"] for row in rows]

        while ids := self._in_transaction(one_batch):
            done += len(ids)
            after = ids[-1]
        return done

    def _connection(self, query: Any, params: dict[str, Any]) -> Connection | None:
        row = self._on_pool(lambda c: c.execute(query, params).fetchone())
        return None if row is None else Connection.from_row(row)

    # -- records ---------------------------------------------------------------------------

    def records(
        self,
        connection_id: int,
        workspace_id: int | None,
        *,
        table: str | None,
        include_deleted: bool,
        limit: int,
    ) -> list[Record]:
        """A connection's synced records (of one table, when named), by table and id."""
        params = {
            "connection_id": connection_id,
            "workspace_id": workspace_id,
            "table_name": table,
            "include_deleted": include_deleted,
            "limit": limit,
        }
        return self._on_pool(
            lambda c: [
                Record.from_row(r) for r in c.execute(QUERIES.list_records, params).fetchall()
            ]
        )
