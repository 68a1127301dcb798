"""The contract of the application queues' port: one behaviour suite, written against the port
alone, that every implementation runs. A test module subclasses :class:`QueuesContract` and
gives it a ``harness`` fixture (the implementation, its runner and a manual clock); the
in-memory implementation runs it in ``test_queues_contract.py``, and the Postgres one runs the
very same tests, so the two cannot drift apart.

Time moves only by ``clock.advance``; nothing sleeps. Tests marked ``concurrent`` hold only if
the implementation serializes concurrent callers correctly, and prove it with real threads."""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from sync.errors import Conflict, InvalidInput, NotFound
from sync.queues import (
    Abort,
    AttemptOutcome,
    Job,
    JobRunner,
    JobStatus,
    ManualClock,
    QueuePolicy,
    Queues,
    QueueSpec,
    Redrive,
    queue_spec,
)

# The longest any test waits for another thread to reach a point; only a broken
# implementation ever waits this long.
WAIT = 30.0
T = TypeVar("T")


@dataclass
class Transaction:
    """An open transaction of the application's, to send in: ``conn`` is what ``send`` takes."""

    conn: object
    commit: Callable[[], None]
    rollback: Callable[[], None]


@dataclass
class Harness:
    queues: Queues
    runner: JobRunner
    clock: ManualClock
    # An open transaction of the application's (a connection of its own, for Postgres).
    begin: Callable[[], Transaction]
    # Returns once a send waits for another transaction's key.
    until_blocked: Callable[[], None]

    def declare(self, name: str, **options: Any) -> QueueSpec:
        return self.queues.declare_queue(queue_spec(name, **options))

    def make_due(self, job_id: int) -> None:
        """Move the clock to the job's due time."""
        self.clock.advance_to(self.queues.get_job(job_id).run_after)


class Recorder:
    """A handler that records the jobs it ran and raises while ``failing`` is set."""

    def __init__(self, failing: bool = False) -> None:
        self.jobs: list[Job] = []
        self.failing = failing
        self._lock = threading.Lock()

    def __call__(self, job: Job, abort: Abort) -> None:
        with self._lock:
            self.jobs.append(job)
        if self.failing:
            raise RuntimeError(f"cannot process {job.payload}")

    @property
    def payloads(self) -> list[Any]:
        with self._lock:
            return [job.payload for job in self.jobs]


class Gate:
    """A handler whose first call blocks until ``release`` is set (a worker stuck mid-job);
    later calls return at once."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.aborts: list[Abort] = []
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, job: Job, abort: Abort) -> None:
        with self._lock:
            self.calls += 1
            first = self.calls == 1
            self.aborts.append(abort)
        if first:
            self.entered.set()
            assert self.release.wait(WAIT), "the test never released the handler"


class DeadLog:
    """An on_dead hook that records the jobs it was called with."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def __call__(self, job: Job) -> None:
        self.jobs.append(job)


class Background:
    """``target`` running in a thread; :meth:`join` waits for it and raises what it raised."""

    def __init__(self, target: Callable[[], object]) -> None:
        self._failures: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(target,), daemon=True)
        self._thread.start()

    def _run(self, target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:
            self._failures.append(exc)

    def join(self) -> None:
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "the thread did not finish"
        if self._failures:
            raise self._failures[0]


@contextmanager
def in_thread(target: Callable[[], object]) -> Iterator[Background]:
    """Run ``target`` in a thread for the duration of the block, then join it."""
    background = Background(target)
    try:
        yield background
    finally:
        background.join()


def all_at_once(
    count: int, call: Callable[[], T], pool: ThreadPoolExecutor | None = None
) -> list[T]:
    """``call`` from ``count`` threads (of ``pool``, else new ones) released together by a
    barrier; their results."""
    barrier = threading.Barrier(count)

    def racer() -> T:
        barrier.wait(WAIT)
        return call()

    if pool is None:
        with ThreadPoolExecutor(count) as own:
            return all_at_once(count, call, own)
    futures = [pool.submit(racer) for _ in range(count)]
    return [future.result(WAIT) for future in futures]


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


def at(clock: ManualClock, minutes: float) -> datetime:
    """The clock's start of day plus ``minutes``."""
    day = clock.now().replace(hour=0, minute=0, second=0, microsecond=0)
    return day + timedelta(minutes=minutes)


class QueuesContract:
    @pytest.fixture(autouse=True)
    def _frequent_thread_switches(self, request: pytest.FixtureRequest) -> Iterator[None]:
        """Threads of a concurrent test switch every microsecond instead of every 5 ms, so
        that a check-then-act without the right lock interleaves within a few runs."""
        if request.node.get_closest_marker("concurrent") is None:
            yield
            return
        before = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            yield
        finally:
            sys.setswitchinterval(before)

    # Standard queues, handlers, payloads

    def test_a_standard_queue_runs_every_job_it_is_sent(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        ids = [harness.queues.send("docs.ingest", {"n": n}) for n in range(30)]

        assert len(set(ids)) == 30
        assert harness.runner.run_due() == 30
        assert sorted(p["n"] for p in handler.payloads) == list(range(30))
        for job_id in ids:
            job = harness.queues.get_job(job_id)
            assert (job.status, job.attempts, job.error) == (JobStatus.COMPLETED, 1, None)
        assert harness.runner.run_due() == 0

    def test_jobs_of_a_queue_without_a_handler_wait_for_one(self, harness: Harness) -> None:
        harness.declare("served")
        harness.declare("unserved")
        harness.queues.register("served", Recorder())
        harness.queues.send("served", 1)
        waiting = harness.queues.send("unserved", 2)

        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(waiting).status is JobStatus.QUEUED

    def test_a_queue_has_one_handler(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        harness.queues.register("docs.ingest", Recorder())
        with pytest.raises(Conflict) as exc:
            harness.queues.register("docs.ingest", Recorder())
        assert "one handler" in one_line(exc)

    def test_a_send_to_an_undeclared_queue_is_refused(self, harness: Harness) -> None:
        with pytest.raises(NotFound) as exc:
            harness.queues.send("nowhere", {})
        assert "declare" in one_line(exc)

    def test_a_handler_gets_the_payload_as_json_keeps_it(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        payload = {"doc": "a.pdf", "pages": (1, 2), "meta": {"ok": True, "size": 1.5, "x": None}}
        job_id = harness.queues.send("docs.ingest", payload)

        expected = {"doc": "a.pdf", "pages": [1, 2], "meta": {"ok": True, "size": 1.5, "x": None}}
        assert harness.queues.get_job(job_id).payload == expected
        harness.runner.run_due()
        assert handler.payloads == [expected]

    @pytest.mark.parametrize(
        "payload",
        [
            {"when": datetime(2030, 1, 1, tzinfo=UTC)},
            {"tags": {"a", "b"}},
            {"ratio": math.nan},
            {1: "a key that is not a string"},
            {"text": "a NUL \x00 inside"},
            [b"bytes"],
        ],
        ids=["datetime", "set", "nan", "int-key", "nul", "bytes"],
    )
    def test_a_payload_that_is_not_json_is_refused(self, harness: Harness, payload: Any) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send("docs.ingest", payload)
        message = one_line(exc)
        assert "payload" in message and "docs.ingest" in message and "send" in message
        assert harness.queues.list_jobs() == []

    # Exclusive queues

    def test_an_exclusive_queue_admits_one_job_per_key_while_it_is_pending(
        self, harness: Harness
    ) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        seen_inside: list[int] = []

        def handler(job: Job, abort: Abort) -> None:
            # While this job is active, its key still admits no other job.
            seen_inside.append(harness.queues.send("sources.sync", {}, key=job.key))

        harness.queues.register("sources.sync", handler)
        first = harness.queues.send("sources.sync", {"source": 1}, key="source-1")
        assert harness.queues.send("sources.sync", {"source": 1}, key="source-1") == first
        other = harness.queues.send("sources.sync", {"source": 2}, key="source-2")
        assert other != first
        whole = harness.queues.send("sources.sync", {})
        assert harness.queues.send("sources.sync", {}) == whole
        assert len(harness.queues.list_jobs(queue="sources.sync")) == 3

        assert harness.runner.run_due() == 3
        assert sorted(seen_inside) == sorted([first, other, whole])
        again = harness.queues.send("sources.sync", {"source": 1}, key="source-1")
        assert again not in (first, other, whole)
        assert harness.queues.get_job(again).status is JobStatus.QUEUED

    def test_a_retrying_job_keeps_its_key(self, harness: Harness) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        harness.queues.register("sources.sync", Recorder(failing=True))
        job_id = harness.queues.send("sources.sync", {}, key="source-1")
        harness.runner.run_due()

        assert harness.queues.get_job(job_id).status is JobStatus.RETRYING
        assert harness.queues.send("sources.sync", {}, key="source-1") == job_id

    def test_a_key_on_a_standard_queue_is_refused(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send("docs.ingest", {}, key="doc-1")
        assert "exclusive" in one_line(exc)

    @pytest.mark.concurrent
    def test_concurrent_sends_of_one_key_make_one_job(self, harness: Harness) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        # Each round races 20 sends of a new key; a race lost in any round shows.
        with ThreadPoolExecutor(20) as pool:
            for source in range(100):
                ids = all_at_once(
                    20,
                    functools.partial(
                        harness.queues.send, "sources.sync", {}, key=f"source-{source}"
                    ),
                    pool,
                )
                assert len(set(ids)) == 1, f"round {source}: {sorted(set(ids))}"
        assert len(harness.queues.list_jobs(queue="sources.sync", limit=1000)) == 100

    # Start times

    def test_start_after_delays_a_job(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        harness.queues.register("docs.ingest", Recorder())
        later = harness.queues.send("docs.ingest", "later", start_after=timedelta(seconds=60))
        at_time = harness.queues.send(
            "docs.ingest", "at", start_after=harness.clock.now() + timedelta(seconds=120)
        )

        assert harness.runner.run_due() == 0
        harness.clock.advance(59)
        assert harness.runner.run_due() == 0
        harness.clock.advance(1)
        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(later).status is JobStatus.COMPLETED
        harness.clock.advance(59)
        assert harness.runner.run_due() == 0
        harness.clock.advance(1)
        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(at_time).status is JobStatus.COMPLETED

    def test_a_naive_start_time_is_refused(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send("docs.ingest", {}, start_after=datetime(2030, 1, 1))
        assert "timezone-aware" in one_line(exc)

    # Retries and dead letters

    def test_a_failing_job_is_retried_at_doubling_delays_dead_lettered_and_redriven(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.dead", retention=30 * 86400)
        harness.declare(
            "docs.ingest",
            retry_limit=3,
            retry_delay=10,
            retry_ceiling=3600,
            dead_letter="docs.dead",
        )
        handler, dead = Recorder(failing=True), DeadLog()
        harness.queues.register("docs.ingest", handler, on_dead=dead)
        job_id = harness.queues.send("docs.ingest", {"doc": 7})

        for _ in range(4):
            assert harness.runner.run_due() == 1
            if harness.queues.get_job(job_id).status is JobStatus.RETRYING:
                harness.make_due(job_id)

        job = harness.queues.get_job(job_id)
        assert (job.status, job.queue, job.origin_queue) == (
            JobStatus.DEAD,
            "docs.dead",
            "docs.ingest",
        )
        assert job.attempts == 4 and job.error == "RuntimeError: cannot process {'doc': 7}"
        assert [(j.id, j.status) for j in dead.jobs] == [(job_id, JobStatus.DEAD)]
        attempts = harness.queues.attempts(job_id)
        assert [a.outcome for a in attempts] == [AttemptOutcome.FAILED] * 4
        assert [a.attempt for a in attempts] == [1, 2, 3, 4]
        for n in (1, 2, 3):
            finished = attempts[n - 1].finished_at
            assert finished is not None
            waited = (attempts[n].started_at - finished).total_seconds()
            nominal = 10 * 2 ** (n - 1)
            assert nominal * 0.8 <= waited <= nominal * 1.2, (n, waited)

        # Dead means nothing runs it, however long one waits; the hook ran once.
        harness.clock.advance(86400)
        assert harness.runner.run_due() == 0
        assert len(dead.jobs) == 1
        stats = {s.name: s for s in harness.queues.queue_stats()}
        assert (stats["docs.dead"].dead, stats["docs.ingest"].dead) == (1, 0)

        handler.failing = False
        assert harness.queues.redrive("docs.dead") == Redrive((job_id,), ())
        job = harness.queues.get_job(job_id)
        assert (job.status, job.queue, job.attempts) == (JobStatus.QUEUED, "docs.ingest", 0)
        assert harness.runner.run_due() == 1
        job = harness.queues.get_job(job_id)
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 1)
        assert harness.queues.attempts(job_id)[-1].outcome is AttemptOutcome.COMPLETED
        assert len(dead.jobs) == 1

    def test_retry_delays_stop_at_the_ceiling(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_limit=5, retry_delay=10, retry_ceiling=25)
        harness.queues.register("docs.ingest", Recorder(failing=True))
        job_id = harness.queues.send("docs.ingest", {})
        delays = []
        for _ in range(5):
            harness.runner.run_due()
            job = harness.queues.get_job(job_id)
            assert job.status is JobStatus.RETRYING and job.finished_at is None
            delays.append((job.run_after - harness.clock.now()).total_seconds())
            harness.make_due(job_id)

        assert 8 <= delays[0] <= 12 and 16 <= delays[1] <= 24
        assert all(20 <= delay <= 25 for delay in delays[2:]), delays

    def test_a_queue_without_a_dead_letter_queue_keeps_its_dead(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_limit=0)
        handler = Recorder(failing=True)
        harness.queues.register("docs.ingest", handler)
        job_id = harness.queues.send("docs.ingest", {})
        harness.runner.run_due()

        job = harness.queues.get_job(job_id)
        assert (job.status, job.queue) == (JobStatus.DEAD, "docs.ingest")
        handler.failing = False
        assert harness.queues.redrive("docs.ingest") == Redrive((job_id,), ())
        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(job_id).status is JobStatus.COMPLETED

    def test_an_operator_retries_a_dead_job(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_limit=0)
        handler = Recorder(failing=True)
        harness.queues.register("docs.ingest", handler)
        job_id = harness.queues.send("docs.ingest", {})
        harness.runner.run_due()
        assert harness.queues.get_job(job_id).status is JobStatus.DEAD

        handler.failing = False
        assert harness.queues.retry_job(job_id).status is JobStatus.QUEUED
        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(job_id).status is JobStatus.COMPLETED
        with pytest.raises(Conflict) as exc:
            harness.queues.retry_job(job_id)
        assert "completed" in one_line(exc)

    def test_retrying_a_retrying_job_makes_it_due_now(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_delay=600, retry_ceiling=600)
        handler = Recorder(failing=True)
        harness.queues.register("docs.ingest", handler)
        job_id = harness.queues.send("docs.ingest", {})
        harness.runner.run_due()
        handler.failing = False

        assert harness.runner.run_due() == 0
        job = harness.queues.retry_job(job_id)
        assert (job.status, job.attempts) == (JobStatus.RETRYING, 1)
        assert harness.runner.run_due() == 1
        assert harness.queues.get_job(job_id).attempts == 2

    def test_a_redrive_leaves_a_job_whose_key_is_taken(self, harness: Harness) -> None:
        harness.declare("sources.dead")
        harness.declare(
            "sources.sync", policy=QueuePolicy.EXCLUSIVE, retry_limit=0, dead_letter="sources.dead"
        )
        handler = Recorder(failing=True)
        harness.queues.register("sources.sync", handler)
        died = harness.queues.send("sources.sync", {}, key="source-1")
        other = harness.queues.send("sources.sync", {}, key="source-2")
        harness.runner.run_due()
        newer = harness.queues.send("sources.sync", {}, key="source-1")

        assert harness.queues.redrive("sources.dead") == Redrive((other,), (died,))
        assert harness.queues.get_job(died).status is JobStatus.DEAD
        assert harness.queues.get_job(newer).status is JobStatus.QUEUED
        with pytest.raises(Conflict) as exc:
            harness.queues.retry_job(died)
        assert f"job {newer}" in one_line(exc)

    def test_a_failing_on_dead_hook_changes_nothing(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_limit=0)
        calls: list[int] = []

        def on_dead(job: Job) -> None:
            calls.append(job.id)
            raise RuntimeError("the application's database is down")

        handler = Recorder(failing=True)
        harness.queues.register("docs.ingest", handler, on_dead=on_dead)
        first = harness.queues.send("docs.ingest", {"n": 1})
        second = harness.queues.send("docs.ingest", {"n": 2})

        assert harness.runner.run_due() == 2
        assert calls == [first, second]
        assert {harness.queues.get_job(i).status for i in calls} == {JobStatus.DEAD}

    # Cancel

    def test_a_queued_job_is_cancelled_at_once(self, harness: Harness) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        handler = Recorder()
        harness.queues.register("sources.sync", handler)
        job_id = harness.queues.send("sources.sync", {}, key="source-1")

        job = harness.queues.cancel_job(job_id)
        assert job.status is JobStatus.CANCELLED and job.finished_at == harness.clock.now()
        assert harness.runner.run_due() == 0 and handler.jobs == []
        with pytest.raises(Conflict) as exc:
            harness.queues.cancel_job(job_id)
        assert "cancelled" in one_line(exc)
        assert harness.queues.send("sources.sync", {}, key="source-1") != job_id

    @pytest.mark.concurrent
    def test_an_active_job_is_cancelled_and_its_handler_told(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        gate = Gate()
        harness.queues.register("docs.ingest", gate)
        job_id = harness.queues.send("docs.ingest", {})

        with in_thread(harness.runner.run_due):
            assert gate.entered.wait(WAIT)
            assert harness.queues.get_job(job_id).status is JobStatus.ACTIVE
            assert harness.queues.cancel_job(job_id).status is JobStatus.CANCELLED
            assert gate.aborts[0].is_set
            gate.release.set()

        job = harness.queues.get_job(job_id)
        assert job.status is JobStatus.CANCELLED
        assert [a.outcome for a in harness.queues.attempts(job_id)] == [AttemptOutcome.CANCELLED]
        assert harness.runner.run_due() == 0

    # Batch handlers

    def test_a_batch_handler_gets_due_jobs_together_and_completes_them_all(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.embed")
        harness.declare("docs.ingest")
        batches: list[list[Any]] = []
        single = Recorder()
        harness.queues.register_batch(
            "docs.embed", lambda jobs, abort: batches.append([j.payload["n"] for j in jobs]), size=3
        )
        harness.queues.register("docs.ingest", single)
        ids = [harness.queues.send("docs.embed", {"n": n}) for n in range(7)]
        other = harness.queues.send("docs.ingest", {"n": 99})

        assert harness.runner.run_due() == 8
        assert [len(b) for b in batches] == [3, 3, 1]  # one queue's jobs, at most 3 a call
        assert sorted(n for b in batches for n in b) == list(range(7))
        assert single.payloads == [{"n": 99}]
        for job_id in [*ids, other]:
            job = harness.queues.get_job(job_id)
            assert (job.status, job.attempts, job.error) == (JobStatus.COMPLETED, 1, None)
            assert [a.outcome for a in harness.queues.attempts(job_id)] == [
                AttemptOutcome.COMPLETED
            ]
        assert harness.runner.run_due() == 0

    def test_run_due_stops_a_batch_at_its_limit(self, harness: Harness) -> None:
        harness.declare("docs.embed")
        sizes: list[int] = []
        harness.queues.register_batch(
            "docs.embed", lambda jobs, abort: sizes.append(len(jobs)), size=10
        )
        for n in range(5):
            harness.queues.send("docs.embed", {"n": n})

        assert harness.runner.run_due(limit=4) == 4
        assert harness.runner.run_due() == 1
        assert sizes == [4, 1]

    def test_a_failing_batch_fails_an_attempt_of_each_of_its_jobs(self, harness: Harness) -> None:
        harness.declare("docs.dead")
        harness.declare("docs.embed", retry_limit=1, retry_delay=10, dead_letter="docs.dead")
        failing = [True]
        seen: list[list[int]] = []
        dead = DeadLog()

        def handler(jobs: list[Job], abort: Abort) -> None:
            seen.append([j.attempts for j in jobs])
            if failing[0]:
                raise RuntimeError(f"cannot embed {len(jobs)} documents")

        harness.queues.register_batch("docs.embed", handler, size=10, on_dead=dead)
        first, second = (harness.queues.send("docs.embed", {"n": n}) for n in range(2))

        assert harness.runner.run_due() == 2
        for job_id in (first, second):
            job = harness.queues.get_job(job_id)
            assert (job.status, job.attempts) == (JobStatus.RETRYING, 1)
            assert job.error == "RuntimeError: cannot embed 2 documents"
        harness.make_due(first)
        harness.make_due(second)
        assert harness.runner.run_due() == 2
        assert seen == [[1, 1], [2, 2]]
        assert sorted(j.id for j in dead.jobs) == [first, second]  # the hook, once per job
        assert {harness.queues.get_job(i).status for i in (first, second)} == {JobStatus.DEAD}

        failing[0] = False
        assert harness.queues.redrive("docs.dead") == Redrive((first, second), ())
        assert harness.runner.run_due() == 2
        assert {harness.queues.get_job(i).status for i in (first, second)} == {JobStatus.COMPLETED}
        assert len(dead.jobs) == 2

    def test_a_cancel_sets_the_abort_of_its_batch_and_the_rest_complete(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.embed")
        entered, release = threading.Event(), threading.Event()
        aborts: list[Abort] = []

        def handler(jobs: list[Job], abort: Abort) -> None:
            aborts.append(abort)
            entered.set()
            assert release.wait(WAIT), "the test never released the handler"

        harness.queues.register_batch("docs.embed", handler, size=10)
        ids = [harness.queues.send("docs.embed", {"n": n}) for n in range(3)]

        with in_thread(harness.runner.run_due):
            assert entered.wait(WAIT)
            assert not aborts[0].is_set
            assert harness.queues.cancel_job(ids[1]).status is JobStatus.CANCELLED
            assert aborts[0].is_set
            release.set()

        statuses = [harness.queues.get_job(i).status for i in ids]
        assert statuses == [JobStatus.COMPLETED, JobStatus.CANCELLED, JobStatus.COMPLETED]
        assert len(aborts) == 1

    def test_a_batch_handler_reports_progress_on_every_job_of_its_batch(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.embed")
        reports: list[bool] = []

        def handler(jobs: list[Job], abort: Abort) -> None:
            reports.append(abort.report_progress(len(jobs), 10))

        harness.queues.register_batch("docs.embed", handler, size=10)
        ids = [harness.queues.send("docs.embed", {"n": n}) for n in range(2)]
        assert harness.runner.run_due() == 2

        assert reports == [True]
        for job_id in ids:
            job = harness.queues.get_job(job_id)
            assert (job.processed_units, job.total_units) == (2, 10)

    @pytest.mark.parametrize("size", [0, -1, 1001, 2.5, True])
    def test_a_batch_size_out_of_range_is_refused(self, harness: Harness, size: Any) -> None:
        harness.declare("docs.embed")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.register_batch("docs.embed", lambda jobs, abort: None, size=size)
        assert "batch size" in one_line(exc)
        harness.queues.register_batch("docs.embed", lambda jobs, abort: None, size=1000)

    # Expiry

    @pytest.mark.concurrent
    def test_an_attempt_past_its_expiry_is_taken_back_by_the_claim(self, harness: Harness) -> None:
        harness.declare("docs.ingest", expire=60)
        gates = {1: Gate(), 2: Gate()}

        def handler(job: Job, abort: Abort) -> None:
            gates[job.attempts](job, abort)

        harness.queues.register("docs.ingest", handler)
        job_id = harness.queues.send("docs.ingest", {})

        with in_thread(harness.runner.run_due) as stuck:  # a worker stuck in attempt 1
            assert gates[1].entered.wait(WAIT)
            harness.clock.advance(59)
            assert harness.runner.run_due() == 0  # not expired yet: nobody takes it
            harness.clock.advance(2)
            with in_thread(harness.runner.run_due):  # another worker's claim takes it back
                assert gates[2].entered.wait(WAIT)
                assert gates[1].aborts[0].is_set
                # The stuck attempt ends while attempt 2 runs: it changes nothing.
                gates[1].release.set()
                stuck.join()
                running = harness.queues.get_job(job_id)
                assert (running.status, running.attempts) == (JobStatus.ACTIVE, 2)
                gates[2].release.set()

        job = harness.queues.get_job(job_id)
        assert (job.status, job.attempts) == (JobStatus.COMPLETED, 2)
        attempts = harness.queues.attempts(job_id)
        assert [a.outcome for a in attempts] == [AttemptOutcome.EXPIRED, AttemptOutcome.COMPLETED]
        assert "expiry" in (attempts[0].error or "")

    def test_an_attempt_that_outlives_its_expiry_cannot_complete(self, harness: Harness) -> None:
        harness.declare("docs.ingest", expire=60)
        calls: list[int] = []

        def slow(job: Job, abort: Abort) -> None:
            calls.append(job.attempts)
            if job.attempts == 1:
                harness.clock.advance(61)

        harness.queues.register("docs.ingest", slow)
        job_id = harness.queues.send("docs.ingest", {})

        assert harness.runner.run_due() == 2
        assert calls == [1, 2]
        outcomes = [a.outcome for a in harness.queues.attempts(job_id)]
        assert outcomes == [AttemptOutcome.EXPIRED, AttemptOutcome.COMPLETED]

    @pytest.mark.concurrent
    def test_an_expired_attempt_with_no_retry_left_is_dead_lettered_once(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.dead")
        harness.declare("docs.ingest", expire=60, retry_limit=0, dead_letter="docs.dead")
        gate, dead = Gate(), DeadLog()
        harness.queues.register("docs.ingest", gate, on_dead=dead)
        job_id = harness.queues.send("docs.ingest", {})

        with in_thread(harness.runner.run_due):
            assert gate.entered.wait(WAIT)
            harness.clock.advance(61)
            assert harness.runner.run_due() == 0
            gate.release.set()

        job = harness.queues.get_job(job_id)
        assert (job.status, job.queue) == (JobStatus.DEAD, "docs.dead")
        assert "expiry" in (job.error or "")
        assert [j.id for j in dead.jobs] == [job_id]
        assert harness.runner.run_due() == 0 and gate.calls == 1

    # Progress

    def test_a_handler_reports_progress_fenced_by_its_attempt(self, harness: Harness) -> None:
        harness.declare("docs.ingest", expire=60)
        reports: list[bool] = []

        def handler(job: Job, abort: Abort) -> None:
            if job.attempts == 1:
                reports.append(abort.report_progress(10, 200))
                reports.append(abort.report_progress(20))
                harness.clock.advance(61)  # past the expiry: the attempt holds nothing now
                reports.append(abort.report_progress(30, 300))
            else:
                reports.append(abort.report_progress(200, 200))

        harness.queues.register("docs.ingest", handler)
        job_id = harness.queues.send("docs.ingest", {})
        assert harness.runner.run_due() == 2

        assert reports == [True, True, False, True]
        job = harness.queues.get_job(job_id)
        assert (job.status, job.processed_units, job.total_units) == (
            JobStatus.COMPLETED,
            200,
            200,
        )

    # Cron

    @pytest.mark.concurrent
    def test_cron_fires_once_per_tick_across_workers(self, harness: Harness) -> None:
        harness.declare("docs.sweep")
        harness.clock.advance_to(at(harness.clock, 1))
        harness.queues.schedule("docs.sweep", "*/5 * * * *", payload={"older_than": 3600})

        fired: list[int] = []
        for tick in range(1, 11):
            harness.clock.advance_to(at(harness.clock, 5 * tick))
            rounds = all_at_once(4, harness.runner.enqueue_due_schedules)
            assert sorted(len(sent) for sent in rounds) == [0, 0, 0, 1]
            fired.extend(job_id for sent in rounds for job_id in sent)
            harness.clock.advance(120)
            assert harness.runner.enqueue_due_schedules() == []

        jobs = [harness.queues.get_job(job_id) for job_id in fired]
        assert [job.tick for job in jobs] == [at(harness.clock, 5 * t) for t in range(1, 11)]
        assert {str(job.payload) for job in jobs} == {"{'older_than': 3600}"}
        assert len(harness.queues.list_jobs(queue="docs.sweep")) == 10

    def test_cron_after_an_outage_fires_once_not_for_every_missed_tick(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.sweep")
        harness.clock.advance_to(at(harness.clock, 1))
        harness.queues.schedule("docs.sweep", "*/5 * * * *")

        harness.clock.advance_to(at(harness.clock, 32))  # ticks 5, 10, ..., 30 went by
        sent = harness.runner.enqueue_due_schedules()
        assert len(sent) == 1
        assert harness.queues.get_job(sent[0]).tick == at(harness.clock, 30)
        assert harness.runner.enqueue_due_schedules() == []
        (schedule,) = harness.queues.list_schedules()
        assert (schedule.last_tick, schedule.next_tick) == (
            at(harness.clock, 30),
            at(harness.clock, 35),
        )

        harness.clock.advance_to(at(harness.clock, 35))
        (next_one,) = harness.runner.enqueue_due_schedules()
        assert harness.queues.get_job(next_one).tick == at(harness.clock, 35)

    def test_declaring_an_unchanged_schedule_again_keeps_its_next_tick(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.sweep")
        harness.clock.advance_to(at(harness.clock, 1))
        harness.queues.schedule("docs.sweep", "*/5 * * * *", payload="first")

        harness.clock.advance_to(at(harness.clock, 32))  # ticks 5, 10, ..., 30 went by unfired
        again = harness.queues.schedule("docs.sweep", " */5  * * * * ", payload="second")
        assert (again.cron, again.next_tick) == ("*/5 * * * *", at(harness.clock, 5))
        (sent,) = harness.runner.enqueue_due_schedules()
        job = harness.queues.get_job(sent)
        assert (job.tick, job.payload) == (at(harness.clock, 30), "second")

        harness.queues.schedule("docs.sweep", "*/5 * * * *", payload="second")
        assert harness.runner.enqueue_due_schedules() == []
        (schedule,) = harness.queues.list_schedules()
        assert (schedule.last_tick, schedule.next_tick) == (
            at(harness.clock, 30),
            at(harness.clock, 35),
        )

    def test_changing_a_schedule_s_cron_moves_its_next_tick(self, harness: Harness) -> None:
        harness.declare("docs.sweep")
        harness.clock.advance_to(at(harness.clock, 1))
        harness.queues.schedule("docs.sweep", "*/5 * * * *")
        harness.clock.advance_to(at(harness.clock, 6))
        (first,) = harness.runner.enqueue_due_schedules()

        harness.clock.advance_to(at(harness.clock, 32))  # ticks 10, 15, ..., 30 went by unfired
        moved = harness.queues.schedule("docs.sweep", "0 * * * *")
        assert (moved.cron, moved.last_tick, moved.next_tick) == (
            "0 * * * *",
            at(harness.clock, 5),
            at(harness.clock, 60),
        )
        assert harness.runner.enqueue_due_schedules() == []

        harness.clock.advance_to(at(harness.clock, 60))
        (second,) = harness.runner.enqueue_due_schedules()
        ticks = [harness.queues.get_job(job_id).tick for job_id in (first, second)]
        assert ticks == [at(harness.clock, 5), at(harness.clock, 60)]

    @pytest.mark.concurrent
    def test_an_exclusive_sweep_never_stacks_behind_itself(self, harness: Harness) -> None:
        harness.declare("docs.sweep", policy=QueuePolicy.EXCLUSIVE)
        gate = Gate()
        harness.queues.register("docs.sweep", gate)
        harness.queues.schedule("docs.sweep", "* * * * *")

        harness.clock.advance_to(at(harness.clock, 1))
        (first,) = harness.runner.enqueue_due_schedules()
        with in_thread(harness.runner.run_due):
            assert gate.entered.wait(WAIT)
            for minute in (2, 3, 4):  # the sweep runs longer than its interval
                harness.clock.advance_to(at(harness.clock, minute))
                assert harness.runner.enqueue_due_schedules() == []
            gate.release.set()

        assert [job.id for job in harness.queues.list_jobs(queue="docs.sweep")] == [first]
        assert harness.queues.get_job(first).status is JobStatus.COMPLETED
        harness.clock.advance_to(at(harness.clock, 5))
        (second,) = harness.runner.enqueue_due_schedules()
        assert harness.queues.get_job(second).tick == at(harness.clock, 5)

    def test_run_due_fires_due_schedules(self, harness: Harness) -> None:
        harness.declare("docs.sweep")
        handler = Recorder()
        harness.queues.register("docs.sweep", handler)
        harness.queues.schedule("docs.sweep", "@hourly", payload="sweep")

        harness.clock.advance(3600)
        assert harness.runner.run_due() == 1
        assert handler.payloads == ["sweep"]
        assert harness.queues.unschedule("docs.sweep") is True
        harness.clock.advance(3600)
        assert harness.runner.run_due() == 0

    @pytest.mark.parametrize(
        ("cron", "fault"),
        [
            ("*/5 * * *", "not valid"),
            ("61 * * * *", "not valid"),
            ("* * * * * *", "not valid"),
            ("0 0 30 2 *", "no date"),
        ],
    )
    def test_a_bad_cron_is_refused(self, harness: Harness, cron: str, fault: str) -> None:
        harness.declare("docs.sweep")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.schedule("docs.sweep", cron)
        assert fault in one_line(exc)
        assert harness.queues.list_schedules() == []

    def test_a_schedule_needs_a_declared_queue(self, harness: Harness) -> None:
        with pytest.raises(NotFound):
            harness.queues.schedule("nowhere", "* * * * *")

    # Concurrency of runners

    @pytest.mark.concurrent
    def test_concurrent_runners_run_each_job_once(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        for n in range(200):
            harness.queues.send("docs.ingest", n)

        ran = all_at_once(4, harness.runner.run_due)
        assert sum(ran) == 200
        assert sorted(handler.payloads) == list(range(200))
        assert {job.status for job in harness.queues.list_jobs(limit=200)} == {JobStatus.COMPLETED}

    # Declarations and what operators read

    def test_declarations_are_checked_against_the_other_queues(self, harness: Harness) -> None:
        with pytest.raises(NotFound) as exc:
            harness.declare("docs.ingest", dead_letter="docs.dead")
        assert "declare it first" in one_line(exc)
        harness.declare("docs.dead")
        harness.declare("docs.ingest", dead_letter="docs.dead")
        harness.declare("docs.ingest", dead_letter="docs.dead", retry_limit=9)
        assert harness.queues.get_queue("docs.ingest").retry_limit == 9
        assert [q.name for q in harness.queues.list_queues()] == ["docs.dead", "docs.ingest"]

        with pytest.raises(Conflict) as exc:
            harness.queues.delete_queue("docs.dead")
        assert "dead-letter queue of docs.ingest" in one_line(exc)
        job_id = harness.queues.send("docs.ingest", {})
        with pytest.raises(Conflict) as exc:
            harness.queues.delete_queue("docs.ingest")
        assert "1 queued" in one_line(exc)
        with pytest.raises(Conflict):
            harness.declare("docs.ingest", policy=QueuePolicy.EXCLUSIVE)

        harness.queues.cancel_job(job_id)
        harness.queues.delete_queue("docs.ingest")
        with pytest.raises(NotFound):
            harness.queues.get_queue("docs.ingest")
        with pytest.raises(NotFound):
            harness.queues.get_job(job_id)

    def test_queue_stats_count_jobs_by_status(self, harness: Harness) -> None:
        harness.declare("docs.ingest", retry_limit=1)
        inside: list[Any] = []

        def handler(job: Job, abort: Abort) -> None:
            if job.payload == "fails":
                raise RuntimeError("fails")
            if job.payload == "look":
                inside.extend(harness.queues.queue_stats())

        harness.queues.register("docs.ingest", handler)
        harness.queues.send("docs.ingest", "fails")
        harness.runner.run_due()  # one retrying
        harness.queues.send("docs.ingest", "later", start_after=timedelta(hours=1))
        harness.clock.advance(1)
        harness.queues.send("docs.ingest", "look")

        (stats,) = harness.queues.queue_stats()
        assert (stats.queued, stats.retrying, stats.active, stats.dead) == (2, 1, 0, 0)
        assert stats.oldest_due_at == harness.clock.now()
        assert stats.policy is QueuePolicy.STANDARD

        harness.clock.advance(3600)
        assert harness.runner.run_due() == 3
        (stats,) = harness.queues.queue_stats()
        assert (stats.queued, stats.retrying, stats.active, stats.dead) == (0, 0, 0, 1)
        assert stats.oldest_due_at is None
        assert [s.active for s in inside] == [1]

    def test_list_jobs_filters_by_queue_and_status_newest_first(self, harness: Harness) -> None:
        harness.declare("a")
        harness.declare("b")
        ids = [harness.queues.send(name, {}) for name in ("a", "b", "a")]
        harness.queues.cancel_job(ids[2])

        assert [j.id for j in harness.queues.list_jobs()] == ids[::-1]
        assert [j.id for j in harness.queues.list_jobs(queue="a")] == [ids[2], ids[0]]
        assert [j.id for j in harness.queues.list_jobs(status=JobStatus.QUEUED)] == ids[1::-1]
        assert [j.id for j in harness.queues.list_jobs(limit=1)] == [ids[2]]
        with pytest.raises(InvalidInput):
            harness.queues.list_jobs(limit=0)

    def test_finished_jobs_go_after_their_queues_retention(self, harness: Harness) -> None:
        harness.declare("docs.dead", retention=86400)
        harness.declare("docs.ingest", retention=3600, retry_limit=0, dead_letter="docs.dead")

        def handler(job: Job, abort: Abort) -> None:
            if job.payload == "fail":
                raise RuntimeError("fails")

        harness.queues.register("docs.ingest", handler)
        done = harness.queues.send("docs.ingest", "ok")
        died = harness.queues.send("docs.ingest", "fail")
        waiting = harness.queues.send("docs.ingest", "later", start_after=timedelta(days=30))
        harness.runner.run_due()

        harness.clock.advance(3600)
        assert harness.runner.prune() == 0
        harness.clock.advance(1)
        assert harness.runner.prune() == 1
        with pytest.raises(NotFound):
            harness.queues.get_job(done)
        harness.clock.advance(86400 - 3600)
        assert harness.runner.prune() == 1
        with pytest.raises(NotFound):
            harness.queues.attempts(died)
        assert harness.queues.get_job(waiting).status is JobStatus.QUEUED
