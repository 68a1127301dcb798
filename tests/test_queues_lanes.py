"""Lanes on the worker: a process serves only the queues its lanes name (no lanes, no handler
and no claim), runs a queue's jobs as many at once as it has lanes, holds every attempt's lease
with the worker's one lease keeper (so lanes holding every pooled connection never delay a
renewal), and a job whose worker was killed mid-attempt is taken back after its lease runs out
by another worker process, and completed once."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sync import Engine
from sync.errors import InvalidInput
from sync.jobs.lease import LeaseKeeper
from sync.queues import Abort, Job, JobStatus, QueuePolicy, queue_spec
from sync.queues.kind import Completions
from sync.queues.postgres import PostgresQueues
from sync.store.db import connect, listen_url
from sync.worker import Listener
from tests.conftest import make_settings
from tests.lanes_support import Lanes
from tests.test_lease_keeper import Ticks
from tests.waiting import poll_until, until

WAIT = 60.0


@pytest.fixture
def keeper(engine: Engine) -> Iterator[tuple[LeaseKeeper, Ticks]]:
    ticks = Ticks()
    url = engine.settings.database_url
    assert url is not None
    keeper = LeaseKeeper(engine.settings, lambda: connect(engine.settings, url), on_tick=ticks)
    yield keeper, ticks
    keeper.stop()


class Blocker:
    """A handler that holds a pooled connection until released (a slow job that keeps the
    pool busy), counting the jobs inside it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.release = threading.Event()
        self.inside = 0
        self.ran: list[int] = []
        self._cond = threading.Condition()

    def __call__(self, job: Job, abort: Abort) -> None:
        with self.engine.pool.connection() as conn:
            conn.execute("SELECT 1")
            with self._cond:
                self.inside += 1
                self.ran.append(job.id)
                self._cond.notify_all()
            assert self.release.wait(WAIT)

    def wait_inside(self, count: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.inside >= count, WAIT), self.inside


def _finish(blocker: Blocker, queues: PostgresQueues, lanes: Lanes, ids: list[int]) -> None:
    """Let the blocked handlers return and wait until every job is completed."""
    blocker.release.set()
    until(
        lambda: all(queues.get_job(i).status is JobStatus.COMPLETED for i in ids),
        lanes.completions.flushed,
    )


def test_a_process_without_lanes_registers_no_handler_and_claims_nothing(
    engine: Engine, admin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.queues.declare_queue(queue_spec("docs.ingest"))
    job_id = engine.queues.send("docs.ingest", {"doc": 1})
    setups: list[str] = []
    monkeypatch.setattr("sync.api.install_handlers", lambda q, apps: setups.append("called"))

    worker = engine.worker(worker_id="replica", listen=False)
    try:
        assert [s for s in worker.slots if s.kind.name == "job"] == []
        assert worker.poll() is False
    finally:
        worker.close()
    assert setups == []
    assert engine.queues.get_job(job_id).status is JobStatus.QUEUED
    assert [w.lanes for w in engine.workers()] == [None]


def test_lanes_zero_claims_nothing_while_the_other_queue_runs(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks]
) -> None:
    settings = engine.settings.model_copy(update={"poll_interval": 0.05})
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.ingest"))
    queues.declare_queue(queue_spec("docs.other"))
    ran: list[str] = []
    queues.register("docs.ingest", lambda job, abort: ran.append("ingest"))
    queues.register("docs.other", lambda job, abort: ran.append("other"))
    waiting = queues.send("docs.ingest", {})  # older: a claim of both queues would take it
    done = queues.send("docs.other", {})

    lanes = Lanes(queues, {"docs.ingest": 0, "docs.other": 1}, keeper[0], settings)
    assert lanes.served == {"docs.other": 1}
    lanes.start()
    try:
        until(lambda: queues.get_job(done).status is JobStatus.COMPLETED, lanes.completions.flushed)
        assert lanes.wait_for_claims(lanes.claims + 5)  # it went on claiming: nothing more
    finally:
        lanes.stop()
    assert ran == ["other"]
    job = queues.get_job(waiting)
    assert (job.status, job.attempts) == (JobStatus.QUEUED, 0)


def test_lanes_for_a_queue_without_a_handler_are_refused(engine: Engine) -> None:
    settings = engine.settings.model_copy(update={"lanes": "docs.ingest=2"})
    with Engine(settings, pool_size=3) as configured, pytest.raises(InvalidInput) as exc:
        configured.worker(worker_id="w", listen=False)
    assert "no handler" in str(exc.value) and "\n" not in str(exc.value)


def test_full_lanes_with_slow_handlers_never_miss_a_renewal(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks], admin: Any
) -> None:
    # Leases of 3 s renewed every second; 12 lanes, more than the pool's 10 connections, each
    # handler holding a pooled connection for several lease lengths.
    settings = engine.settings.model_copy(update={"lease_seconds": 3.0, "control_interval": 0.2})
    keeper_, ticks = keeper
    queues = PostgresQueues(engine.pool, lease=settings.lease_seconds)
    queues.declare_queue(queue_spec("docs.slow", expire=600))
    blocker = Blocker(engine)
    queues.register("docs.slow", blocker)
    ids = [queues.send("docs.slow", {"n": n}) for n in range(10)]

    lanes = Lanes(queues, {"docs.slow": 12}, keeper_, settings)
    lanes.start()
    try:
        blocker.wait_inside(10)  # the pool is exhausted by the handlers
        before = keeper_.renewals.get("job", 0)
        # Each lease renewed at least 4 times: over 4 s, longer than a lease, with every pooled
        # connection held.
        ticks.wait_until(lambda: keeper_.renewals.get("job", 0) >= before + 40, rounds=100_000)
        stale = admin.execute(
            "SELECT count(*) AS n FROM jobs WHERE status = 'active' AND expires_at <= now()"
        ).fetchone()["n"]
        # Another worker's claim (on a connection of its own) finds nothing to take back.
        taken = admin.execute(
            "SELECT id FROM claim_jobs_v2(ARRAY['docs.slow'], 10, 3.0, NULL)"
        ).fetchall()
        _finish(blocker, queues, lanes, ids)
    finally:
        blocker.release.set()
        lanes.stop()
    assert stale == 0 and taken == []
    assert keeper_.losses.get("job", 0) == 0
    assert sorted(blocker.ran) == ids
    assert {queues.get_job(i).attempts for i in ids} == {1}
    outcomes = admin.execute("SELECT DISTINCT outcome FROM job_attempts").fetchall()
    assert [r["outcome"] for r in outcomes] == ["completed"]


def test_an_exclusive_queue_claims_one_job_at_a_time(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks]
) -> None:
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("sources.sync", policy=QueuePolicy.EXCLUSIVE))
    blocker = Blocker(engine)
    queues.register("sources.sync", blocker)
    ids = [queues.send("sources.sync", {}, key=f"source-{n}") for n in range(3)]
    lanes = Lanes(queues, {"sources.sync": 3}, keeper[0], engine.settings)
    lanes.start()
    try:
        blocker.wait_inside(3)
        claims = lanes.claims
        _finish(blocker, queues, lanes, ids)
    finally:
        blocker.release.set()
        lanes.stop()
    assert claims >= 3  # one claim per job: never a batch


def test_a_standard_queue_claims_the_jobs_for_its_idle_lanes_in_one_batch(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks]
) -> None:
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.ingest"))
    blocker = Blocker(engine)
    queues.register("docs.ingest", blocker)
    ids = [queues.send("docs.ingest", {"doc": n}) for n in range(3)]
    lanes = Lanes(queues, {"docs.ingest": 3}, keeper[0], engine.settings)
    lanes.start()
    try:
        blocker.wait_inside(3)
        started = {queues.get_job(i).started_at for i in ids}
        _finish(blocker, queues, lanes, ids)
    finally:
        blocker.release.set()
        lanes.stop()
    # One claim statement took all three: they share its transaction's now().
    assert len(started) == 1, started


def test_lanes_of_a_batch_handler_each_claim_and_complete_a_batch_in_one_statement(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks], admin: Any
) -> None:
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.embed"))
    release = threading.Event()
    batches: list[list[int]] = []
    cond = threading.Condition()

    def embed(jobs: list[Job], abort: Abort) -> None:
        with cond:
            batches.append([job.id for job in jobs])
            cond.notify_all()
        assert release.wait(WAIT)

    queues.register_batch("docs.embed", embed, size=4)
    ids = [queues.send("docs.embed", {"doc": n}) for n in range(8)]
    lanes = Lanes(queues, {"docs.embed": 2}, keeper[0], engine.settings)
    lanes.start()
    try:
        with cond:  # both lanes inside the handler at once, each with a batch of its own
            assert cond.wait_for(lambda: len(batches) == 2, WAIT), batches
        release.set()
        until(
            lambda: all(queues.get_job(i).status is JobStatus.COMPLETED for i in ids),
            lanes.completions.flushed,
        )
    finally:
        release.set()
        lanes.stop()
    assert sorted(len(b) for b in batches) == [4, 4]
    assert sorted(i for b in batches for i in b) == ids
    rows = admin.execute(
        "SELECT j.id, j.started_at, a.finished_at, a.outcome FROM jobs j "
        "JOIN job_attempts a ON a.job_id = j.id"
    ).fetchall()
    by_job = {r["id"]: r for r in rows}
    assert {r["outcome"] for r in rows} == {"completed"} and len(rows) == 8
    for batch in batches:
        # One claim statement started the batch and one statement completed it (the two
        # batches' completions may share one): each shares its transaction's now().
        assert len({by_job[i]["started_at"] for i in batch}) == 1
        assert len({by_job[i]["finished_at"] for i in batch}) == 1
    assert lanes.units_run == 2  # a batch each


class Batches:
    """A batch handler whose calls block until released, one by one, or until the worker stops
    (then it raises, as a handler that stopped early should); it keeps the most calls ever
    running at once."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.released = 0
        self.running = 0
        self.most = 0
        self.cond = threading.Condition()

    def __call__(self, jobs: list[Job], abort: Abort) -> None:
        with self.cond:
            self.running += 1
            self.most = max(self.most, self.running)
            self.calls.append([job.id for job in jobs])
            number = len(self.calls)
            self.cond.notify_all()
        try:
            with self.cond:
                released = self.cond.wait_for(lambda: self.released >= number or abort.is_set, WAIT)
            if abort.is_set or not released:
                raise RuntimeError("stopped before the batch was done")
        finally:
            with self.cond:
                self.running -= 1

    def wait_calls(self, count: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= count, WAIT), self.calls

    def release(self, count: int) -> None:
        with self.cond:
            self.released = count
            self.cond.notify_all()

    def look_again(self) -> None:
        """The abort signals may have changed: the calls waiting read them again."""
        with self.cond:
            self.cond.notify_all()


def _statuses(admin: Any) -> dict[str, int]:
    rows = admin.execute("SELECT status, count(*) AS n FROM jobs GROUP BY status").fetchall()
    return {r["status"]: r["n"] for r in rows}


@contextlib.contextmanager
def _second_batch_claimed(
    engine: Engine, keeper: LeaseKeeper, jobs: int
) -> Iterator[tuple[PostgresQueues, Batches, list[int], Lanes]]:
    """One lane of a batch handler of 4 over ``jobs`` jobs, its first batch running and the
    second claimed; every batch released and the lanes stopped at the end."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.embed"))
    handler = Batches()
    queues.register_batch("docs.embed", handler, size=4)
    ids = [queues.send("docs.embed", {"doc": n}) for n in range(jobs)]
    lanes = Lanes(queues, {"docs.embed": 1}, keeper, engine.settings)
    lanes.start()
    try:
        handler.wait_calls(1)
        assert lanes.wait_for_claims(2, WAIT), "no claim while the first batch ran"
        yield queues, handler, ids, lanes
    finally:
        handler.release(len(ids))
        lanes.stop()


def test_one_lane_of_a_batch_handler_has_the_next_batch_claimed_while_one_runs(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks], admin: Any
) -> None:
    """The lane starts the next batch as its handler returns, without waiting for a claim: the
    batch is claimed (and held) while the one before runs. Still one batch at a time."""
    with _second_batch_claimed(engine, keeper[0], 12) as (queues, handler, ids, lanes):
        assert _statuses(admin) == {"active": 8, "queued": 4}
        assert len(handler.calls) == 1  # the claimed batch waits for the lane
        handler.release(1)
        handler.wait_calls(2)
        handler.release(3)
        until(
            lambda: all(queues.get_job(i).status is JobStatus.COMPLETED for i in ids),
            lanes.completions.flushed,
        )
    assert handler.most == 1
    assert [i for call in handler.calls for i in call] == ids


def test_a_stopping_worker_hands_back_the_batch_claimed_ahead_without_spending_an_attempt(
    engine: Engine, keeper: tuple[LeaseKeeper, Ticks], admin: Any
) -> None:
    with _second_batch_claimed(engine, keeper[0], 8) as (_, handler, ids, lanes):
        lanes.executor.stop()  # as the worker does first when it stops
        handler.look_again()
    assert len(handler.calls) == 1
    rows = admin.execute("SELECT id, status, attempts FROM jobs ORDER BY id").fetchall()
    assert [(r["id"], r["status"], r["attempts"]) for r in rows] == [(i, "queued", 0) for i in ids]


def _spawn(schema: str, worker_id: str, lease: float) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DATABASE_URL": make_settings(schema).database_url or "",
        "CONNECTOR_SYNC_SCHEMA": schema,
        "CONNECTOR_SYNC_LANES": "probe.crash=1",
        "CONNECTOR_SYNC_LEASE_SECONDS": str(lease),
        "CONNECTOR_SYNC_CONTROL_INTERVAL": "0.2",
        "CONNECTOR_SYNC_POLL_INTERVAL": "0.2",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sync.cli",
            "worker",
            "--id",
            worker_id,
            "--app",
            "tests.queue_apps:crash",
        ],
        cwd=Path(__file__).parent.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_a_job_of_a_killed_worker_is_taken_back_after_its_lease_and_completed_once(
    engine: Engine, admin: Any, schema: str
) -> None:
    from tests.queue_apps import PROBE_TABLE, crash

    admin.execute(PROBE_TABLE)
    crash(engine.queues)  # declares probe.crash
    job_id = engine.queues.send("probe.crash", {"doc": "scan.pdf"})
    first = _spawn(schema, "worker-a", lease=2.0)
    second: subprocess.Popen[str] | None = None
    try:
        poll_until(
            lambda: admin.execute("SELECT count(*) AS n FROM probe_runs").fetchone()["n"] == 1,
            timeout=WAIT,
        )
        os.kill(first.pid, signal.SIGKILL)
        first.wait(WAIT)
        assert engine.queues.get_job(job_id).status is JobStatus.ACTIVE
        second = _spawn(schema, "worker-b", lease=2.0)
        poll_until(
            lambda: engine.queues.get_job(job_id).status is JobStatus.COMPLETED, timeout=WAIT
        )
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=WAIT)
    runs = admin.execute("SELECT attempt, what, pid FROM probe_runs ORDER BY at").fetchall()
    assert [(r["attempt"], r["what"]) for r in runs] == [
        (1, "started"),
        (2, "started"),
        (2, "completed"),
    ]
    assert runs[0]["pid"] == first.pid and second is not None and runs[2]["pid"] == second.pid
    attempts = engine.queues.attempts(job_id)
    assert [a.outcome.value if a.outcome else None for a in attempts] == ["expired", "completed"]
    started = attempts[1].started_at
    assert attempts[0].finished_at == started  # taken back by the claim that started attempt 2


def test_a_job_sent_wakes_the_lanes_of_its_queue_only(engine: Engine) -> None:
    engine.queues.declare_queue(queue_spec("docs.a"))
    engine.queues.declare_queue(queue_spec("docs.b"))
    woken: queue.Queue[str | None] = queue.Queue()
    runs_wake = threading.Event()
    url = listen_url(engine.settings, engine.url)  # Postgres itself, also behind PgBouncer
    assert url is not None
    listener = Listener(engine.settings, url, runs_wake, on_job=woken.put)
    listener.start()
    try:
        assert woken.get(timeout=WAIT) is None  # connected: every lane looks once
        runs_wake.clear()
        engine.queues.send("docs.a", {})
        engine.queues.send("docs.a", {}, start_after=timedelta(hours=1))  # not due: no wake
        engine.queues.send("docs.b", {})
        assert [woken.get(timeout=WAIT), woken.get(timeout=WAIT)] == ["docs.a", "docs.b"]
    finally:
        listener.stop()
    assert woken.empty()
    assert not runs_wake.is_set()  # the syncs' loop was not woken by the jobs


def test_completions_wait_for_others_to_share_their_statement(engine: Engine) -> None:
    """A completion waits up to the delay for others to join it (a long one here): three
    attempts handed over one after another are written by one statement, and stopping writes
    what is pending at once."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("docs.ingest"))
    queues.register("docs.ingest", lambda job, abort: None)
    ids = [queues.send("docs.ingest", {"doc": n}) for n in range(3)]
    attempts = queues.claim(["docs.ingest"], 3)
    assert sorted(a.job.id for a in attempts) == ids

    completions = Completions(queues, delay=3600.0)
    try:
        completions.submit_many([attempts[0]])
        assert completions.collecting.wait_for(1)  # the first came; the thread waits for more
        completions.submit_many([attempts[1]])
        completions.submit_many([attempts[2]])
    finally:
        completions.stop()
    assert completions.flushes == 1
    assert all(queues.get_job(i).status is JobStatus.COMPLETED for i in ids)
