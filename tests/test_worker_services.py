"""The worker's long-lived parts: LISTEN wakes it, survives a dropped connection, a failing stage
skips nothing, and heartbeats keep coming while a run executes."""

from __future__ import annotations

import threading
import time
from typing import Any

from sync import Engine
from sync.worker import Listener
from tests.conftest import make_settings
from tests.test_fencing import wait_for
from tests.test_sync_flow import items, new_dataset


def test_listen_wakes_the_worker_and_resubscribes_after_a_drop(engine: Engine, admin: Any) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    wake = threading.Event()
    listener = Listener(engine.settings, engine.url, wake)
    listener.start()
    try:
        assert listener.connected.wait(10)
        wake.clear()
        run = engine.sync(conn.id)
        assert wake.wait(10)

        # Drop the LISTEN connection: it comes back and hears the next notification.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"connector-sync/{engine.settings.schema_name}/listen",),
        )
        wait_for(lambda: listener.failures >= 1)
        assert listener.connected.wait(10)
        wake.clear()
        engine.cancel_run(run.id)
        engine.sync(conn.id)
        assert wake.wait(10)
    finally:
        listener.stop()
    assert not listener.alive


def test_a_failing_stage_skips_no_other(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)

    def broken() -> bool:
        raise RuntimeError("heartbeat exploded")

    worker._stages[0] = ("heartbeat", broken)
    assert worker.poll() is True
    assert engine.run(run.id).status == "succeeded"
    assert worker.stage_failures == {"heartbeat": 1}


def test_heartbeats_continue_while_a_run_executes(schema: str, admin: Any) -> None:
    settings = make_settings(schema, heartbeat_interval=0.2, control_interval=0.1)
    with Engine(settings) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(*range(30)))
        data.before_row["items"] = lambda index: time.sleep(0.05)
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        run = engine.sync(conn.id)
        worker = engine.worker(worker_id="beating", listen=False)
        thread = threading.Thread(target=worker.poll)
        thread.start()
        try:
            seen = wait_for(
                lambda: admin.execute(
                    "SELECT heartbeat_at FROM workers WHERE current_run_id = %s", (run.id,)
                ).fetchone()
            )
            wait_for(
                lambda: admin.execute(
                    "SELECT heartbeat_at > %s AS later FROM workers", (seen["heartbeat_at"],)
                ).fetchone()["later"]
            )
            assert engine.run(run.id).status == "running"
        finally:
            thread.join(30)
        assert engine.run(run.id).status == "succeeded"


def test_in_the_loop_a_finish_claims_the_next_run_in_the_same_round_trip(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    first, second, third = (
        engine.create_connection(ws.id, name, provider, config={"dataset": key})
        for name, provider in (("a", "memory"), ("b", "memory_events"), ("c", "memory"))
    )
    runs = [engine.sync(c.id) for c in (first, second, third)]
    worker = engine.worker(listen=False)
    worker._continuous = True  # what run() sets

    assert worker.poll()
    assert engine.run(runs[0].id).status == "succeeded"
    prefetched = engine.run(runs[1].id)
    assert prefetched.status == "running" and prefetched.worker_id == worker.id
    assert engine.run(runs[2].id).status == "queued"

    assert worker.poll()  # executes the prefetched run, and claims the third as it finishes
    assert engine.run(runs[1].id).status == "succeeded"
    assert engine.run(runs[1].id).attempts == 1
    assert engine.run(runs[2].id).status == "running"

    worker.close()  # the claimed-but-not-started run goes back without spending an attempt
    back = engine.run(runs[2].id)
    assert back.status == "queued" and back.attempts == 0
    assert [a.outcome for a in engine.attempts(back.id)] == ["handed_back"]
