"""Typed views on the real Postgres: a column per field with its type, from the data or the
connector's model, tombstones left out of one view and kept in the other, evolution (a field
added, widened, vanished), names that clash or are too long, and the schema's history."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from connectors import register
from connectors.registry import unregister
from sync import Engine
from tests.fakes import DATASETS
from tests.typed_support import LONG, TypedNames, column_types, dataset, rows, sync_once

META = {
    "_key": "text",
    "_synced_at": "timestamp with time zone",
    "_first_seen_at": "timestamp with time zone",
}


@pytest.fixture
def reader() -> Any:
    from tests.conftest import DATABASE_URL

    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        yield conn


def test_each_type_from_the_data(engine: Engine, reader: Any) -> None:
    key, _ = dataset(
        items=[
            {
                "id": 1,
                "n": 5,
                "big": 2**70,
                "f": 1.5,
                "flag": True,
                "s": "hello",
                "d": "2024-02-29",
                "ts": "2024-03-01T10:00:00Z",
                "obj": {"a": 1},
                "arr": [1, 2],
                "nothing": None,
                "naive": "2024-03-01T10:00:00",
                "not_a_date": "2024-02-30",
            },
            {"id": 2, "n": -7, "big": 3, "f": 2, "flag": False, "s": "x", "obj": [], "arr": []},
        ]
    )
    ws = engine.create_workspace("Acme Corp")
    conn = engine.create_connection(ws.id, "Tracker", "typed_memory", config={"dataset": key})
    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"

    schema = engine.reader_schema(conn.id).schema
    assert schema == f"{engine.settings.reader_schema_prefix}acme_corp_tracker"
    assert column_types(reader, schema, "items") == {
        **META,
        "arr": "jsonb",
        "big": "numeric",
        "d": "date",
        "f": "numeric",
        "flag": "boolean",
        "id": "bigint",
        "n": "bigint",
        "naive": "text",
        "not_a_date": "text",
        "obj": "jsonb",
        "s": "text",
        "ts": "timestamp with time zone",
    }  # `nothing` was only ever null: no column until a value comes
    first, second = rows(reader, schema, "items")
    assert first["_key"] == "1" and second["_key"] == "2"
    assert (first["id"], first["n"], first["big"], first["f"]) == (1, 5, Decimal(2**70), 1.5)
    assert (first["flag"], first["s"], first["d"]) == (True, "hello", date(2024, 2, 29))
    assert first["ts"] == datetime(2024, 3, 1, 10, tzinfo=UTC)
    assert (first["obj"], first["arr"], first["not_a_date"]) == ({"a": 1}, [1, 2], "2024-02-30")
    assert (second["f"], second["flag"], second["d"], second["obj"]) == (2, False, None, [])


def test_types_from_the_connectors_model_with_a_flattened_object(
    engine: Engine, reader: Any
) -> None:
    key, _ = dataset(
        issues=[
            {
                "id": 7,
                "title": "Crash",
                "labels": ["bug"],
                "user": {"login": "ada", "id": 3},
                "State": "open",
                "extra": 1.25,
            }
        ]
    )
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "gh", "typed_model", config={"dataset": key})
    sync_once(engine, conn.id)

    shown = engine.reader_schema(conn.id, "issues")
    schema = shown.schema
    assert schema is not None
    # The model's fields in its order, also those never set (closed, score, due...); a field
    # only the data has comes after them, typed from its values.
    assert column_types(reader, schema, "issues") == {
        **META,
        "id": "bigint",
        "title": "text",
        "closed": "boolean",
        "score": "numeric",
        "due": "date",
        "opened_at": "timestamp with time zone",
        "labels": "jsonb",
        "user__login": "text",
        "user__id": "bigint",
        "state": "text",
        "extra": "numeric",
    }
    (row,) = rows(reader, schema, "issues")
    assert (row["user__login"], row["user__id"], row["state"]) == ("ada", 3, "open")
    origins = {c.name: c.origin for c in shown.tables[0].columns}
    assert origins["user__login"] == "model" and origins["extra"] == "data"
    assert shown.tables[0].columns[7].field == "user.login"


def test_tombstoned_rows_only_in_the_companion_view(engine: Engine, reader: Any) -> None:
    key, data = dataset(items=[{"id": i, "v": i} for i in (1, 2, 3)])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, conn.id)
    data.tables["items"] = [{"id": 1, "v": 1}, {"id": 3, "v": 3}]
    run = sync_once(engine, conn.id)
    assert run.results["items"]["tombstoned"] == 1

    schema = engine.reader_schema(conn.id).schema
    assert [r["_key"] for r in rows(reader, schema, "items")] == ["1", "3"]
    every = rows(reader, schema, "items__all")
    assert [(r["_key"], r["_deleted_at"] is not None) for r in every] == [
        ("1", False),
        ("2", True),
        ("3", False),
    ]
    assert column_types(reader, schema, "items__all")["_deleted_at"] == "timestamp with time zone"


def test_evolution_adds_widens_and_keeps_a_vanished_column(engine: Engine, reader: Any) -> None:
    key, data = dataset(items=[{"id": 1, "count": 1, "gone": "x"}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, conn.id)
    schema = engine.reader_schema(conn.id).schema
    assert schema is not None

    # Added: a new field is a new column at the end; `gone` vanished and keeps its column.
    data.tables["items"] = [{"id": 1, "count": 2, "new": True}]
    run = sync_once(engine, conn.id)
    assert "warnings" not in run.results["items"]
    assert list(column_types(reader, schema, "items"))[3:] == ["count", "gone", "id", "new"]
    (row,) = rows(reader, schema, "items")
    assert (row["count"], row["gone"], row["new"]) == (2, None, True)

    # Widened: bigint to numeric, then a string makes it text, with a warning on the run.
    data.tables["items"] = [{"id": 1, "count": 2.5, "new": True}]
    run = sync_once(engine, conn.id)
    assert column_types(reader, schema, "items")["count"] == "numeric"
    assert run.results["items"]["warnings"] == [
        "column count: values no longer fit bigint; widened to numeric"
    ]
    data.tables["items"] = [{"id": 1, "count": 2.5}, {"id": 2, "count": "many"}]
    sync_once(engine, conn.id)
    assert column_types(reader, schema, "items")["count"] == "text"
    assert [r["count"] for r in rows(reader, schema, "items")] == ["2.5", "many"]

    table = engine.reader_schema(conn.id, "items").tables[0]
    assert table.version == 4
    assert [h.changes for h in table.history] == [
        ["added count bigint", "added gone text", "added id bigint"],
        ["added new boolean"],
        ["widened count from bigint to numeric"],
        ["widened count from numeric to text"],
    ]
    # An unchanged schema is not rebuilt.
    sync_once(engine, conn.id)
    assert engine.reader_schema(conn.id, "items").tables[0].version == 4


@pytest.fixture
def typed_names() -> Iterator[None]:
    register(TypedNames)
    yield
    unregister(TypedNames.provider)


@pytest.mark.usefixtures("typed_names")
def test_names_that_clash_or_are_too_long(engine: Engine, reader: Any) -> None:
    long_a = LONG + "alpha"
    long_b = LONG + "beta"
    record = {"id": 1, "Name": "upper", "name": "lower", "_key": "mine", long_a: 1, long_b: 2}
    record["é" * 40] = "wide"  # 80 bytes of UTF-8: cut at a character boundary
    key, _ = dataset(**{t: [record] for t in ("Tasks", "tasks", "tasks__all")})
    DATASETS[key].tables.update({LONG + "one": [record], LONG + "two": [record]})
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_names", config={"dataset": key})
    assert sync_once(engine, conn.id).status == "succeeded"

    shown = engine.reader_schema(conn.id)
    views = {t.table: t.view for t in shown.tables}
    cut = LONG[:58]
    assert (
        views
        == {
            "Tasks": "tasks",
            "tasks": "tasks_2",  # the second of two names equal in lower case
            "tasks__all": "tasks__all_2",  # "tasks__all" is the companion of "tasks"
            LONG + "one": cut,
            LONG + "two": cut[:56] + "_2",
        }
    )
    for view in views.values():
        assert len(view.encode()) <= 58
        assert rows(reader, shown.schema, view + "__all")
    columns = list(column_types(reader, shown.schema, views["Tasks"]))
    assert columns[3:] == sorted(columns[3:], key=lambda c: columns.index(c))
    names = set(columns)
    assert {"name", "name_2", "_key_2", LONG[:63], LONG[:61] + "_2", "é" * 31} <= names
    assert all(len(n.encode()) <= 63 for n in names)
    (row,) = rows(reader, shown.schema, views["Tasks"])
    assert (row["_key"], row["_key_2"]) == ("1", "mine")
    assert {row["name"], row["name_2"]} == {"upper", "lower"}


def test_a_chosen_schema_and_one_taken(engine: Engine, reader: Any, schema: str) -> None:
    from sync.errors import Conflict, InvalidInput

    key, _ = dataset(items=[{"id": 1}])
    config = {"dataset": key}
    ws = engine.create_workspace("w")
    chosen = f"{schema}_mine"
    conn = engine.create_connection(
        ws.id, "c", "typed_memory", config={"dataset": key}, schema=chosen
    )
    with pytest.raises(Conflict, match="schema"):
        engine.create_connection(ws.id, "d", "typed_memory", config={"dataset": key}, schema=chosen)
    with pytest.raises(InvalidInput, match="plain name"):
        engine.create_connection(ws.id, "e", "typed_memory", config=config, schema="Bad-Name")
    with pytest.raises(InvalidInput, match="taken"):
        engine.create_connection(
            ws.id, "e", "typed_memory", config=config, schema=engine.settings.schema_name
        )
    sync_once(engine, conn.id)
    assert engine.reader_schema(conn.id).schema == chosen
    assert rows(reader, chosen, "items")[0]["id"] == 1

    # A default name that is taken by a schema of someone else's gets the connection's id.
    prefix = engine.settings.reader_schema_prefix
    reader.execute(f'CREATE SCHEMA "{prefix}w_other"')
    other = engine.create_connection(ws.id, "other", "typed_memory", config={"dataset": key})
    sync_once(engine, other.id)
    assert engine.reader_schema(other.id).schema == f"{prefix}w_other_{other.id}"


def test_a_readers_dependent_view_holds_a_widening_back_and_loses_nothing(
    engine: Engine, reader: Any, schema: str
) -> None:
    key, data = dataset(items=[{"id": 1, "n": 1}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, conn.id)
    views = engine.reader_schema(conn.id).schema
    mine = f"{schema}_dashboards"
    reader.execute(f'CREATE SCHEMA "{mine}"')
    reader.execute(f'CREATE VIEW "{mine}".big AS SELECT _key, n FROM "{views}".items WHERE n > 0')

    data.tables["items"] = [{"id": 1, "n": 1}, {"id": 2, "n": "two"}]
    run = sync_once(engine, conn.id)
    error = run.results["items"]["error"]
    assert run.results["items"]["status"] != "succeeded"
    assert "depend" in error["message"] and "big" in error["message"]
    # Nothing the views do not fit was written, and the reader's view still answers.
    assert [r["_key"] for r in rows(reader, views, "items")] == ["1"]
    assert reader.execute(f'SELECT count(*) FROM "{mine}".big').fetchone() == (1,)

    reader.execute(f'DROP VIEW "{mine}".big')
    assert sync_once(engine, conn.id).status == "succeeded"
    assert [r["n"] for r in rows(reader, views, "items")] == ["1", "two"]


def test_rows_stored_before_the_first_build_are_typed_beyond_the_sample(
    engine: Engine, reader: Any, admin: Any
) -> None:
    """A table whose rows were stored before its views existed is typed from a sample of the
    latest rows; a stored row outside the sample that does not fit widens its column."""
    key, data = dataset(items=[{"id": i, "n": i} for i in range(1200)])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, conn.id)
    # As if written by a release without typed views: no views, and an old row outside the
    # sample of the latest 1,000 holding a string.
    schema = engine.reader_schema(conn.id).schema
    admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
    admin.execute("DELETE FROM reader_schemas")
    admin.execute("DELETE FROM typed_tables")
    admin.execute(
        "UPDATE records SET data = jsonb_set(data, '{n}', '\"many\"'), "
        "updated_at = '2000-01-01' WHERE external_id = '0'"
    )
    data.tables["items"] = [{"id": i, "n": i} for i in range(1, 1200)]  # 0 is deleted upstream
    run = sync_once(engine, conn.id)

    assert run.results["items"]["warnings"] == [
        "column n: rows stored before hold values that are not bigint; it is text"
    ]
    every = rows(reader, schema, "items__all")  # the tombstone is there, and reads
    assert (every[0]["_key"], every[0]["n"], every[0]["_deleted_at"] is not None) == (
        "0",
        "many",
        True,
    )
    assert column_types(reader, schema, "items")["n"] == "text"


def test_a_schema_taken_by_someone_else_leaves_the_sync_whole(
    engine: Engine, reader: Any, admin: Any, schema: str
) -> None:
    key, _ = dataset(items=[{"id": 1, "n": 1}])
    ws = engine.create_workspace("w")
    taken = f"{schema}_theirs"
    conn = engine.create_connection(
        ws.id, "c", "typed_memory", config={"dataset": key}, schema=taken
    )
    reader.execute(f'CREATE SCHEMA "{taken}"')  # made by someone else after the connection
    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"
    assert run.results["items"]["warnings"] == [
        f'no typed views: schema "{taken}" exists already and holds no views of this '
        "connection: drop or rename it, and the next sync builds the views there"
    ]
    assert admin.execute("SELECT count(*) AS n FROM records").fetchone()["n"] == 1
    assert engine.reader_schema(conn.id).schema is None

    reader.execute(f'DROP SCHEMA "{taken}"')
    assert "warnings" not in sync_once(engine, conn.id).results["items"]
    assert rows(reader, taken, "items")[0]["n"] == 1


def test_a_lookup_by_key_through_a_view_uses_the_records_primary_key(
    engine: Engine, admin: Any
) -> None:
    """The view's conditions and a reader's `_key = ...` reach the records' primary key, the
    security barrier notwithstanding: a lookup costs the same with a million rows as with ten."""
    import json

    key, _ = dataset(items=[{"id": i, "n": i} for i in range(2000)])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, conn.id)
    schema = engine.reader_schema(conn.id).schema
    admin.execute("ANALYZE records")
    for view in ("items", "items__all"):
        (plan,) = (
            admin.execute(
                f"EXPLAIN (FORMAT JSON) SELECT n FROM \"{schema}\".{view} WHERE _key = '1234'"
            )
            .fetchone()
            .values()
        )
        text = json.dumps(plan)
        assert '"Index Name": "records_pkey"' in text, text
        assert '"Seq Scan"' not in text, text


def test_a_table_that_wrote_nothing_costs_no_statement_once_its_views_exist(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sync.store.typed import TypedStore

    key, data = dataset(items=[])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    looked: list[str] = []
    lookup = TypedStore.table

    def counted(self: TypedStore, connection_id: int, table_name: str) -> Any:
        looked.append(table_name)
        return lookup(self, connection_id, table_name)

    monkeypatch.setattr(TypedStore, "table", counted)
    worker = engine.worker(listen=False)
    for _ in range(3):
        engine.sync(conn.id)
        assert worker.poll()
    assert looked == ["items"]  # the first sync built the (empty) views; the others knew
    assert engine.reader_schema(conn.id, "items").tables[0].columns == []

    data.tables["items"] = [{"id": 1, "n": 1}]  # rows again: the views are looked at, and grow
    engine.sync(conn.id)
    assert worker.poll()
    assert looked == ["items", "items"]
    assert [c.name for c in engine.reader_schema(conn.id, "items").tables[0].columns] == [
        "id",
        "n",
    ]
