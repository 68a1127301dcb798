"""A reader querying a typed view while a sync changes its schema, on real threads: every
query succeeds and shows one whole version of the schema (the columns of a version the history
records, with their types), never a half-built one."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from psycopg import sql

from sync import Engine
from tests.conftest import DATABASE_URL, DIRECT_URL, make_settings
from tests.typed_support import dataset, sync_once

PG_NAMES = {"timestamptz": "timestamp with time zone"}


def versions(engine: Engine, connection_id: int) -> list[list[tuple[str, str]]]:
    """Every version of the items view's columns, replayed from the schema's history."""
    meta = [
        ("_key", "text"),
        ("_synced_at", "timestamp with time zone"),
        ("_first_seen_at", "timestamp with time zone"),
    ]
    found: list[list[tuple[str, str]]] = []
    columns: list[tuple[str, str]] = []
    for version in engine.reader_schema(connection_id, "items").tables[0].history:
        for change in version.changes:
            words = change.split()
            if words[0] == "added":
                columns.append((words[1], PG_NAMES.get(words[2], words[2])))
            else:  # widened NAME from A to B
                at = [n for n, _ in columns].index(words[1])
                columns[at] = (words[1], PG_NAMES.get(words[5], words[5]))
        found.append(meta + list(columns))
    return found


def test_a_reader_never_sees_a_half_built_schema(schema: str) -> None:
    # Each batch of 10 rows brings a new field; from row 40 on, `w` is no longer a number, so
    # its column is widened (the views dropped and created again) in the middle of the sync.
    table = []
    for i in range(80):
        row: dict[str, Any] = {"id": i, "w": i if i < 40 else f"w{i}"}
        row.update({f"f{k}": k for k in range(i // 10 + 1)})
        table.append(row)
    key, data = dataset(items=table)
    handshakes = threading.Semaphore(0)
    queried = threading.Event()
    stop = threading.Event()

    def between_batches(index: int) -> None:
        # After each batch but the first: let the reader query before the next one is written.
        if index and index % 10 == 0:
            queried.clear()
            handshakes.release()
            assert queried.wait(timeout=30), "the reader stopped querying"

    data.before_row["items"] = between_batches
    seen: list[list[tuple[str, int]]] = []
    errors: list[BaseException] = []

    with Engine(make_settings(schema, batch_size=10), pool_size=6) as engine:
        engine.migrate()
        ws = engine.create_workspace("w")
        conn = engine.create_connection(
            ws.id, "c", "typed_memory", config={"dataset": key, "page_size": 5}
        )
        name = sql.Identifier(f"{engine.settings.reader_schema_prefix}w_c")
        view = sql.SQL("SELECT * FROM {}.items").format(name)
        stable = sql.SQL("SELECT _key, id, f0 FROM {}.items WHERE id >= 0").format(name)

        def read() -> None:
            try:
                with psycopg.connect(DIRECT_URL, autocommit=True) as reader:
                    handshakes.acquire()  # the views exist once the first batch is written
                    while not stop.is_set():
                        # A prepared statement of columns that keep their type survives
                        # every change; `SELECT *` is sent as psql sends it (a prepared one
                        # fails once when its columns change, as over a table).
                        reader.execute(stable, prepare=True).fetchall()
                        cur = reader.execute(view, prepare=False)
                        cur.fetchall()
                        assert cur.description is not None
                        seen.append([(c.name, c.type_code) for c in cur.description])
                        queried.set()
            except BaseException as exc:
                errors.append(exc)
                queried.set()

        thread = threading.Thread(target=read)
        thread.start()
        try:
            run = sync_once(engine, conn.id)
        finally:
            stop.set()
            handshakes.release()
            thread.join()
        assert errors == []
        assert run.status == "succeeded", run.results
        known = versions(engine, conn.id)

    with psycopg.connect(DATABASE_URL) as admin:
        oids = {t for columns in seen for _, t in columns}
        names = dict(
            admin.execute(
                "SELECT oid::int, format_type(oid, NULL) FROM pg_type WHERE oid = ANY(%s)",
                (list(oids),),
            ).fetchall()
        )
    shown = {tuple((n, names[t]) for n, t in columns) for columns in seen}
    assert len(known) == 8  # the first build, a column per later batch (w widens with one)
    assert shown <= {tuple(v) for v in known}
    # The reader saw the schema change under it, the widening of `w` included.
    assert len(shown) >= 5
    assert any(("w", "text") in s for s in shown) and any(("w", "bigint") in s for s in shown)
