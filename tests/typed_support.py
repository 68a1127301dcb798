"""What the typed tables tests share: connectors whose tables exercise types, models, names and
long names, and helpers to sync once and read a view as a reader does."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

import psycopg
from pydantic import BaseModel, Field

from connectors import Mode, Table, register
from sync import Engine
from tests.fakes import DATASETS, Dataset, MemoryConnector

LONG = "a_very_long_field_name_that_goes_on_and_on_past_what_postgres_keeps_"


@register
class TypedMemory(MemoryConnector):
    provider = "typed_memory"
    tables = (Table("items", "id", Mode.FULL),)


class User(BaseModel):
    login: str
    id: int


class Issue(BaseModel):
    id: int
    title: str
    closed: bool | None = None
    score: float | None = None
    due: date | None = None
    opened_at: datetime | None = None
    labels: list[str] = []
    user: User | None = None
    state_name: str | None = Field(default=None, alias="State")


@register
class TypedModel(MemoryConnector):
    provider = "typed_model"
    tables = (Table("issues", "id", Mode.FULL, model=Issue, flatten=("user",)),)


class TypedNames(MemoryConnector):
    """Registered only while a test uses it: its names are wider than a terminal."""

    provider = "typed_names"
    tables = (
        Table("Tasks", "id", Mode.FULL),
        Table("tasks", "id", Mode.FULL),
        Table("tasks__all", "id", Mode.FULL),
        Table(LONG + "one", "id", Mode.FULL),
        Table(LONG + "two", "id", Mode.FULL),
    )


def dataset(**tables: list[dict[str, Any]]) -> tuple[str, Dataset]:
    key = uuid.uuid4().hex
    DATASETS[key] = Dataset(tables=dict(tables))
    return key, DATASETS[key]


def sync_once(engine: Engine, connection_id: int) -> Any:
    run = engine.sync(connection_id)
    assert engine.worker(listen=False).poll() is True
    return engine.run(run.id)


def column_types(conn: psycopg.Connection[Any], schema: str, view: str) -> dict[str, str]:
    """The columns of a view and their types, in order, as the catalog has them."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = format('%%I.%%I', %s::text, %s::text)::regclass AND a.attnum > 0 "
        "ORDER BY a.attnum",
        (schema, view),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def rows(conn: psycopg.Connection[Any], schema: str, view: str, order: str = "_key") -> list[Any]:
    query = psycopg.sql.SQL("SELECT * FROM {}.{} ORDER BY {}").format(
        psycopg.sql.Identifier(schema), psycopg.sql.Identifier(view), psycopg.sql.Identifier(order)
    )
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(query).fetchall()
