"""A worker claims only syncs of the providers it has installed; any worker takes a purge, which
needs no connector. The claim itself, through the worker's own statement."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sync import Engine
from sync.store.queries import QUERIES
from tests.test_sync_flow import items, new_dataset


def claim(engine: Engine, providers: list[str] | None) -> dict[str, Any] | None:
    with engine.pool.connection() as conn:
        row: dict[str, Any] | None = conn.execute(
            QUERIES.claim_run,
            {
                "worker_id": "w",
                "lease": timedelta(minutes=1),
                "providers": providers,
                "wakeable": False,
            },
        ).fetchone()
        return row


def test_the_claim_takes_only_the_providers_given_and_any_purge(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    mem = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    events = engine.create_connection(ws.id, "ev", "memory_events", config={"dataset": key})
    mem_run, events_run = engine.sync(mem.id), engine.sync(events.id)

    assert claim(engine, ["filedata"]) is None  # neither is its provider
    taken = claim(engine, ["memory_events"])
    assert taken is not None and taken["id"] == events_run.id
    assert claim(engine, ["memory_events"]) is None  # the memory run is not its to take
    assert engine.run(mem_run.id).status == "queued"

    engine.cancel_run(mem_run.id)
    purge = engine.delete_connection(mem.id)
    assert purge.status == "queued"
    # A purge deletes rows and needs no connector: a worker without `memory` takes it (once the
    # running sync of the other provider leaves the workspace's purge lane free).
    with engine.pool.connection() as conn:
        conn.execute(
            "UPDATE connection_runs SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = %s",
            (events_run.id,),
        )
        conn.execute(
            "UPDATE connection_runs SET status = 'cancelled', lease_owner = NULL, "
            "lease_expires_at = NULL, finished_at = now() WHERE id = %s",
            (events_run.id,),
        )
    taken = claim(engine, ["filedata"])
    assert taken is not None and taken["id"] == purge.id
