"""The engine behind a real PgBouncer in transaction pooling mode (tests/pgbouncer.py), told so
by ``CONNECTOR_SYNC_POOLER=transaction``: every transaction carries the engine's settings and
leaves none behind, no statement is prepared on a server connection, ``migrate``'s lock lives
and dies with a transaction, and wake-ups come from ``listen_url`` or not at all (polling)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import sync.store.migrations
from sync import Engine, Settings
from sync.store.db import listen_url
from sync.store.migrations import shipped
from sync.worker import Listener
from tests.conftest import DIRECT_URL, make_settings
from tests.pgbouncer import PgBouncer, binary
from tests.test_sync_flow import items, new_dataset
from tests.waiting import until

pytestmark = [
    pytest.mark.skipif(
        binary() is None, reason="pgbouncer is not installed (apt-get install pgbouncer; .ci/run)"
    ),
    pytest.mark.slow,  # each module starts a PgBouncer
]

SETTINGS = (
    "SELECT pg_backend_pid() AS pid, current_setting('search_path') AS search_path, "
    "current_setting('statement_timeout') AS statement_timeout, "
    "current_setting('lock_timeout') AS lock_timeout, current_setting('jit') AS jit, "
    "current_setting('idle_in_transaction_session_timeout') AS idle"
)


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PgBouncer]:
    with PgBouncer(DIRECT_URL, pool_size=4, max_server_connections=8) as running:
        yield running


def pooled(schema: str, bouncer: PgBouncer, **overrides: Any) -> Settings:
    values: dict[str, Any] = {"pooler": "transaction", "listen_url": None}
    values.update(overrides)
    return make_settings(schema, database_url=bouncer.url, **values)


def test_every_transaction_carries_the_settings_and_leaves_none_on_the_server(
    bouncer: PgBouncer, schema: str
) -> None:
    settings = pooled(schema, bouncer, statement_timeout=7, lock_timeout=3)
    with Engine(settings, pool_size=3) as engine, engine.pool.connection() as conn:
        engine.migrate()
        alone = conn.execute(SETTINGS).fetchone()
        with conn.transaction():
            inside = conn.execute(SETTINGS).fetchone()
        # Two statements pipelined outside a transaction share one, which carries the settings
        # (the engine pipelines a run's finish with its attempt's counts).
        with conn.pipeline():
            first = conn.execute("SELECT txid_current() AS tx, %s::text AS n", ("a",))
            second = conn.execute(SETTINGS + ", txid_current() AS tx")
        piped = second.fetchone()
        assert piped is not None and first.fetchone()["tx"] == piped["tx"]
        assert alone is not None and inside is not None
        expected = {"search_path": schema, "statement_timeout": "7s", "lock_timeout": "3s"}
        for row in (alone, inside, piped):
            assert {k: row[k] for k in expected} == expected
            assert (row["jit"], row["idle"]) == ("off", "5min")
        # The named queries find their tables, alone and inside a transaction.
        workspace = engine.create_workspace("acme")
        assert [w.id for w in engine.workspaces()] == [workspace.id]
        last = conn.execute(SETTINGS).fetchone()
        assert last is not None

    # The next client of that server connection (PgBouncer hands out the one used last) finds
    # the server's own defaults: nothing of the engine's outlived its transactions.
    with psycopg.connect(bouncer.url, autocommit=True, row_factory=psycopg.rows.dict_row) as other:
        row = other.execute(SETTINGS).fetchone()
    assert row is not None and row["pid"] == last["pid"]
    assert row["search_path"] != schema
    assert row["statement_timeout"] == "0"


def test_a_statement_repeated_across_server_connections_is_never_prepared(
    bouncer: PgBouncer, schema: str
) -> None:
    """psycopg prepares a statement on its fifth run; PgBouncer 1.18 then sends the next run of
    it to a server connection that has no such statement, or another client's of that name."""
    with (
        Engine(pooled(schema, bouncer), pool_size=3) as engine,
        engine.pool.connection() as conn,
        psycopg.connect(bouncer.url) as holder,  # not autocommit: holds a server in a transaction
    ):
        engine.migrate()
        servers = set()
        for n in range(12):
            row = conn.execute("SELECT pg_backend_pid() AS pid, %s::int + 1 AS n", (n,)).fetchone()
            assert row is not None and row["n"] == n + 1
            servers.add(row["pid"])
            # Alternately take the server connection just used and give it back, so that the
            # next execution runs elsewhere.
            if n % 2 == 0:
                holder.execute("SELECT 1")
            else:
                holder.rollback()
        assert len(servers) > 1
        prepared = conn.execute("SELECT count(*) AS n FROM pg_prepared_statements").fetchone()
        assert prepared == {"n": 0}


def test_migrate_through_the_pooler_leaves_no_lock_behind(
    bouncer: PgBouncer, schema: str, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session-level lock is taken on one server connection and, if another client holds that
    connection when the release is sent, released on another (where it is not held): the lock
    stays with the pooled server connection for every later ``migrate`` to wait on."""
    holder = psycopg.connect(bouncer.url)  # not autocommit: holds a server in a transaction
    verify = sync.store.migrations._verify_checksums

    def meanwhile(*args: Any) -> None:
        # Another client takes the server connection migrate used last, and keeps it.
        holder.execute("SELECT 1")
        verify(*args)

    monkeypatch.setattr(sync.store.migrations, "_verify_checksums", meanwhile)
    try:
        with Engine(pooled(schema, bouncer), pool_size=3) as engine:
            assert len(engine.migrate()) == len(shipped())
        held = admin.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND ((classid::bigint << 32) | objid::bigint) = hashtext(%s)::bigint",
            (f"connector_sync.migrate.{schema}",),
        ).fetchone()
        assert held == {"n": 0}
    finally:
        holder.close()


def test_behind_the_pooler_without_a_listen_url_the_worker_polls(
    bouncer: PgBouncer, schema: str
) -> None:
    settings = pooled(schema, bouncer, poll_interval=0.05, heartbeat_interval=0.05)
    key, _ = new_dataset(items=items(1, 2))
    with Engine(settings, pool_size=4) as engine:
        engine.migrate()
        worker = engine.worker()
        assert listen_url(settings, engine.url) is None
        assert worker._listener is None  # a LISTEN through PgBouncer would hear nothing
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            run = engine.sync(conn.id)
            until(lambda: engine.run(run.id).status == "succeeded", worker.heartbeat.signals.ran)
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()
        assert engine.run(run.id).status == "succeeded"


def test_wake_ups_come_from_the_listen_url_not_through_the_pooler(
    bouncer: PgBouncer, schema: str, admin: Any
) -> None:
    settings = pooled(schema, bouncer, listen_url=DIRECT_URL)
    key, _ = new_dataset(items=items(1))
    with Engine(settings, pool_size=4) as engine:
        engine.migrate()
        worker = engine.worker()
        assert worker._listener is not None and worker._listener._url == DIRECT_URL
        worker.close()
        woken = threading.Event()
        listener = Listener(settings, DIRECT_URL, woken)
        listener.start()
        try:
            assert listener.connected.wait(10)
            # Its session is on Postgres itself, listening, beside PgBouncer's server connections.
            row = admin.execute(
                "SELECT query FROM pg_stat_activity WHERE application_name = %s",
                (f"connector-sync/{schema}/listen",),
            ).fetchone()
            assert row is not None and row["query"].startswith("LISTEN")
            woken.clear()
            ws = engine.create_workspace("acme")
            conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
            engine.sync(conn.id)  # its NOTIFY goes through PgBouncer, and is heard directly
            assert woken.wait(10)
        finally:
            listener.stop()
