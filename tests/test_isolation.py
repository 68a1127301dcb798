"""One workspace's API can never read or change another's connections or runs; names that look
like SQL are only names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sync import Engine, InvalidInput, NotFound
from tests.test_sync_flow import items, new_dataset, sync_once


def test_a_scoped_engine_sees_and_touches_only_its_workspace(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1, 2))
    mine, theirs = engine.create_workspace("mine"), engine.create_workspace("theirs")
    my_conn = engine.create_connection(mine.id, "c", "memory", config={"dataset": key})
    their_conn = engine.create_connection(theirs.id, "c", "memory", config={"dataset": key})
    their_run = sync_once(engine, their_conn.id)
    their_failed = engine.sync(their_conn.id)

    me = engine.scoped(mine.id)
    assert [c.id for c in me.connections()] == [my_conn.id]
    assert [w.id for w in me.workspaces()] == [mine.id]
    assert me.runs() == []

    attempts: dict[str, Callable[[], Any]] = {
        "connection": lambda: me.connection(their_conn.id),
        "sync": lambda: me.sync(their_conn.id),
        "pause": lambda: me.pause(their_conn.id),
        "resume": lambda: me.resume(their_conn.id),
        "delete": lambda: me.delete_connection(their_conn.id),
        "credentials": lambda: me.update_credentials(their_conn.id, {"token": "x" * 10}),
        "run": lambda: me.run(their_run.id),
        "cancel": lambda: me.cancel_run(their_failed.id),
        "retry": lambda: me.retry_run(their_run.id),
        "workspace": lambda: me.workspace(theirs.id),
        "create_connection": lambda: me.create_connection(
            theirs.id, "x", "memory", config={"dataset": key}
        ),
        "list_their_connections": lambda: me.connections(theirs.id),
        "list_their_runs": lambda: me.runs(workspace_id=theirs.id),
    }
    for name, attempt in attempts.items():
        with pytest.raises(NotFound):
            print(name, attempt())  # reached only if the call wrongly succeeded
    assert me.attempts(their_run.id) == []
    assert me.records(their_conn.id) == []
    with pytest.raises(InvalidInput):
        me.worker()

    # Nothing of theirs changed.
    assert engine.connection(their_conn.id).status == "active"
    assert engine.run(their_failed.id).status == "queued"
    assert len(engine.records(their_conn.id)) == 2


@pytest.mark.parametrize(
    "name",
    [
        "'; DROP TABLE records; --",
        'x" OR 1=1 --',
        "$$; DELETE FROM connections; $$",
        "\\x00\\' \\\\",
        "名前 🚀",
    ],
)
def test_sql_looking_names_are_only_names(engine: Engine, admin: Any, name: str) -> None:
    key, _ = new_dataset(items=[{"id": name, "title": name}])
    ws = engine.create_workspace(name)
    conn = engine.create_connection(ws.id, name, "memory", config={"dataset": key})
    run = sync_once(engine, conn.id)
    assert run.status == "succeeded"
    assert engine.workspace(name).id == ws.id
    assert engine.connection(conn.id).name == name
    assert [r.external_id for r in engine.records(conn.id, "items")] == [name]
    intact = admin.execute(
        "SELECT (SELECT count(*) FROM connections) AS connections, "
        "(SELECT count(*) FROM records) AS records"
    ).fetchone()
    assert intact == {"connections": 1, "records": 1}
