"""A table's typed views, kept in step with what a sync writes: every record the writer takes
is observed (``sync.typed.evolve.Shape``) before it is written, and a batch whose values need a
new column or a wider type has the views rebuilt first, fenced by the run. So a view never
casts a stored value to a type it does not fit, and a reader's query never fails for it. A
table's first build types the rows stored before from a bounded sample of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from connectors.base import Table
from connectors.errors import PermanentError
from sync.errors import LeaseLost
from sync.jobs.log import Logger
from sync.store import Lease
from sync.store.db import first_line
from sync.store.typed import Build, StoredTable, TypedStore
from sync.typed.evolve import Column, Shape, evolve
from sync.typed.naming import default_schema, fallback_schema, view_name
from sync.typed.types import PgType, joined, model_types

# Rows of a table stored before its first build that type its columns (the latest written).
SAMPLE_ROWS = 1000


class ViewsHeldBack(PermanentError):
    """A widening needs the views dropped, and a reader's own views depend on them."""


class TableViews:
    """The typed views of one table of one run: ``observe`` each record, ``before_write``
    each batch, ``finish`` at the table's end."""

    def __init__(
        self,
        store: TypedStore,
        lease: Lease,
        connection_id: int,
        table: Table,
        logger: Logger,
        *,
        schema_prefix: str = "",
        built: set[tuple[int, str]] | None = None,
    ) -> None:
        self._store = store
        self._prefix = schema_prefix
        # The tables this process knows have views (a view goes only with its connection):
        # a table that wrote nothing needs no statement to know it.
        self._built = built if built is not None else set()
        self._lease = lease
        self._connection_id = connection_id
        self._table = table
        self._logger = logger
        self._shape = Shape(table.flatten)
        self._declared: dict[tuple[str, ...], PgType] = (
            model_types(table.model, table.flatten) if table.model is not None else {}
        )
        self._stored: StoredTable | None = None
        self._columns: tuple[Column, ...] = ()
        self._loaded = False
        self._off = False  # the views could not be built in this run
        self.warnings: list[str] = []

    def observe(self, record: Mapping[str, Any]) -> None:
        self._shape.observe(record)

    def before_write(self) -> None:
        """Rebuild the views if the records observed so far need it (raises
        :class:`LeaseLost`)."""
        self._publish(only_if_changed=True)

    def finish(self) -> None:
        """The table's end: its views are built if they never were, or rebuilt if the records
        need it."""
        if not self._shape.types and (self._connection_id, self._table.name) in self._built:
            return
        self._publish(only_if_changed=False)

    def _load(self) -> None:
        if self._loaded:
            return
        self._stored = self._store.table(self._connection_id, self._table.name)
        if self._stored is None:
            sample = self._store.sample(self._connection_id, self._table.name, SAMPLE_ROWS)
            for data in sample:
                if isinstance(data, Mapping):
                    self._shape.observe(data)
            if len(sample) == SAMPLE_ROWS:  # more rows may be stored than the sample holds
                self._widen_to_stored_rows()
        else:
            self._columns = self._stored.columns
            self._built.add((self._connection_id, self._table.name))
        self._loaded = True

    def _widen_to_stored_rows(self) -> None:
        """Widen the types the sample gave where a stored row outside it does not fit them:
        the views must cast every stored value."""
        typed = [
            c
            for c in evolve((), self._shape.types, self._declared).columns
            if c.type not in (PgType.TEXT, PgType.JSONB)
        ]
        for index, nested in self._store.misfits(
            self._connection_id, self._table.name, typed
        ).items():
            column = typed[index]
            wider = joined(column.type, PgType.JSONB if nested else PgType.TEXT)
            self._shape.types[column.path] = joined(self._shape.types.get(column.path), wider)
            warning = (
                f"column {column.column}: rows stored before hold values that are not "
                f"{column.type}; it is {wider}"
            )
            self._logger.warning("table %s: %s", self._table.name, warning)
            self.warnings.append(warning)

    def _publish(self, *, only_if_changed: bool) -> None:
        if self._off:
            return
        self._load()
        evolution = evolve(self._columns, self._shape.types, self._declared)
        if not evolution.changes and (self._stored is not None or only_if_changed):
            return
        names = self._store.connection_names(self._connection_id)
        if names is None:  # the connection is gone; a purge drops what is left
            return
        default = default_schema(*names, prefix=self._prefix)
        view = (
            self._stored.view_name
            if self._stored is not None
            else view_name(
                self._table.name,
                self._store.other_view_names(self._connection_id, self._table.name),
            )
        )
        build = Build(
            default_schema=default,
            fallback_schema=fallback_schema(default, self._connection_id),
            view_name=view,
            columns=evolution.columns,
            changes=evolution.changes,
            recreate=evolution.recreate,
        )
        try:
            published = self._store.publish(
                self._lease, self._connection_id, self._table.name, build
            )
        except (psycopg.errors.DuplicateSchema, psycopg.errors.InsufficientPrivilege) as exc:
            if self._stored is not None:
                raise
            # No view exists to break: the records are synced, and the next sync tries again.
            self._off = True
            warning = f"no typed views: {first_line(exc)}"
            self._logger.warning("table %s: %s", self._table.name, warning)
            self.warnings.append(warning)
            return
        except psycopg.errors.DependentObjectsStillExist as exc:
            detail = (exc.diag.message_detail or "").splitlines()
            raise ViewsHeldBack(
                f"the typed views of table {self._table.name!r} cannot be widened "
                f"({', '.join(c.describe() for c in evolution.changes)}): "
                f"{'; '.join(detail) or 'other objects depend on them'}; drop those, and the "
                "next sync widens them (nothing they would not show was written)"
            ) from None
        if published is None:
            raise LeaseLost()
        self._stored = StoredTable(self._table.name, view, evolution.columns, published.version)
        self._columns = evolution.columns
        self._built.add((self._connection_id, self._table.name))
        for warning in evolution.warnings:
            self._logger.warning("table %s: %s", self._table.name, warning)
        self.warnings.extend(evolution.warnings)
        if evolution.changes:
            self._logger.info(
                "table %s: typed views %s.%s version %d (%s)",
                self._table.name,
                published.schema_name,
                view,
                published.version,
                ", ".join(c.describe() for c in evolution.changes),
            )
