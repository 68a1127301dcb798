"""Retry in place, dead-lettering, operator retry, cancel, and the schedule."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from connectors import AuthError, RateLimited, RetryableError
from sync import Conflict, Engine
from tests.fakes import DATASETS
from tests.test_sync_flow import items, new_dataset


def make_due(admin: Any, run_id: int) -> None:
    """Skip the backoff wait: the test is about what happens next, not about the clock."""
    admin.execute("UPDATE connection_runs SET queued_at = now() WHERE id = %s", (run_id,))


def queued_delay(admin: Any, run_id: int) -> float:
    row = admin.execute(
        "SELECT extract(epoch FROM queued_at - a.finished_at) AS delay "
        "FROM connection_runs r JOIN run_attempts a ON a.run_id = r.id "
        "WHERE r.id = %s ORDER BY a.id DESC LIMIT 1",
        (run_id,),
    ).fetchone()
    return float(row["delay"])


def test_retryable_failure_requeues_the_same_row_then_dead_letters(
    engine: Engine, admin: Any
) -> None:
    key, data = new_dataset(items=items(1, 2))
    data.failures["items"] = (1, RetryableError("upstream said 502"))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)

    expected_base = [5.0, 30.0]
    for attempt, base in enumerate(expected_base, start=1):
        assert worker.poll()
        now = engine.run(run.id)
        assert now.id == run.id and now.status == "queued" and now.attempts == attempt
        assert now.lease_owner is None
        assert now.error.kind == "retryable" and now.error.table == "items"
        # notes succeeded in attempt 1 and is not read again.
        assert now.results["notes"]["status"] == "succeeded"
        assert base * 0.8 - 0.01 <= queued_delay(admin, run.id) <= base * 1.2 + 0.01
        assert worker.poll() is False  # not due yet
        make_due(admin, run.id)

    assert DATASETS[key].reads.count("notes") == 1
    assert worker.poll()
    final = engine.run(run.id)
    assert final.status == "failed" and final.attempts == 3
    assert final.error.message.startswith("gave up after 3 attempt(s)")
    assert final.results["items"]["status"] == "failed"
    assert [a.outcome for a in engine.attempts(run.id)] == ["retry", "retry", "failed"]

    # The operator fixes upstream and retries the dead-lettered run: same row, queued again.
    del data.failures["items"]
    again = engine.retry_run(run.id)
    assert again.id == run.id and again.status == "queued" and again.max_attempts == 6
    assert worker.poll()
    done = engine.run(run.id)
    assert done.status == "succeeded" and done.attempts == 4
    assert len(engine.attempts(run.id)) == 4
    with pytest.raises(Conflict):
        engine.retry_run(run.id)


def test_a_cancelled_run_can_be_retried_like_a_failed_one(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1, 2))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.cancel_run(engine.sync(conn.id).id)
    assert run.status == "cancelled"
    again = engine.retry_run(run.id)
    assert (again.id, again.status, again.cancel_requested_at) == (run.id, "queued", None)
    assert engine.worker(listen=False).poll()
    assert engine.run(run.id).status == "succeeded"
    with pytest.raises(Conflict, match="only a failed or cancelled run can be retried"):
        engine.retry_run(run.id)


def test_a_retry_the_connection_cannot_take_says_what_to_do_first(engine: Engine) -> None:
    key, data = new_dataset(items=items(1))
    data.failures["items"] = (0, AuthError("401: the token was revoked"))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    assert engine.worker(listen=False).poll()
    assert engine.run(run.id).status == "failed"
    assert engine.connection(conn.id).status == "disconnected"
    with pytest.raises(Conflict, match=r"disconnected .*give it new ones .*then retry"):
        engine.retry_run(run.id)
    engine.pause(engine.update_credentials(conn.id, {"token": "new"}).id)
    with pytest.raises(Conflict, match=f"connection {conn.id} is paused; resume it, then retry"):
        engine.retry_run(run.id)
    engine.resume(conn.id)
    assert engine.retry_run(run.id).status == "queued"


def test_retry_after_overrides_the_backoff(engine: Engine, admin: Any) -> None:
    key, data = new_dataset(items=items(1))
    data.failures["items"] = (0, RateLimited("slow down", retry_after=600))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    worker = engine.worker(listen=False)
    assert worker.poll()
    now = engine.run(run.id)
    assert now.status == "queued"
    assert now.error.kind == "rate_limited"
    assert 599.9 <= queued_delay(admin, run.id) <= 600.1
    # The rate limit ended the attempt: the other table waits for the next one.
    assert now.results["notes"]["status"] == "pending"


def test_ten_concurrent_enqueues_make_one_run(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    barrier = threading.Barrier(10)
    ids: list[int] = []

    def enqueue() -> None:
        barrier.wait()
        ids.append(engine.sync(conn.id).id)

    threads = [threading.Thread(target=enqueue) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 10 and len(set(ids)) == 1
    assert len(engine.runs(connection_id=conn.id)) == 1


def test_cancel_a_queued_run_at_once(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    run = engine.sync(conn.id)
    cancelled = engine.cancel_run(run.id)
    assert cancelled.status == "cancelled" and cancelled.finished_at is not None
    assert engine.worker(listen=False).poll() is False
    with pytest.raises(Conflict):
        engine.cancel_run(run.id)


def test_cancel_a_running_run_ends_it_at_the_next_control_check(schema: str, admin: Any) -> None:
    from tests.conftest import make_settings

    settings = make_settings(schema, control_interval=0.5)
    with Engine(settings, pool_size=6) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(*range(1, 200)))
        started = threading.Event()
        worker = engine.worker(listen=False)

        def held(index: int) -> None:
            if index == 5:
                started.set()
                # The run stays at row 5 until its abort signal trips: only the lease keeper's
                # control read, finding the cancel request, can trip it here.
                (abort,) = worker._executor.running()
                assert abort.wait(30)

        data.before_row["items"] = held
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(
            ws.id, "mem", "memory", config={"dataset": key, "page_size": 5}
        )
        run = engine.sync(conn.id)
        thread = threading.Thread(target=worker.poll)
        thread.start()
        assert started.wait(10)
        engine.cancel_run(run.id)
        thread.join(30)
        final = engine.run(run.id)
        assert final.status == "cancelled"
        assert final.finished_at >= final.cancel_requested_at
        # What was written before the cancel is kept and reported; the rest was never read.
        assert final.results["items"]["status"] == "cancelled"
        assert 5 <= final.results["items"]["upserted"] < 199
        written = admin.execute("SELECT count(*) AS n FROM records").fetchone()["n"]
        assert written == final.results["items"]["upserted"]


def test_a_connection_six_hours_overdue_gets_exactly_one_run(engine: Engine, admin: Any) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "mem", "memory", config={"dataset": key}, schedule_every=15 * 60
    )
    admin.execute(
        "UPDATE connections SET next_run_at = now() - interval '6 hours' WHERE id = %s",
        (conn.id,),
    )
    worker = engine.worker(listen=False)
    assert worker.poll()  # enqueues the schedule and runs it
    assert worker.poll() is False
    runs = engine.runs(connection_id=conn.id)
    assert [(r.trigger, r.status) for r in runs] == [("schedule", "succeeded")]
    next_run = admin.execute(
        "SELECT extract(epoch FROM next_run_at - now()) AS s FROM connections WHERE id = %s",
        (conn.id,),
    ).fetchone()["s"]
    assert 14 * 60 < float(next_run) <= 15 * 60


def test_a_paused_connection_is_not_scheduled_nor_synced(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(
        ws.id, "mem", "memory", config={"dataset": key}, schedule_every=60
    )
    engine.pause(conn.id)
    assert engine.worker(listen=False).poll() is False
    with pytest.raises(Conflict, match="paused"):
        engine.sync(conn.id)
    engine.resume(conn.id)
    assert engine.worker(listen=False).poll() is True


def test_a_cancel_that_comes_while_the_run_finishes_is_said_in_the_run(schema: str) -> None:
    from tests.conftest import make_settings

    # The control read that would see the cancel is minutes away: the work ends first.
    with Engine(make_settings(schema, control_interval=300), pool_size=6) as engine:
        engine.migrate()
        key, data = new_dataset(items=items(1, 2, 3))
        ws = engine.create_workspace("acme")
        conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
        run = engine.sync(conn.id)
        # Asked for while the last row is read: the run is running, so the cancel is recorded.
        data.before_row["items"] = lambda index: index == 2 and engine.cancel_run(run.id)
        assert engine.worker(listen=False).poll()
        final = engine.run(run.id)
    assert final.status == "succeeded" and final.cancel_requested_at is not None
    assert final.cancel_came_late and final.to_json()["cancel_came_late"] is True
    assert final.error is None
