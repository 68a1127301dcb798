"""Typed tables through the Python API (a part of :class:`sync.api.Engine`): the typed schema
of a connection's tables as readers see it, with its history, and the read-only grant of a
workspace's typed views to a database role (see docs/querying.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psycopg

from sync.base.settings import Settings
from sync.errors import Conflict, InvalidInput, NotFound
from sync.models import Connection, Workspace
from sync.store.db import Pool
from sync.store.typed import SchemaChange, StoredTable, TypedStore
from sync.typed.naming import ALL_SUFFIX, check_schema_name


@dataclass(frozen=True)
class TypedColumn:
    name: str
    type: str
    field: str  # the record's field, a flattened one as parent.child
    origin: str  # "model" (declared by the connector) or "data" (inferred)


@dataclass(frozen=True)
class SchemaVersion:
    version: int
    run_id: int | None
    changed_at: str
    changes: list[str]


@dataclass(frozen=True)
class TypedTable:
    """One table as readers see it: its view (live rows), its companion with the tombstones,
    its columns after ``_key``, ``_synced_at`` and ``_first_seen_at``, and its history."""

    table: str
    view: str
    all_view: str
    version: int
    columns: list[TypedColumn]
    history: list[SchemaVersion] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "view": self.view,
            "all_view": self.all_view,
            "version": self.version,
            "columns": [c.__dict__ for c in self.columns],
            "history": [h.__dict__ for h in self.history],
        }


@dataclass(frozen=True)
class ReaderSchema:
    """A connection's schema of typed views (None before its first sync) and its tables."""

    connection_id: int
    schema: str | None
    tables: list[TypedTable]

    def to_json(self) -> dict[str, Any]:
        return {
            "connection_id": self.connection_id,
            "schema": self.schema,
            "tables": [t.to_json() for t in self.tables],
        }


def _typed_table(stored: StoredTable, history: list[SchemaChange]) -> TypedTable:
    return TypedTable(
        table=stored.table_name,
        view=stored.view_name,
        all_view=stored.view_name + ALL_SUFFIX,
        version=stored.version,
        columns=[
            TypedColumn(c.column, c.type.value, ".".join(c.path), c.origin.value)
            for c in stored.columns
        ],
        history=[
            SchemaVersion(
                h.version, h.run_id, h.changed_at.isoformat(), [c.describe() for c in h.changes]
            )
            for h in history
            if h.table_name == stored.table_name
        ],
    )


class ReadersApi:
    """The readers' part of the API; ``pool`` is the engine's."""

    pool: Pool
    settings: Settings

    def connection(self, connection_id: int) -> Connection:  # pragma: no cover - Engine's
        raise NotImplementedError

    def workspace(self, ref: int | str) -> Workspace:  # pragma: no cover - Engine's
        raise NotImplementedError

    @property
    def _typed(self) -> TypedStore:
        store: TypedStore | None = getattr(self, "_typed_store", None)
        if store is None:
            store = self._typed_store = TypedStore(self.pool)
        return store

    def reader_schema(self, connection_id: int, table: str | None = None) -> ReaderSchema:
        """The typed schema of a connection (one table's, if named), with its history."""
        self.connection(connection_id)  # NotFound, also outside a scoped engine's workspace
        stored = self._typed.tables(connection_id, table)
        if table is not None and not stored:
            raise NotFound(
                f"connection {connection_id} has no typed table {table!r} (yet: its views are "
                "built by its next sync)"
            )
        history = self._typed.history(connection_id, table)
        return ReaderSchema(
            connection_id,
            self._typed.schema_of(connection_id),
            [_typed_table(s, history) for s in stored],
        )

    def choose_reader_schema(self, connection_id: int, schema: str) -> None:
        """The schema of a connection's typed views, chosen before its first sync builds
        them; a built schema keeps its name."""
        self.connection(connection_id)
        check_schema_name(schema, self.settings.schema_name)
        try:
            chosen = self._typed.set_reader_schema(connection_id, schema)
        except psycopg.errors.UniqueViolation:
            raise Conflict(f"another connection's views are in schema {schema!r}") from None
        if not chosen:
            built = self._typed.schema_of(connection_id)
            raise Conflict(
                f"connection {connection_id}'s views are built in schema {built!r} already; a "
                "built schema keeps its name"
            )

    def grant_read_only(self, role: str, workspace: int | str) -> int:
        """Let ``role`` read the typed views of ``workspace``'s connections (those built later
        too) and nothing else; how many schemas it reads now."""
        found = self.workspace(workspace)
        try:
            return self._typed.grant_reader(found.id, role)
        except psycopg.errors.UndefinedObject:
            raise InvalidInput(
                f"role {role!r} does not exist; create it first (CREATE ROLE {role} LOGIN)"
            ) from None
