"""More of the queues' contract, run on the same four harnesses as :class:`QueuesContract`: a
send in the application's own transaction, many jobs in one send, priorities (and the rule that
keeps a job from waiting forever behind better ones), and a queue's fleet-wide limits."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from sync.errors import InvalidInput, NotFound
from sync.queues import Abort, Job, JobStatus, QueuePolicy
from tests.queues_contract import WAIT, Harness, Recorder, in_thread, one_line


class Overlap:
    """A handler that counts the attempts running at once, and holds each until ``width`` of
    them run together (so a limit is pressed on at every round), or until released."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.inside = 0
        self.most = 0
        self.ran = 0
        self._lock = threading.Lock()
        self._together = threading.Barrier(width)

    def __call__(self, job: Job, abort: Abort) -> None:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            self._together.wait(WAIT)
        finally:
            with self._lock:
                self.inside -= 1
                self.ran += 1


class SendingContract:
    # A send in the application's transaction

    def test_a_job_sent_in_a_transaction_exists_once_it_commits(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        tx = harness.begin()
        job_id = harness.queues.send("docs.ingest", {"doc": 1}, conn=tx.conn)

        assert harness.queues.list_jobs() == []
        with pytest.raises(NotFound):
            harness.queues.get_job(job_id)
        assert harness.runner.run_due() == 0
        tx.commit()
        assert [job.id for job in harness.queues.list_jobs()] == [job_id]
        assert harness.runner.run_due() == 1
        assert handler.payloads == [{"doc": 1}]

    def test_a_job_sent_in_a_transaction_that_rolls_back_never_exists(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.ingest")
        harness.queues.register("docs.ingest", Recorder())
        tx = harness.begin()
        job_id = harness.queues.send("docs.ingest", {"doc": 1}, conn=tx.conn)
        many = harness.queues.send_many("docs.ingest", [1, 2, 3], conn=tx.conn)
        tx.rollback()

        assert harness.queues.list_jobs() == []
        for gone in (job_id, *many):
            with pytest.raises(NotFound):
                harness.queues.get_job(gone)
        assert harness.runner.run_due() == 0

    def test_send_many_queues_a_job_per_payload_in_order(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        tx = harness.begin()
        inside = harness.queues.send_many("docs.ingest", [{"n": 1}, {"n": 2}], conn=tx.conn)
        tx.commit()
        outside = harness.queues.send_many("docs.ingest", [{"n": 3}, {"n": 4}, {"n": 5}])

        ids = inside + outside
        assert len(set(ids)) == 5
        assert [harness.queues.get_job(i).payload["n"] for i in ids] == [1, 2, 3, 4, 5]

    def test_send_many_to_an_exclusive_queue_makes_one_job(self, harness: Harness) -> None:
        harness.declare("docs.sweep", policy=QueuePolicy.EXCLUSIVE)
        ids = harness.queues.send_many("docs.sweep", ["a", "b", "c"])
        assert len(set(ids)) == 1
        assert harness.queues.get_job(ids[0]).payload == "a"

    @pytest.mark.parametrize("count", [0, 1001])
    def test_send_many_takes_1_to_1000_payloads(self, harness: Harness, count: int) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send_many("docs.ingest", [{}] * count)
        assert "1 to 1000" in one_line(exc)
        assert harness.queues.list_jobs() == []

    @pytest.mark.parametrize("commits", [True, False], ids=["commit", "rollback"])
    def test_a_second_sender_of_a_key_held_in_an_open_transaction_waits_for_it(
        self, harness: Harness, commits: bool
    ) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        tx = harness.begin()
        first = harness.queues.send("sources.sync", {"by": "tx"}, key="source-7", conn=tx.conn)
        second: list[int] = []

        def send_again() -> None:
            second.append(harness.queues.send("sources.sync", {"by": "other"}, key="source-7"))

        with in_thread(send_again):
            harness.until_blocked()
            assert second == []  # it waits for the transaction holding the key
            tx.commit() if commits else tx.rollback()
        jobs = harness.queues.list_jobs(queue="sources.sync")
        assert len(jobs) == 1
        if commits:
            assert second == [first] and jobs[0].payload == {"by": "tx"}
        else:
            assert second == [jobs[0].id] and jobs[0].payload == {"by": "other"}

    def test_a_send_in_one_transaction_gets_its_own_job_for_a_key_again(
        self, harness: Harness
    ) -> None:
        harness.declare("sources.sync", policy=QueuePolicy.EXCLUSIVE)
        tx = harness.begin()
        first = harness.queues.send("sources.sync", 1, key="k", conn=tx.conn)
        again = harness.queues.send("sources.sync", 2, key="k", conn=tx.conn)
        tx.commit()
        assert again == first
        assert len(harness.queues.list_jobs()) == 1

    @pytest.mark.parametrize("conn", ["a string", 42, object()], ids=["str", "int", "object"])
    def test_a_conn_that_is_no_transaction_is_refused(self, harness: Harness, conn: Any) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send("docs.ingest", {}, conn=conn)
        assert "conn must be" in one_line(exc)
        assert harness.queues.list_jobs() == []

    # Priorities

    def test_lower_priorities_run_first_and_the_queue_default_applies(
        self, harness: Harness
    ) -> None:
        harness.declare("docs.ingest", priority=4)
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        sent = [("p9", 9), ("p0", 0), ("default", None), ("p2", 2), ("p4", 4)]
        ids = {name: harness.queues.send("docs.ingest", name, priority=p) for name, p in sent}

        assert harness.queues.get_job(ids["default"]).priority == 4
        assert harness.runner.run_due() == 5
        assert handler.payloads == ["p0", "p2", "default", "p4", "p9"]

    def test_a_batch_takes_the_best_priorities_first(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        batches: list[list[Any]] = []
        harness.queues.register_batch(
            "docs.ingest", lambda jobs, abort: batches.append([j.payload for j in jobs]), size=2
        )
        for name, priority in [("late", 5), ("first", 0), ("second", 1), ("later", 6)]:
            harness.queues.send("docs.ingest", name, priority=priority)

        assert harness.runner.run_due() == 4
        assert batches == [["first", "second"], ["late", "later"]]

    def test_a_job_waits_behind_better_ones_for_priority_step_per_level_at_most(
        self, harness: Harness
    ) -> None:
        """The rule: due waiting jobs run in order of their due time plus priority_step
        seconds per priority level, so a job of priority 9 goes before a job of priority 0
        that became due more than 9 x priority_step seconds after it."""
        harness.declare("docs.ingest", priority_step=10)
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        harness.queues.send("docs.ingest", "p9 at 0 s", priority=9)
        harness.clock.advance(89)
        harness.queues.send("docs.ingest", "p0 at 89 s", priority=0)
        harness.clock.advance(2)
        harness.queues.send("docs.ingest", "p0 at 91 s", priority=0)

        assert harness.runner.run_due() == 3
        assert handler.payloads == ["p0 at 89 s", "p9 at 0 s", "p0 at 91 s"]

    def test_a_delayed_job_waits_for_its_time_whatever_its_priority(self, harness: Harness) -> None:
        harness.declare("docs.ingest")
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        later = harness.queues.send(
            "docs.ingest", "urgent later", priority=0, start_after=timedelta(minutes=5)
        )
        harness.queues.send("docs.ingest", "now", priority=9)

        assert harness.runner.run_due() == 1 and handler.payloads == ["now"]
        harness.make_due(later)
        assert harness.runner.run_due() == 1 and handler.payloads == ["now", "urgent later"]

    @pytest.mark.parametrize("priority", [-1, 10, 2.5, True, "1"])
    def test_a_priority_out_of_range_is_refused(self, harness: Harness, priority: Any) -> None:
        harness.declare("docs.ingest")
        with pytest.raises(InvalidInput) as exc:
            harness.queues.send("docs.ingest", {}, priority=priority)
        assert "priority" in one_line(exc) and "docs.ingest" in one_line(exc)
        assert harness.queues.list_jobs() == []

    # Fleet-wide limits

    @pytest.mark.concurrent
    def test_a_global_concurrency_limit_holds_under_eight_concurrent_runners(
        self, harness: Harness
    ) -> None:
        harness.declare("partner.api", global_concurrency=3)
        overlap = Overlap(3)
        harness.queues.register("partner.api", overlap)
        jobs = 300
        harness.queues.send_many("partner.api", list(range(jobs)))
        done = threading.Event()

        def runner() -> None:
            while not done.is_set():
                harness.runner.run_due()
                if overlap.ran >= jobs:
                    done.set()

        threads = [threading.Thread(target=runner) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT * 4)
        assert done.is_set(), f"{overlap.ran} of {jobs} ran"
        assert overlap.most == 3  # the limit was reached, and never passed
        completed = harness.queues.list_jobs(status=JobStatus.COMPLETED, limit=1000)
        assert len(completed) == jobs

    def test_a_rate_limit_starts_at_most_n_jobs_per_period(self, harness: Harness) -> None:
        harness.declare("partner.api", rate_limit=3, rate_period=60)
        handler = Recorder()
        harness.queues.register("partner.api", handler)
        harness.queues.send_many("partner.api", list(range(10)))

        assert harness.runner.run_due() == 3
        harness.clock.advance(59)
        assert harness.runner.run_due() == 0
        harness.clock.advance(1)
        assert harness.runner.run_due() == 3
        assert handler.payloads == list(range(6))

    def test_a_limited_queue_does_not_hold_back_other_queues(self, harness: Harness) -> None:
        harness.declare("partner.api", rate_limit=1, rate_period=3600)
        harness.declare("docs.ingest")
        harness.queues.register("partner.api", Recorder())
        handler = Recorder()
        harness.queues.register("docs.ingest", handler)
        harness.queues.send_many("partner.api", [1, 2])
        harness.queues.send_many("docs.ingest", ["a", "b"])

        assert harness.runner.run_due() == 3
        assert handler.payloads == ["a", "b"]

    def test_limits_are_declared_with_the_queue(self, harness: Harness) -> None:
        harness.declare(
            "partner.api", global_concurrency=5, rate_limit=100, rate_period=60, priority=3
        )
        spec = harness.queues.get_queue("partner.api")
        assert (spec.global_concurrency, spec.rate_limit, spec.rate_period, spec.priority) == (
            5,
            100,
            60,
            3,
        )
        with pytest.raises(InvalidInput) as exc:
            harness.declare("partner.other", rate_limit=100)
        assert "rate_period" in one_line(exc)
