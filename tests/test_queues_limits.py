"""A queue's fleet-wide limits under real concurrent claimers on the real Postgres, and the plan
of the claim that enforces them and orders by priority."""

from __future__ import annotations

import json
import queue
import threading
from typing import Any

import pytest

from sync import Engine
from sync.jobs.lease import LeaseKeeper
from sync.queues import Abort, Job, JobStatus, queue_spec
from sync.queues.postgres import PostgresQueues
from sync.store.db import connect, listen_url
from sync.worker import Listener
from tests.lanes_support import Lanes
from tests.plans import explained, nodes
from tests.test_queues_postgres import BACKLOG, HISTORY, QUEUES

WORKERS = 8
# The claim workers call (docs/operations.md names the versions this release calls).
CLAIM = "claim_jobs_v5"
WAIT = 600.0


class Watch:
    """A handler that reads, while it runs, how many jobs of its queue are active across the
    database, and how many of its attempts run in this process at once."""

    def __init__(self, engine: Engine, queue: str) -> None:
        self._engine = engine
        self._queue = queue
        self._lock = threading.Lock()
        self.inside = 0
        self.most_inside = 0
        self.most_active = 0

    def __call__(self, job: Job, abort: Abort) -> None:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            with self._engine.pool.connection() as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM jobs WHERE origin_queue = %s AND status = 'active'",
                    (self._queue,),
                ).fetchone()
            assert row is not None
            with self._lock:
                self.most_active = max(self.most_active, row["n"])
        finally:
            with self._lock:
                self.inside -= 1


def _run_workers(engine: Engine, queue: str, handler: Any, until: Any, batch: int) -> None:
    """``WORKERS`` threads, each a worker of its own (its own PostgresQueues), claiming up to
    ``batch`` jobs at a time and running them, until ``until()`` holds."""
    failures: list[BaseException] = []

    def worker() -> None:
        queues = PostgresQueues(engine.pool)
        queues.register(queue, handler)
        try:
            while not until():
                for attempt in queues.claim([queue], batch):
                    queues.execute(attempt)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "a worker did not finish"
    assert failures == []


def _completed(engine: Engine, queue: str) -> int:
    with engine.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE origin_queue = %s AND status = 'completed'",
            (queue,),
        ).fetchone()
    assert row is not None
    return int(row["n"])


def test_a_global_concurrency_of_3_holds_for_5000_jobs_under_8_claiming_workers(
    engine: Engine,
) -> None:
    engine.queues.declare_queue(queue_spec("partner.api", global_concurrency=3))
    for start in range(0, 5000, 1000):
        engine.queues.send_many("partner.api", list(range(start, start + 1000)))
    watch = Watch(engine, "partner.api")
    done = threading.Event()

    def finished() -> bool:
        if not done.is_set() and _completed(engine, "partner.api") == 5000:
            done.set()
        return done.is_set()

    _run_workers(engine, "partner.api", watch, finished, batch=2)

    assert watch.most_active == 3, "the limit was never reached, or it was passed"
    assert watch.most_inside <= 3
    stats = {s.name: s for s in engine.queues.queue_stats()}["partner.api"]
    assert (stats.queued, stats.active) == (0, 0)


def test_a_rate_limit_starts_exactly_its_allowance_under_8_claiming_workers(
    engine: Engine,
) -> None:
    engine.queues.declare_queue(queue_spec("partner.api", rate_limit=50, rate_period=3600))
    engine.queues.send_many("partner.api", list(range(400)))
    rounds = threading.Barrier(WORKERS)
    claimed = 0
    lock = threading.Lock()

    def count(job: Job, abort: Abort) -> None:
        nonlocal claimed
        with lock:
            claimed += 1

    tries = 0

    def done() -> bool:
        # The workers claim in lockstep rounds (20 of them) that start their claims together.
        nonlocal tries
        with lock:
            tries += 1
            stop = tries > WORKERS * 20
        rounds.wait(60)
        return stop

    _run_workers(engine, "partner.api", count, done, batch=5)

    assert claimed == 50
    started = engine.queues.list_jobs(queue="partner.api", status=JobStatus.COMPLETED, limit=1000)
    assert len(started) == 50


def test_a_workers_lanes_on_a_full_queue_claim_again_as_their_jobs_end_not_at_the_poll(
    engine: Engine,
) -> None:
    """8 lanes of a queue limited to 2: a claim that finds the queue full of this worker's own
    jobs claims again as they end, so the queue drains with a poll interval of an hour."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("partner.api", global_concurrency=2))
    ran = threading.Semaphore(0)
    queues.register("partner.api", lambda job, abort: ran.release())
    queues.send_many("partner.api", list(range(40)))
    settings = engine.settings.model_copy(update={"poll_interval": 3600.0})
    url = settings.database_url
    assert url is not None
    keeper = LeaseKeeper(settings, lambda: connect(settings, url))
    lanes = Lanes(queues, {"partner.api": 8}, keeper, settings)
    lanes.start()
    try:
        for n in range(40):
            assert ran.acquire(timeout=60), f"{n} of 40 jobs ran; the lanes waited for the poll"
    finally:
        lanes.stop()
        keeper.stop()
    assert _completed(engine, "partner.api") == 40


def test_the_end_of_a_job_of_a_limited_queue_wakes_every_workers_lanes_of_it(
    engine: Engine,
) -> None:
    """Room a worker's job gives back in a queue's limit is announced on the engine's channel
    (job:<queue>), which wakes the lanes of that queue on every worker: another worker whose
    lanes found the queue full claims at once, not at its next poll."""
    queues = PostgresQueues(engine.pool)
    queues.declare_queue(queue_spec("partner.api", global_concurrency=1))
    queues.register("partner.api", lambda job, abort: None)
    woken: queue.Queue[str | None] = queue.Queue()
    url = listen_url(engine.settings, engine.url)
    assert url is not None
    listener = Listener(engine.settings, url, threading.Event(), on_job=woken.put)
    listener.start()
    settings = engine.settings.model_copy(update={"poll_interval": 3600.0})
    keeper = LeaseKeeper(settings, lambda: connect(settings, url))
    lanes = Lanes(queues, {"partner.api": 1}, keeper, settings)
    try:
        assert woken.get(timeout=60) is None  # connected
        job_id = queues.send("partner.api", {})
        assert woken.get(timeout=60) == "partner.api"  # the send's own wake-up
        lanes.start()
        assert woken.get(timeout=60) == "partner.api"  # the job ended: room again
    finally:
        lanes.stop()
        keeper.stop()
        listener.stop()
    assert queues.get_job(job_id).status is JobStatus.COMPLETED


def test_the_claim_walks_the_claim_order_index_and_stops_at_its_limit(
    engine: Engine, admin: Any
) -> None:
    """The claim takes its jobs over jobs_claim_order while no attempt of the queue
    is past its expiry, reading neither the finished history, nor the other queue's backlog,
    nor this queue's backlog past its limit, whatever the priorities."""
    admin.execute(HISTORY)
    admin.execute("ANALYZE job_queues, jobs")
    admin.execute(BACKLOG)
    admin.execute("UPDATE jobs SET priority = id % 10 WHERE origin_queue = 'docs.ingest'")
    claim = f"SELECT id, priority FROM {CLAIM}(ARRAY['docs.ingest'], 10, 60, NULL)"
    row, plans = explained(admin, claim)
    assert row is not None and row["priority"] == 0
    locking = [p for p in plans if "SKIP LOCKED" in p["Query Text"]]
    assert len(locking) == 1, [p["Query Text"] for p in plans]
    for plan in plans:
        scans = [
            n
            for n in nodes(plan["Plan"])
            if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"
        ]
        indexes = {n.get("Index Name", n["Node Type"]) for n in scans}
        assert indexes <= {"jobs_claim_order", "jobs_expiring", "jobs_pkey"}, json.dumps(plan)
        read = sum(
            n["Actual Rows"] + n.get("Rows Removed by Filter", 0)
            for n in scans
            if n.get("Index Name") != "jobs_pkey"
        )
        assert read <= 10, json.dumps(plan)


@pytest.mark.parametrize("analyzed", [True, False], ids=["20k-analyzed", "2k-no-statistics"])
def test_a_claim_reads_as_many_jobs_as_it_takes_whatever_the_planner_knows(
    engine: Engine, admin: Any, analyzed: bool
) -> None:
    """The claim runs on a generic plan, made once for any limit. Whether statistics know of a
    large backlog or know nothing of a small one yet, it must start its jobs by their primary
    key: a plan that expects a tenth of the backlog and hashes the whole jobs table, or one that
    scans a table it believes small, makes every claim, of one job or of a batch, cost as much
    as the table holds."""
    admin.execute(QUEUES)
    if analyzed:
        admin.execute(BACKLOG)
        admin.execute("ANALYZE job_queues, jobs")
    else:
        admin.execute(BACKLOG.replace("20000", "2000"))
    for limit in (1, 100):
        claim = f"SELECT count(*) AS n FROM {CLAIM}(ARRAY['docs.ingest'], {limit}, 60, NULL)"
        row, plans = explained(admin, claim)
        assert row is not None and row["n"] == limit
        for plan in plans:
            scans = [
                n
                for n in nodes(plan["Plan"])
                if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"
            ]
            assert not any(n["Node Type"] == "Seq Scan" for n in scans), json.dumps(plan)
            read = sum(n["Actual Rows"] + n.get("Rows Removed by Filter", 0) for n in scans)
            assert read <= 2 * limit + 1, json.dumps(plan)
