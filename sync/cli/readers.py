"""Typed tables for readers on the command line: ``schema show CONNECTION [TABLE]``, the typed
views a connection's tables have and how they changed. (``grant --read-only`` is beside
``grant``, in ``operate``.)"""

from __future__ import annotations

import typer
from rich.table import Table
from rich.text import Text

from sync.cli.common import (
    ConnectionArg,
    JsonOption,
    app,
    command_group,
    emit_json,
    guarded,
    open_engine,
    stdout,
)
from sync.cli.console import Cell, Col, fitted_table
from sync.readers import TypedTable

schema_app = command_group("Typed views: the schema readers query, per connection.")
app.add_typer(schema_app, name="schema")


@schema_app.command("show")
@guarded
def schema_show(
    connection_id: int = ConnectionArg(),
    table: str | None = typer.Argument(
        None, metavar="TABLE", help="One table (default: all of them)."
    ),
    as_json: bool = JsonOption,
) -> None:
    """The typed views of CONNECTION: each table's view, its columns and their types, and
    every change its syncs made."""
    with open_engine() as engine:
        shown = engine.reader_schema(connection_id, table)
    if as_json:
        emit_json(shown.to_json())
        return
    out = stdout()
    if shown.schema is None or not shown.tables:
        out.print(f"connection {connection_id} has no typed views yet: its next sync builds them")
        return
    for typed in shown.tables:
        out.print(
            Text.assemble(
                (f"{shown.schema}.{typed.view}", "bold"),
                f"  (table {typed.table}, version {typed.version}; tombstones too in "
                f"{typed.all_view})",
            )
        )
        out.print(columns_table(typed, out.width))
        for version in typed.history:
            out.print(
                Text(
                    f"  v{version.version} {version.changed_at[:19]} run {version.run_id}: "
                    + ", ".join(version.changes),
                    style="dim",
                )
            )


def columns_table(typed: TypedTable, width: int) -> Table:
    columns = [
        Col("column", key=True),
        Col("type", key=True),
        Col("field", text="fold"),
        Col("from"),
    ]
    rows: list[list[Cell]] = [
        ["_key", "text", "(the row's key)", "-"],
        ["_synced_at", "timestamptz", "(last written)", "-"],
        ["_first_seen_at", "timestamptz", "(first written)", "-"],
    ]
    rows += [[c.name, c.type, c.field, c.origin] for c in typed.columns]
    return fitted_table(columns, rows, width)
