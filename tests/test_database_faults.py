"""Database faults: a lock held too long, a connection that drops, a database that goes away
and comes back. The worker retries, backs off and carries on; runs are not failed for it."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import sync.store.db
from sync import Engine
from tests.conftest import DIRECT_URL, direct_only, make_settings
from tests.test_sync_flow import items, live, new_dataset, sync_once


def test_a_lock_timeout_is_retried_in_place_not_failed(schema: str, admin: Any) -> None:
    settings = make_settings(schema, lock_timeout=0.2)
    with Engine(settings) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(1, 2))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        sync_once(engine, conn.id)
        data.tables["items"] = items(1, 2, version="v2")

        # Another session holds row 1 locked for a while; the writer's upsert times out on
        # the lock, waits, and repeats the statement until the lock is gone.
        with psycopg.connect(DIRECT_URL, options=f"-c search_path={schema}") as blocker:
            blocker.execute("SELECT 1 FROM records WHERE external_id = '1' FOR UPDATE")
            threading.Timer(0.6, blocker.rollback).start()
            run = sync_once(engine, conn.id)
        assert run.status == "succeeded" and run.attempts == 1
        assert {r["version"] for r in live(admin, conn.id).values()} == {"v2"}


@direct_only(
    "PgBouncer replaces a server connection cut while idle, so the worker never meets a dead "
    "one; a fleet behind it sees the database go away only when PgBouncer cannot reconnect"
)
def test_the_worker_backs_off_while_the_database_is_away_and_carries_on(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pooled connections are not checked before use here, however long a loaded machine takes
    # between the cut and the poll: the poll itself must meet the dead connections.
    monkeypatch.setattr(sync.store.db, "CHECK_AFTER_IDLE", float("inf"))
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    worker = engine.worker(listen=False)
    assert worker.idle_wait() == engine.settings.poll_interval

    # Every connection the worker holds is cut, twice in a row: once the pool has replaced the
    # connections it found broken, or the second poll would get a fresh one.
    def cut() -> None:
        engine.pool.wait(timeout=10)
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
            (f"connector-sync/{engine.settings.schema_name}%",),
        )

    with engine.pool.connection() as a, engine.pool.connection() as b:
        a.execute("SELECT 1")
        b.execute("SELECT 1")
    cut()
    worker.poll()
    cut()
    worker.poll()
    assert worker.database_failures >= 1
    assert worker.idle_wait() > engine.settings.poll_interval

    # The database is back. From here on every checkout is checked first, as in production (a
    # connection idle for over a second is): the dead connections the polls did not meet are
    # replaced, however many stages there were to meet them.
    monkeypatch.setattr(sync.store.db, "CHECK_AFTER_IDLE", 0.0)
    run = engine.sync(conn.id)  # the pool reconnects on its own
    assert worker.poll()
    assert engine.run(run.id).status == "succeeded"
    assert worker.database_failures == 0
