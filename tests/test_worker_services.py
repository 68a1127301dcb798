"""The worker's long-lived parts: LISTEN wakes it, survives a dropped connection, a failing stage
skips nothing, heartbeats keep coming and schedules keep being enqueued while a run executes, a
failing service logs, counts and carries on, a dead service thread is started again, and N workers
asking for a fleet task at the same moment run it once per interval. Nothing sleeps: tests wait on
the services' signals."""

from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Any

import pytest

from sync import Engine
from sync.queues import queue_spec
from sync.store.db import listen_url
from sync.worker import Listener
from sync.worker.services import FleetTask, ScheduleEnqueuer, Service
from tests.conftest import make_settings
from tests.test_sync_flow import items, new_dataset


def test_listen_wakes_the_worker_and_resubscribes_after_a_drop(engine: Engine, admin: Any) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    wake = threading.Event()
    # Postgres itself, also behind PgBouncer (CONNECTOR_SYNC_LISTEN_URL).
    url = listen_url(engine.settings, engine.url)
    assert url is not None
    listener = Listener(engine.settings, url, wake)
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
        assert listener.lost.wait_for(1)
        assert listener.connected.wait(10)
        wake.clear()
        engine.cancel_run(run.id)
        engine.sync(conn.id)
        assert wake.wait(10)
    finally:
        listener.stop()
    assert not listener.alive


def test_stop_ends_a_listener_waiting_for_a_notification(engine: Engine) -> None:
    """stop() ends the wait at once, not at the next liveness check (ten minutes here): a
    cancel request does not reach a session waiting with no statement running."""
    settings = engine.settings.model_copy(update={"listen_check_interval": 600.0})
    url = listen_url(settings, engine.url)
    assert url is not None
    listener = Listener(settings, url, threading.Event())
    listener.start()
    try:
        assert listener.connected.wait(10)
    finally:
        listener.stop()
    assert not listener.alive
    assert listener.failures == 0


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


def blocked_run(engine: Engine) -> tuple[int, threading.Event, threading.Event]:
    """A queued sync whose first row waits until ``release`` is set; ``started`` is set when it
    has begun (the run is running, with its lease)."""
    key, data = new_dataset(items=items(*range(3)))
    started, release = threading.Event(), threading.Event()

    def hold(index: int) -> None:
        if index == 0:
            started.set()
            assert release.wait(60), "the test never released the run"

    data.before_row["items"] = hold
    ws = engine.create_workspace("acme")
    conn = engine.create_connection(ws.id, "mem", "memory", config={"dataset": key})
    return engine.sync(conn.id).id, started, release


def test_heartbeats_continue_while_a_run_executes(schema: str, admin: Any) -> None:
    settings = make_settings(schema, heartbeat_interval=0.2, control_interval=0.1)
    with Engine(settings) as engine:
        engine.migrate()
        run_id, started, release = blocked_run(engine)
        worker = engine.worker(worker_id="beating", listen=False)
        thread = threading.Thread(target=worker.poll)
        thread.start()
        try:
            assert started.wait(30)
            beats = worker.heartbeat.signals.ran
            assert beats.wait_for(beats.count + 1)
            first = admin.execute("SELECT heartbeat_at, current_run_id FROM workers").fetchone()
            assert first["current_run_id"] == run_id
            assert beats.wait_for(beats.count + 1)  # the lease keeper's thread sends them
            later = admin.execute(
                "SELECT heartbeat_at > %s AS later FROM workers", (first["heartbeat_at"],)
            ).fetchone()
            assert later["later"]
            assert engine.run(run_id).status == "running"
        finally:
            release.set()
            thread.join(30)
        assert engine.run(run_id).status == "succeeded"


def test_schedules_are_enqueued_while_a_long_run_executes(schema: str, admin: Any) -> None:
    """The loop runs the schedule enqueuer on its own timer: a run that takes hours does not
    keep a due connection waiting for it to end."""
    settings = make_settings(schema, schedule_interval=0.05, poll_interval=0.05)
    with Engine(settings) as engine:
        engine.migrate()
        run_id, started, release = blocked_run(engine)
        key, _ = new_dataset(items=items(1))
        ws = engine.create_workspace("other")
        due = engine.create_connection(
            ws.id, "hourly", "memory", config={"dataset": key}, schedule_every=3600
        )
        admin.execute("UPDATE connections SET next_run_at = NULL WHERE id = %s", (due.id,))
        worker = engine.worker(listen=False)
        loop = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        loop.start()
        try:
            assert started.wait(30)
            admin.execute(
                "UPDATE connections SET next_run_at = now() - interval '1 second' WHERE id = %s",
                (due.id,),
            )
            scans = worker.schedules.signals.ran
            assert scans.wait_for(scans.count + 2)  # a scan that began after the update
            queued = engine.runs(connection_id=due.id)
            assert [(r.status, r.trigger) for r in queued] == [("queued", "schedule")]
            assert engine.run(run_id).status == "running"
        finally:
            release.set()
            worker.stop()
            loop.join(30)
        assert not any(service.alive for service in worker.services)


class Counting(Service[int]):
    """A service whose work fails while ``failing`` is set."""

    name = "counting"

    def __init__(self, clock: Any) -> None:
        super().__init__(interval=10.0, max_backoff=30.0, clock=clock)
        self.calls = 0
        self.failing = False

    def _run(self) -> int:
        self.calls += 1
        if self.failing:
            raise RuntimeError("down")
        return self.calls


def test_a_service_runs_when_its_interval_has_passed_and_backs_off_while_it_fails() -> None:
    now = [0.0]
    service = Counting(clock=lambda: now[0])
    assert service.run_if_due() and service.calls == 1  # never ran: due at once
    now[0] = 9.9
    assert not service.run_if_due()
    now[0] = 10.0
    assert service.run_if_due() and service.calls == 2

    # Failing, it is retried after 1, 2, 4... s up to max_backoff, but never sooner than its
    # interval: here the interval wins until the backoff passes it.
    service.failing = True
    failed_at = []
    for _ in range(7):
        with pytest.raises(RuntimeError):
            while not service.run_if_due():
                now[0] += 0.5
        failed_at.append(now[0])
    gaps = [b - a for a, b in zip([10.0, *failed_at], failed_at, strict=False)]
    assert gaps == [10.0, 10.0, 10.0, 10.0, 10.0, 16.0, 30.0]
    assert service.failures == 7 and service.signals.failed.count == 7
    service.failing = False
    now[0] += 30.0
    assert service.run_if_due() and service.run_if_due() is False  # back to its interval
    assert service.signals.ran.count == 3


def test_every_service_of_a_worker_serving_queues_runs_once_per_interval(schema: str) -> None:
    """Each of the worker's services, the queues' cron too, does its work once and then waits
    its interval: asked again at once, it does nothing (a service that forgot when it ran would
    query the database in a tight loop on its own thread)."""
    settings = make_settings(schema, lanes="mail=1")
    with Engine(settings, pool_size=4) as engine:
        engine.migrate()
        engine.queues.declare_queue(queue_spec("mail"))
        engine.queues.register("mail", lambda job, abort: None)
        worker = engine.worker(listen=False)
        try:
            names = {service.name for service in worker.services}
            assert "queue cron" in names
            for service in worker.services:
                assert service.interval >= 1.0, service.name
                ran = service.signals.ran.count
                service.run_once()
                assert not service.run_if_due(), service.name
                assert service.signals.ran.count == ran + 1, service.name
        finally:
            worker.close()


def test_a_failing_service_logs_counts_and_carries_on(
    schema: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(schema, schedule_interval=0.01, max_backoff=0.05)
    service = ScheduleEnqueuer(engine.pool, settings)
    real = service._run
    calls = 0

    def flaky() -> int:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("the scan exploded")
        return real()

    service._run = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="sync.worker.services"):
        service.start()
        try:
            assert service.signals.ran.wait_for(1)
        finally:
            service.stop()
    assert not service.alive
    assert service.failures == 2 and service.signals.failed.count == 2
    assert caplog.text.count("schedules failed") == 2
    assert "the scan exploded" in caplog.text


def test_the_loop_starts_a_dead_service_thread_again(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(schema, sweep_interval=0.05, poll_interval=0.05)
    with Engine(settings) as engine:
        engine.migrate()
        worker = engine.worker(listen=False)
        sweeper = worker.sweeper
        real = sweeper._loop
        deaths = 0

        def dying() -> None:
            nonlocal deaths
            if deaths == 0:
                deaths += 1
                return  # the thread ends, whatever the reason
            real()

        sweeper._loop = dying  # type: ignore[method-assign]
        loop = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        with caplog.at_level(logging.ERROR, logger="sync.worker"):
            loop.start()
            try:
                assert sweeper.signals.ran.wait_for(1)
            finally:
                worker.stop()
                loop.join(30)
        assert deaths == 1
        assert "the sweeper thread died; restarting it" in caplog.text


@pytest.mark.parametrize("task", ["cleaner", "sweeper"])
def test_n_workers_asking_at_the_same_moment_run_a_fleet_task_once_per_interval(
    engine: Engine, admin: Any, task: str
) -> None:
    workers = [engine.worker(worker_id=f"{task}-{i}", listen=False) for i in range(8)]
    try:
        ask_at_once(admin, workers, task)
    finally:
        for worker in workers:
            worker.close()


def ask_at_once(admin: Any, workers: list[Any], task: str) -> None:
    services: list[FleetTask] = [getattr(w, task) for w in workers]
    name = services[0].task
    for interval in range(4):
        results: list[Any] = [None] * len(services)
        barrier = threading.Barrier(len(services))

        def ask(i: int, barrier: threading.Barrier, results: list[Any]) -> None:
            barrier.wait()
            results[i] = services[i].run_once()

        threads = [
            threading.Thread(target=ask, args=(i, barrier, results)) for i in range(len(services))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        ran = [i for i, result in enumerate(results) if result is not None]
        assert len(ran) == 1, (interval, results)
        marker = admin.execute(
            "SELECT worker_id, finished_at IS NOT NULL AS done, result FROM maintenance_runs "
            "WHERE task = %s",
            (name,),
        ).fetchone()
        assert marker["worker_id"] == workers[ran[0]].id and marker["done"]
        assert marker["result"] == results[ran[0]]
        # Within the same interval, nobody runs it again.
        assert all(service.run_once() is None for service in services)
        # The interval passes.
        admin.execute(
            "UPDATE maintenance_runs SET last_run_at = now() - interval '1 day' WHERE task = %s",
            (name,),
        )


def test_in_the_loop_a_finish_claims_the_next_run_in_the_same_round_trip(engine: Engine) -> None:
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    first, second, third = (
        engine.create_connection(ws.id, name, provider, config={"dataset": key})
        for name, provider in (("a", "memory"), ("b", "memory_events"), ("c", "memory"))
    )
    runs = [engine.sync(c.id) for c in (first, second, third)]
    worker = engine.worker(listen=False)
    worker.slot("run").kind.start()  # what run() does

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


def test_polling_through_a_backlog_of_runs_looks_for_other_work_once_a_second(
    engine: Engine,
) -> None:
    """A caller that polls (``worker --once``, tests) and runs a sync run at each poll does not
    pay an empty claim of every other slot (ingestions here) at each run: while the main slot
    runs units, the others look once per second; a poll that ran no run looks at once."""
    key, _ = new_dataset(items=items(1))
    ws = engine.create_workspace("acme")
    runs = 20
    connections = [
        engine.create_connection(ws.id, f"mem{i}", "memory", config={"dataset": key})
        for i in range(runs)
    ]
    for connection in connections:
        engine.sync(connection.id)
    worker = engine.worker(listen=False)
    try:
        ingestions = worker.slot("ingestion")
        began = time.monotonic()
        for _ in range(runs):
            assert worker.poll()
        elapsed = time.monotonic() - began
        assert worker.runs_executed == runs
        assert ingestions.claims <= 1 + int(elapsed), (ingestions.claims, elapsed)
        before = ingestions.claims
        assert not worker.poll()  # nothing left: every slot looks
        assert ingestions.claims == before + 1
    finally:
        worker.close()


def test_what_is_alive_when_a_worker_starts_is_left_out_of_full_collections(
    engine: Engine,
) -> None:
    """A worker's process keeps its libraries for its whole life: a full collection of the
    cyclic garbage collector that walked all of them stopped every lane meanwhile. What is
    alive when the worker starts is out of the collector's reach; what comes after is not."""
    before: list[object] = [[], "alive when the worker starts"]
    worker = engine.worker(listen=False)
    scans = worker.schedules.signals.ran
    loop = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    loop.start()
    try:
        assert scans.wait_for(1)
        after: list[object] = [[], "made while it runs"]
        walked = {id(o) for o in gc.get_objects()}
        assert id(before) not in walked
        assert id(after) in walked
    finally:
        worker.stop()
        loop.join(30)
        gc.unfreeze()
