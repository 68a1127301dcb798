"""The databases the chunk store is tested on: the system Postgres (15, no pgvector: the real[]
fallback) and an embedded Postgres 16 from the ``pgserver`` package, which ships pgvector, in
three set-ups: pgvector created by the migration, pgvector already installed in another schema,
and a migrating role that may not create extensions (the fallback again)."""

from __future__ import annotations

import contextlib
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo, sql

from sync.documents import VectorStorage
from sync.store.migrations import migrate
from tests.conftest import DIRECT_URL

SETUPS = ("postgres-real[]", "pgvector", "pgvector-in-public", "no-create-extension")


@dataclass
class ChunkDatabase:
    setup: str
    url: str  # connects with search_path on the schema
    schema: str
    expected: VectorStorage
    workspaces: tuple[int, int]

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.url, autocommit=True, options=f"-c search_path={self.schema}", **kwargs
        )


def start_pgserver(directory: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, when XDG_RUNTIME_DIR is unset
        import pgserver

        return pgserver.get_server(directory, cleanup_mode="delete")


def _with_workspaces(url: str, schema: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        migrate(conn, schema)
        rows = conn.execute(
            sql.SQL("INSERT INTO {}.workspaces (name) VALUES ('one'), ('two') RETURNING id").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return rows[0][0], rows[1][0]


@contextlib.contextmanager
def chunk_database(setup: str, server: Any) -> Iterator[ChunkDatabase]:
    """A migrated schema with two workspaces, dropped afterwards."""
    if setup == "postgres-real[]":
        schema = f"t_{uuid.uuid4().hex[:12]}"
        try:
            yield ChunkDatabase(
                setup,
                DIRECT_URL,
                schema,
                VectorStorage.ARRAY,
                _with_workspaces(DIRECT_URL, schema),
            )
        finally:
            with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )
        return
    admin_url = server.get_uri("postgres")
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = conninfo.make_conninfo(admin_url, dbname=name)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        if setup == "no-create-extension":
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            admin.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(name)
                )
            )
            url = conninfo.make_conninfo(url, user=name)
        else:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    if setup == "pgvector-in-public":
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector SCHEMA public")
    expected = VectorStorage.ARRAY if setup == "no-create-extension" else VectorStorage.PGVECTOR
    try:
        yield ChunkDatabase(setup, url, "sync", expected, _with_workspaces(url, "sync"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            if setup == "no-create-extension":
                admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
