"""Bad input gets a clear error on the run and loses nothing; the worker keeps serving."""

from __future__ import annotations

import threading
from typing import Any

import connectors
from connectors import Connector, Table, register
from sync import Engine
from sync.vocabulary import ErrorKind, JobError
from tests.conftest import direct_only
from tests.fakes import MemoryConfig
from tests.test_sync_flow import items, live, new_dataset, sync_once


class _Exploding(Connector):
    provider = "exploding"
    tables = (Table("items"),)
    config_model = MemoryConfig

    def read(self, table: Table) -> Any:
        yield {"id": 1}
        raise KeyError("surprise")


def test_a_worker_without_a_plugin_leaves_its_runs_queued_and_goes_on(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    vanishing = type("Vanishing", (_Exploding,), {"provider": "vanishing"})
    register(vanishing)
    ws = engine.create_workspace("acme")
    gone = engine.create_connection(ws.id, "gone", "vanishing", config={"dataset": key})
    good = engine.create_connection(ws.id, "good", "memory", config={"dataset": key})
    connectors.registry.unregister("vanishing")  # a worker without the plugin installed

    bad_run = engine.sync(gone.id)
    good_run = engine.sync(good.id)
    worker = engine.worker(listen=False)
    assert "vanishing" not in worker.providers
    assert worker.poll() and not worker.poll()  # the good run; the other is not its to take
    assert engine.run(good_run.id).status == "succeeded"
    waiting = engine.run(bad_run.id)
    assert (waiting.status, waiting.attempts) == ("queued", 0)
    assert engine.queued_without_worker() == [("vanishing", 1, bad_run.id)]

    # A worker started once the plugin is installed takes it.
    register(vanishing)
    try:
        able = engine.worker(listen=False)
        assert "vanishing" in able.providers
        assert engine.queued_without_worker() == []
        assert able.poll()
        assert engine.run(bad_run.id).attempts == 1
    finally:
        connectors.registry.unregister("vanishing")


def test_an_unexpected_exception_is_retried_with_a_clear_error(engine: Engine, admin: Any) -> None:
    register(_Exploding)
    try:
        key, _ = new_dataset()
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "x", "exploding", config={"dataset": key})
        run = sync_once(engine, conn.id)
        assert run.status == "queued"  # unexpected errors are retried, like River and Oban do
        assert run.error == JobError(
            ErrorKind.INTERNAL, "unexpected error: KeyError: 'surprise'", table="items"
        )
        # The row read before the error is kept.
        assert set(live(admin, conn.id)) == {"1"}
    finally:
        connectors.registry.unregister("exploding")


def test_a_record_without_its_primary_key_fails_the_table(engine: Engine, admin: Any) -> None:
    key, _data = new_dataset(items=[*items(1, 2), {"title": "no id"}, *items(3)])
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key, "page_size": 2})
    run = sync_once(engine, conn.id)
    assert run.status == "partial"
    assert run.results["items"]["status"] == "failed"
    assert run.results["items"]["error"] == {
        "kind": "record",
        "message": "a record of table 'items' has no primary key field 'id'",
    }
    assert set(live(admin, conn.id)) == {"1", "2"}  # the first page landed; nothing tombstoned


def test_strings_postgres_cannot_store_fail_the_table_clearly(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(
        items=[*items(1), {"id": 2, "title": "nul \u0000 inside"}],
        notes=[{"owner": "a", "n": 1, "text": "lone \ud800 surrogate"}],
    )
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = sync_once(engine, conn.id)
    assert run.status == "failed"
    assert "NUL character" in run.results["items"]["error"]["message"]
    assert run.results["notes"]["error"]["kind"] == "record"
    assert "surrogate" in run.results["notes"]["error"]["message"]
    # A literal backslash-u0000 text is fine, and so are integers beyond 64 bits.
    data.tables["items"] = [{"id": 1, "text": "\\u0000 is an escape", "big": 2**80}]
    data.tables["notes"] = []
    assert sync_once(engine, conn.id).status == "succeeded"
    assert live(admin, conn.id)["1"]["big"] == 2**80


@direct_only(
    "the test cuts the engine's own backends by their application_name; behind PgBouncer the "
    "server connections are PgBouncer's, and it replaces one cut while idle"
)
def test_a_database_that_goes_away_mid_run_gives_a_clear_error(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(*range(30)))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key, "page_size": 5})
    killed = threading.Event()

    def cut(index: int) -> None:
        if index == 10 and not killed.is_set():
            killed.set()
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (f"connector-sync/{engine.settings.schema_name}",),
            )

    data.before_row["items"] = cut
    engine.settings.batch_size = 5
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)
    assert worker.poll()
    assert killed.is_set()
    after = engine.run(run.id)
    assert after.status == "queued" and after.attempts == 1
    assert after.error.kind == "database"
    # Postgres says why if the session was idle when it was cut; if a batch was in flight on it
    # (the record writer's helper thread), libpq only sees the connection close.
    assert any(
        said in after.error.message
        for said in ("terminating connection", "server closed the connection unexpectedly")
    ), after.error
    # What was written before the cut is still there, and the worker carries on.
    assert len(live(admin, conn.id)) >= 5
    other = engine.sync(
        engine.create_connection(ws.id, "other", "memory", config={"dataset": key}).id
    )
    assert worker.poll()
    assert engine.run(other.id).status == "succeeded"


def test_a_bad_config_is_refused_at_creation_naming_the_field(engine: Engine) -> None:
    import pytest

    from sync import InvalidInput

    ws = engine.create_workspace("acme")
    with pytest.raises(InvalidInput) as raised:
        engine.create_connection(ws.id, "c", "memory", config={"dataset": "x", "page_size": "lots"})
    assert "page_size: Input should be a valid integer" in str(raised.value)
    with pytest.raises(InvalidInput, match="dataset: Field required"):
        engine.create_connection(ws.id, "c", "memory", config={})
    with pytest.raises(InvalidInput, match="no connector is registered for provider 'nope'"):
        engine.create_connection(ws.id, "c", "nope")
    assert engine.connections() == []
