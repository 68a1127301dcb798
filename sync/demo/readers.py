"""The demo's last word: a reader's query of one typed view, printed with a few of its rows,
and checked against the live records the API lists."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sync.api import Engine
from sync.demo.checks import Check

COLUMNS = ("id", "title", "state", "assignee")


@dataclass(frozen=True)
class ViewQuery:
    check: Check
    shown: RenderableType


def query_typed_view(engine: Engine, connection_id: int, table: str, limit: int = 5) -> ViewQuery:
    """Query ``table``'s typed view of ``connection_id`` as a reader would, over SQL."""
    found = engine.reader_schema(connection_id, table)
    schema, view = found.schema or "", found.tables[0].view
    text = (
        f"SELECT {', '.join(COLUMNS)} FROM {schema}.{view} WHERE state <> 'closed' "
        f"ORDER BY id LIMIT {limit}"
    )
    query = sql.SQL(
        "SELECT {columns} FROM {schema}.{view} WHERE state <> 'closed' ORDER BY id LIMIT {limit}"
    ).format(
        columns=sql.SQL(", ").join(map(sql.Identifier, COLUMNS)),
        schema=sql.Identifier(schema),
        view=sql.Identifier(view),
        limit=sql.Literal(limit),
    )
    count = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(view)
    )
    with psycopg.connect(engine.url, autocommit=True) as conn:
        rows = conn.execute(query).fetchall()
        (total,) = conn.execute(count).fetchone() or (0,)
    live = len(engine.records(connection_id, table))
    shown = Table(title=f"a reader's query of the typed view {schema}.{view}", title_justify="left")
    for name in COLUMNS:
        shown.add_column(name, justify="right" if name == "id" else "left")
    for row in rows:
        shown.add_row(*(str(v) for v in row))
    check = Check(
        "a reader's SQL over a typed view sees the live records",
        total == live and bool(rows),
        f"{total} rows in {schema}.{view}, {live} live records",
    )
    return ViewQuery(check, Group(Text(text, style="bold"), shown))
