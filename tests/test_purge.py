"""Purge-on-delete: the connection's data goes in bounded batches, behind any running sync."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from sync import Conflict, Engine, NotFound
from tests.conftest import make_settings
from tests.test_sync_flow import items, new_dataset, sync_once


def counts(admin: Any, connection_id: int) -> tuple[int, int, int]:
    row = admin.execute(
        "SELECT (SELECT count(*) FROM records WHERE connection_id = %(c)s) AS records, "
        "(SELECT count(*) FROM table_state WHERE connection_id = %(c)s) AS state, "
        "(SELECT count(*) FROM connections WHERE id = %(c)s) AS conn",
        {"c": connection_id},
    ).fetchone()
    return row["records"], row["state"], row["conn"]


def test_delete_purges_in_batches_and_keeps_history(schema: str, admin: Any) -> None:
    settings = make_settings(schema, purge_batch_size=7)
    with Engine(settings) as engine:
        engine.migrate()
        key, _ = new_dataset(items=items(*range(50)))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        other = engine.create_connection(ws.id, "other", "memory", config={"dataset": key})
        first = sync_once(engine, conn.id)
        sync_once(engine, other.id)
        assert counts(admin, conn.id) == (50, 2, 1)

        purge = engine.delete_connection(conn.id)
        assert purge.kind == "purge" and purge.status == "queued"
        assert engine.delete_connection(conn.id).id == purge.id  # idempotent
        with pytest.raises(Conflict):
            engine.sync(conn.id)
        assert engine.worker(listen=False).poll()

        done = engine.run(purge.id)
        assert done.status == "succeeded" and done.processed_units == 50
        assert counts(admin, conn.id) == (0, 0, 0)
        assert engine.run(first.id).connection_id is None  # history stays readable
        assert engine.run(first.id).status == "succeeded"
        assert counts(admin, other.id) == (50, 2, 1)  # the neighbour is untouched
        with pytest.raises(NotFound):
            engine.connection(conn.id)


def test_delete_cancels_a_queued_sync(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    sync = engine.sync(conn.id)
    purge = engine.delete_connection(conn.id)
    assert purge.status == "queued"
    assert engine.run(sync.id).status == "cancelled"
    assert engine.worker(listen=False).poll()
    assert engine.run(purge.id).status == "succeeded"


def test_purge_waits_behind_a_running_sync_then_runs(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(*range(40)))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key, "page_size": 5})
    started, release = threading.Event(), threading.Event()

    def hold(index: int) -> None:
        if index == 10:
            started.set()
            assert release.wait(30)

    data.before_row["items"] = hold
    sync = engine.sync(conn.id)
    busy = engine.worker(listen=False)
    thread = threading.Thread(target=busy.poll)
    thread.start()
    assert started.wait(10)

    purge = engine.delete_connection(conn.id)
    assert purge.status == "waiting"
    # Another worker finds nothing to do: the purge drains behind the in-flight sync.
    other = engine.worker(listen=False)
    assert other.poll() is False
    assert engine.run(purge.id).status == "waiting"

    release.set()
    thread.join(30)
    assert engine.run(sync.id).status == "succeeded"
    assert other.poll() is True
    assert engine.run(purge.id).status == "succeeded"
    assert counts(admin, conn.id) == (0, 0, 0)
    # The purge started only after the sync had finished.
    row = admin.execute(
        "SELECT (SELECT finished_at FROM run_attempts WHERE run_id = %s) AS sync_end, "
        "(SELECT started_at FROM run_attempts WHERE run_id = %s) AS purge_start",
        (sync.id, purge.id),
    ).fetchone()
    assert row["sync_end"] <= row["purge_start"]
