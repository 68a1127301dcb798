"""Who may read typed views and when they change: a role granted a workspace reads its views
(those built after the grant too) and nothing else; a stale claim changes no view; a purge
drops the connection's schema."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from connectors import Mode, Table
from sync import Engine
from sync.errors import InvalidInput, LeaseLost
from sync.runs.typed import TableViews
from sync.store import Lease
from sync.store.typed import TypedStore
from tests.conftest import DATABASE_URL, DIRECT_URL
from tests.test_fencing import claim
from tests.typed_support import dataset, rows, sync_once


@pytest.fixture
def role(schema: str) -> Iterator[str]:
    name = f"{schema}_reader"
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(DIRECT_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def select(conn: psycopg.Connection[Any], schema: str, relation: str) -> list[Any]:
    query = sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(relation))
    return conn.execute(query).fetchall()


def test_a_read_only_role_reads_its_workspace_views_and_nothing_else(
    engine: Engine, role: str, schema: str
) -> None:
    key, data = dataset(items=[{"id": 1, "n": 1}])
    mine = engine.create_workspace("mine")
    theirs = engine.create_workspace("theirs")
    a = engine.create_connection(
        mine.id, "a", "typed_memory", config={"dataset": key}, credentials={"token": "s3cret"}
    )
    b = engine.create_connection(theirs.id, "b", "typed_memory", config={"dataset": key})
    sync_once(engine, a.id)
    sync_once(engine, b.id)
    assert engine.grant_read_only(role, "mine") == 1
    with pytest.raises(InvalidInput, match="does not exist"):
        engine.grant_read_only(f"{schema}_nobody", "mine")

    # Built after the grant: a new connection's views, and a's views dropped and created again
    # (a widened column).
    c = engine.create_connection(mine.id, "c", "typed_memory", config={"dataset": key})
    sync_once(engine, c.id)
    data.tables["items"] = [{"id": 1, "n": "one"}]
    sync_once(engine, a.id)

    schemas = {x.id: engine.reader_schema(x.id).schema for x in (a, b, c)}
    with psycopg.connect(make_conninfo(DATABASE_URL, user=role), autocommit=True) as reader:
        (row,) = rows(reader, schemas[a.id], "items")
        assert (row["_key"], row["n"]) == ("1", "one")
        assert len(select(reader, schemas[a.id], "items__all")) == 1
        assert len(select(reader, schemas[c.id], "items")) == 1
        refused = [
            (schemas[b.id], "items"),  # another workspace's
            (engine.settings.schema_name, "records"),  # the engine's own tables
            (engine.settings.schema_name, "connections"),  # credentials
        ]
        for where, relation in refused:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                select(reader, where, relation)


def test_a_stale_claim_changes_no_view(engine: Engine, admin: Any) -> None:
    key, _ = dataset(items=[{"id": 1}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    engine.sync(conn.id)
    first = claim(engine, "worker-a")
    stale = Lease(first["id"], first["lease_owner"])
    admin.execute("UPDATE connection_runs SET lease_expires_at = now() - interval '1 second'")
    claim(engine, "worker-b")

    table = Table("items", "id", Mode.FULL)
    log = logging.LoggerAdapter(logging.getLogger("test"))
    views = TableViews(TypedStore(engine.pool), stale, conn.id, table, log)
    views.observe({"id": 1, "n": 2})
    with pytest.raises(LeaseLost):
        views.before_write()
    assert admin.execute("SELECT count(*) AS n FROM typed_tables").fetchone()["n"] == 0
    assert admin.execute("SELECT count(*) AS n FROM reader_schemas").fetchone()["n"] == 0


def test_purge_drops_the_connections_schema(engine: Engine, admin: Any) -> None:
    key, _ = dataset(items=[{"id": 1}])
    ws = engine.create_workspace("w")
    gone = engine.create_connection(ws.id, "gone", "typed_memory", config={"dataset": key})
    kept = engine.create_connection(ws.id, "kept", "typed_memory", config={"dataset": key})
    sync_once(engine, gone.id)
    sync_once(engine, kept.id)
    dropped = engine.reader_schema(gone.id).schema
    assert dropped is not None

    engine.delete_connection(gone.id)
    assert engine.worker(listen=False).poll()
    exists = "SELECT count(*) AS n FROM pg_namespace WHERE nspname = %s"
    assert admin.execute(exists, (dropped,)).fetchone()["n"] == 0
    assert admin.execute("SELECT count(*) AS n FROM typed_tables").fetchone()["n"] == 1
    with psycopg.connect(DATABASE_URL) as reader:
        assert len(rows(reader, engine.reader_schema(kept.id).schema, "items")) == 1


def run_cli(
    engine: Engine, capsys: pytest.CaptureFixture[str], mp: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    from sync.cli import main

    mp.setenv("DATABASE_URL", DATABASE_URL)
    mp.setenv("CONNECTOR_SYNC_SCHEMA", engine.settings.schema_name)
    mp.setenv("COLUMNS", "100")
    capsys.readouterr()
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def test_schema_show_and_grant_on_the_command_line(
    engine: Engine,
    role: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, data = dataset(items=[{"id": 1, "n": 1}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    code, out, _ = run_cli(engine, capsys, monkeypatch, "schema", "show", str(conn.id))
    assert (code, out.strip()) == (
        0,
        f"connection {conn.id} has no typed views yet: its next sync builds them",
    )
    sync_once(engine, conn.id)
    data.tables["items"] = [{"id": 1, "n": 1.5}]
    widened = sync_once(engine, conn.id)
    code, out, _ = run_cli(engine, capsys, monkeypatch, "runs", "show", str(widened.id))
    assert code == 0
    assert "items warning" in out and "n: values no longer fit bigint; widened to" in out

    code, out, _ = run_cli(engine, capsys, monkeypatch, "schema", "show", str(conn.id), "items")
    schema = engine.reader_schema(conn.id).schema
    assert code == 0
    assert f"{schema}.items" in out and "items__all" in out
    assert [line.split()[:2] for line in out.splitlines() if line.startswith("n ")] == [
        ["n", "numeric"]
    ]
    assert "v2" in out and "widened n from bigint to numeric" in out

    code, out, _ = run_cli(engine, capsys, monkeypatch, "schema", "show", str(conn.id), "--json")
    shown = json.loads(out)
    assert shown["schema"] == schema
    (items,) = shown["tables"]
    assert [(c["name"], c["type"]) for c in items["columns"]] == [
        ("id", "bigint"),
        ("n", "numeric"),
    ]
    assert [h["changes"] for h in items["history"]] == [
        ["added id bigint", "added n bigint"],
        ["widened n from bigint to numeric"],
    ]

    code, _, err = run_cli(engine, capsys, monkeypatch, "schema", "show", str(conn.id), "nope")
    assert code == 2 and "no typed table 'nope'" in err and len(err.strip().splitlines()) == 1

    code, out, _ = run_cli(engine, capsys, monkeypatch, "grant", "--read-only", role, "-w", "w")
    assert code == 0 and f"granted {role} read access" in out
    code, _, err = run_cli(engine, capsys, monkeypatch, "grant", "--read-only", role)
    assert code == 2 and "grant --read-only ROLE -w WORKSPACE" in err
    with psycopg.connect(make_conninfo(DATABASE_URL, user=role)) as reader:
        assert len(rows(reader, schema, "items")) == 1


def test_a_worker_without_ddl_rights_builds_the_views(
    engine: Engine, schema: str, role: str
) -> None:
    """The views are built by server-side functions that run as the role that migrated, so a
    worker under the runtime role of ``grant ROLE`` (no DDL right) builds them."""
    engine.grant(role)
    key, _ = dataset(items=[{"id": 1, "n": 1}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    url = make_conninfo(DATABASE_URL, user=role)
    with (
        psycopg.connect(url) as runtime,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        runtime.execute(f'CREATE SCHEMA "{schema}_mine"')
    with Engine(engine.settings.model_copy(update={"database_url": url})) as limited:
        assert sync_once(limited, conn.id).status == "succeeded"
        shown = limited.reader_schema(conn.id)
    assert shown.schema is not None and [t.view for t in shown.tables] == ["items"]


def test_the_operator_page_shows_a_connections_typed_views(engine: Engine) -> None:
    import httpx

    from sync.ui import UiOptions
    from tests.ui_support import serving

    key, data = dataset(items=[{"id": 1, "n": 1, "when": "2024-01-01T00:00:00Z"}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    with serving(engine, UiOptions()) as url, httpx.Client(base_url=url) as client:
        page = client.get(f"/connections/{conn.id}/schema")
        assert page.status_code == 200 and 'id="no-views"' in page.text
        sync_once(engine, conn.id)
        data.tables["items"] = [{"id": 1, "n": "one", "when": "2024-01-01T00:00:00Z"}]
        sync_once(engine, conn.id)
        page = client.get(f"/connections/{conn.id}/schema")
        schema = engine.reader_schema(conn.id).schema
        assert f"<code>{schema}.items</code>" in page.text
        assert "<td><code>when</code></td><td>timestamptz</td>" in page.text
        assert "<td><code>n</code></td><td>text</td>" in page.text
        assert "widened n from bigint to text" in page.text
        assert f'href="/connections/{conn.id}/schema"' in client.get("/connections").text
        assert client.get("/connections/999/schema").status_code == 404


def test_a_schema_is_chosen_until_the_first_sync_builds_it(
    engine: Engine,
    schema: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sync.errors import Conflict

    key, _ = dataset(items=[{"id": 1}])
    ws = engine.create_workspace("w")
    conn = engine.create_connection(ws.id, "c", "typed_memory", config={"dataset": key})
    other = engine.create_connection(
        ws.id, "d", "typed_memory", config={"dataset": key}, schema=f"{schema}_d"
    )
    chosen = f"{schema}_chosen"
    code, out, _ = run_cli(
        engine, capsys, monkeypatch, "connections", "update", str(conn.id), "--schema", chosen
    )
    assert code == 0 and f"updated: schema {chosen}" in out
    with pytest.raises(Conflict, match="another connection"):
        engine.choose_reader_schema(conn.id, f"{schema}_d")
    assert engine.connection(other.id).name == "d"
    sync_once(engine, conn.id)
    assert engine.reader_schema(conn.id).schema == chosen
    code, _, err = run_cli(
        engine, capsys, monkeypatch, "connections", "update", str(conn.id), "--schema", "x_y"
    )
    assert code == 2 and "built in schema" in err and "keeps its name" in err
