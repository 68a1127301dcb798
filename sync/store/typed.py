"""The statements of typed tables for readers (``sql/typed_tables.sql``), as typed methods: a
table's stored typed schema, a sample of its rows, the fenced build of its views, the purge of
a connection's schema, and what readers are shown and granted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from sync.store.pooled import PooledStore
from sync.store.queries import NamedQueries
from sync.store.rows import Lease
from sync.typed.evolve import Change, Column

QUERIES = NamedQueries("typed_tables.sql")


@dataclass(frozen=True)
class StoredTable:
    """A table's typed schema as its views show it."""

    table_name: str
    view_name: str
    columns: tuple[Column, ...]
    version: int
    updated_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any], table_name: str | None = None) -> StoredTable:
        return cls(
            table_name=row.get("table_name") or table_name or "",
            view_name=row["view_name"],
            columns=tuple(Column.from_json(c) for c in row["columns"]),
            version=row["version"],
            updated_at=row.get("updated_at"),
        )


@dataclass(frozen=True)
class SchemaChange:
    """One version of a table's typed schema: what changed, by which run, when."""

    table_name: str
    version: int
    run_id: int | None
    changes: tuple[Change, ...]
    changed_at: datetime


@dataclass(frozen=True)
class Build:
    """What a build of a table's views asks for: the schema's names, the view's, the columns,
    what changed, and whether the views are dropped first (a type changed)."""

    default_schema: str
    fallback_schema: str
    view_name: str
    columns: Sequence[Column]
    changes: Sequence[Change]
    recreate: bool


@dataclass(frozen=True)
class Published:
    schema_name: str
    version: int


class TypedStore(PooledStore):
    """Typed tables over a pool."""

    def table(self, connection_id: int, table_name: str) -> StoredTable | None:
        params = {"connection_id": connection_id, "table_name": table_name}
        row = self._one(QUERIES.typed_table, params, idempotent=True)
        return StoredTable.from_row(dict(row), table_name) if row else None

    def other_view_names(self, connection_id: int, table_name: str) -> set[str]:
        params = {"connection_id": connection_id, "table_name": table_name}
        return {r["name"] for r in self._all(QUERIES.typed_view_names, params, idempotent=True)}

    def sample(self, connection_id: int, table_name: str, limit: int) -> list[Any]:
        params = {"connection_id": connection_id, "table_name": table_name, "limit": limit}
        return [r["data"] for r in self._all(QUERIES.sample_records, params, idempotent=True)]

    def misfits(
        self, connection_id: int, table_name: str, columns: Sequence[Column]
    ) -> dict[int, bool]:
        """Which of ``columns`` (by index) some stored row of the table does not fit, and
        whether one holds an object or a list there."""
        params = {
            "connection_id": connection_id,
            "table_name": table_name,
            "columns": Jsonb([c.to_json() for c in columns]),
        }
        rows = self._all(QUERIES.stored_misfits, params, idempotent=True)
        return {r["ord"] - 1: bool(r["nested"]) for r in rows}

    def connection_names(self, connection_id: int) -> tuple[str, str] | None:
        row = self._one(QUERIES.connection_names, {"connection_id": connection_id})
        return (row["workspace"], row["connection"]) if row else None

    def publish(
        self, lease: Lease, connection_id: int, table_name: str, build: Build
    ) -> Published | None:
        """Build the table's views as ``build`` says; None when the run's lease was lost (and
        nothing changed)."""
        params = {
            "run_id": lease.id,
            "lease_owner": lease.owner,
            "connection_id": connection_id,
            "table_name": table_name,
            "default_schema": build.default_schema,
            "fallback_schema": build.fallback_schema,
            "view_name": build.view_name,
            "columns": Jsonb([c.to_json() for c in build.columns]),
            "recreate": build.recreate,
            "changes": Jsonb([c.to_json() for c in build.changes]),
        }
        row = self._in_transaction(
            lambda c: c.execute(QUERIES.publish_typed_table, params).fetchone()
        )
        if row is None or not row["fenced"]:
            return None
        return Published(row["schema_name"], row["version"])

    def drop_schema(self, lease: Lease, connection_id: int) -> bool:
        """Drop a purged connection's schema and its views; False when the lease was lost."""
        params = {"run_id": lease.id, "lease_owner": lease.owner, "connection_id": connection_id}
        row = self._one(QUERIES.drop_reader_schema, params, idempotent=True)
        return bool(row and row["fenced"])

    def schema_of(self, connection_id: int) -> str | None:
        row = self._one(QUERIES.reader_schema_of, {"connection_id": connection_id})
        return row["name"] if row else None

    def tables(self, connection_id: int, table_name: str | None = None) -> list[StoredTable]:
        params = {"connection_id": connection_id, "table_name": table_name}
        return [StoredTable.from_row(dict(r)) for r in self._all(QUERIES.typed_tables_of, params)]

    def history(self, connection_id: int, table_name: str | None = None) -> list[SchemaChange]:
        params = {"connection_id": connection_id, "table_name": table_name}
        return [
            SchemaChange(
                r["table_name"],
                r["version"],
                r["run_id"],
                tuple(Change.from_json(c) for c in r["changes"]),
                r["changed_at"],
            )
            for r in self._all(QUERIES.typed_table_history, params)
        ]

    def grant_reader(self, workspace_id: int, role: str) -> int:
        """Let ``role`` read the workspace's typed views; how many schemas it reads now."""
        params = {"workspace_id": workspace_id, "role": role}
        row = self._one(QUERIES.grant_reader, params)
        return int(row["schemas"]) if row else 0

    def set_reader_schema(self, connection_id: int, name: str) -> bool:
        """Choose the schema of a connection's views; False once they are built (or no such
        connection). ``UniqueViolation``: another connection chose it."""
        params = {"connection_id": connection_id, "reader_schema": name}
        return self._one(QUERIES.set_reader_schema, params) is not None
