"""The in-memory job table behind :class:`sync.queues.memory.InMemoryQueues`: what the Postgres
implementation keeps in its tables and changes with the statements of ``sql/queues.sql``, kept
in dicts. It holds the queues, the jobs with their attempts, the singleton slots and the
schedules, and makes each change a statement would: a job inserted or requeued holding its
slot, the due job that has waited longest started under a fresh fencing token, an attempt ended,
a job completed, retried later, cancelled or dead-lettered.

It decides nothing (``InMemoryQueues`` does, with the pure decisions) and takes no lock: every
call is made under the lock of the ``InMemoryQueues`` that owns it."""

from __future__ import annotations

import copy
import itertools
import threading
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sync.errors import Conflict, NotFound
from sync.queues.admission import singleton_slot
from sync.queues.declarations import QueueSpec
from sync.queues.models import (
    FINISHED,
    PENDING,
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    Schedule,
)

WAITING = (JobStatus.QUEUED, JobStatus.RETRYING)
_TAKEN_AWAY = (AttemptOutcome.CANCELLED, AttemptOutcome.EXPIRED)


class AttemptAbort:
    """The abort signal of one attempt (or of every attempt of one batch), and its progress
    report."""

    def __init__(self, report: Callable[[int, int | None], bool]) -> None:
        self._event = threading.Event()
        self._report = report

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(max(seconds, 0))

    def trip(self) -> None:
        self._event.set()

    def report_progress(self, processed: int, total: int | None = None) -> bool:
        return self._report(processed, total)

    def report_to(self, report: Callable[[int, int | None], bool]) -> None:
        self._report = report


@dataclass
class Entry:
    """A job's state, changed only under the lock."""

    id: int
    queue: str
    origin_queue: str
    payload: Any
    key: str | None
    status: JobStatus
    run_after: datetime
    created_at: datetime
    tick: datetime | None
    attempts: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    expires_at: datetime | None = None
    error: str | None = None
    processed_units: int | None = None
    total_units: int | None = None
    priority: int = 0
    slot: str | None = None  # the singleton slot it holds while pending
    token: int | None = None  # the running attempt's fencing token
    abort: AttemptAbort | None = None
    history: list[JobAttempt] = field(default_factory=list)

    def snapshot(self) -> Job:
        return Job(
            id=self.id,
            queue=self.queue,
            origin_queue=self.origin_queue,
            payload=copy.deepcopy(self.payload),
            key=self.key,
            status=self.status,
            attempts=self.attempts,
            run_after=self.run_after,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            expires_at=self.expires_at,
            error=self.error,
            tick=self.tick,
            processed_units=self.processed_units,
            total_units=self.total_units,
            priority=self.priority,
        )

    def claim_order(self, spec: QueueSpec) -> tuple[int, datetime, int]:
        """Where a claim takes it: an active attempt past its expiry first (by its expiry),
        then waiting jobs by their run_after plus ``priority_step`` per priority level."""
        if self.status is JobStatus.ACTIVE:
            assert self.expires_at is not None
            return 0, self.expires_at, self.id
        step = timedelta(seconds=spec.priority_step * self.priority)
        return 1, self.run_after + step, self.id


class JobTable:
    def __init__(self) -> None:
        self.queues: dict[str, QueueSpec] = {}
        self.jobs: dict[int, Entry] = {}
        self.schedules: dict[str, Schedule] = {}
        self._slots: dict[tuple[str, str], int] = {}  # (queue, slot) -> the pending job
        # Jobs sent in a transaction not committed yet: invisible, but holding their slots.
        self.staged: dict[int, tuple[Entry, object]] = {}
        # The starts of the jobs of rate-limited queues within their period.
        self._starts: dict[str, deque[datetime]] = {}
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)

    # Queues

    def spec(self, name: str) -> QueueSpec:
        spec = self.queues.get(name)
        if spec is None:
            raise NotFound(f"no queue named {name!r}; declare it first")
        return spec

    def pending_in(self, queue: str) -> int:
        return sum(1 for e in self.jobs.values() if e.origin_queue == queue and e.status in PENDING)

    def delete_queue(self, name: str) -> None:
        """The queue, its jobs and its schedule."""
        for entry in [e for e in self.jobs.values() if e.queue == name]:
            del self.jobs[entry.id]
        self.schedules.pop(name, None)
        del self.queues[name]

    # Jobs

    def entry(self, job_id: int) -> Entry:
        entry = self.jobs.get(job_id)
        if entry is None:
            raise NotFound(f"no job {job_id}")
        return entry

    def insert(
        self,
        spec: QueueSpec,
        payload: Any,
        key: str | None,
        run_after: datetime,
        now: datetime,
        tick: datetime | None,
        *,
        priority: int | None = None,
        transaction: object | None = None,
    ) -> tuple[int, bool]:
        """A new queued job, or the pending one holding its singleton slot (and False). In a
        ``transaction``, the new job is staged until :meth:`commit`."""
        slot = singleton_slot(spec, key)
        if slot is not None and (spec.name, slot) in self._slots:
            return self._slots[(spec.name, slot)], False
        entry = Entry(
            id=next(self._ids),
            queue=spec.name,
            origin_queue=spec.name,
            payload=payload,
            key=key,
            status=JobStatus.QUEUED,
            run_after=run_after,
            created_at=now,
            tick=tick,
            priority=spec.priority if priority is None else priority,
        )
        self._hold(entry, slot)
        if transaction is None:
            self.jobs[entry.id] = entry
        else:
            self.staged[entry.id] = (entry, transaction)
        return entry.id, True

    def slot_staged_by(self, spec: QueueSpec, key: str | None) -> object | None:
        """The transaction whose job not committed yet holds the slot of ``key``, if any."""
        slot = singleton_slot(spec, key)
        holder = self._slots.get((spec.name, slot)) if slot is not None else None
        staged = self.staged.get(holder) if holder is not None else None
        return None if staged is None else staged[1]

    def commit(self, transaction: object) -> None:
        for job_id, (entry, owner) in list(self.staged.items()):
            if owner is transaction:
                del self.staged[job_id]
                self.jobs[job_id] = entry

    def rollback(self, transaction: object) -> None:
        for job_id, (entry, owner) in list(self.staged.items()):
            if owner is transaction:
                del self.staged[job_id]
                self._release(entry)

    def requeue(self, entry: Entry, now: datetime) -> None:
        """A dead or cancelled job back to its queue, queued now with a fresh set of attempts."""
        spec = self.queues.get(entry.origin_queue)
        if spec is None:
            raise NotFound(
                f"job {entry.id}'s queue {entry.origin_queue!r} no longer exists; declare it "
                "again to retry the job"
            )
        slot = singleton_slot(spec, entry.key)
        holder = self._slots.get((spec.name, slot)) if slot is not None else None
        if holder is not None:
            raise Conflict(
                f"job {entry.id} cannot go back to queue {spec.name!r}: job {holder} with the "
                "same key is pending there and does its work"
            )
        entry.queue = spec.name
        entry.status = JobStatus.QUEUED
        entry.attempts = 0
        entry.run_after = now
        entry.finished_at = None
        self._hold(entry, slot)

    def cancel(self, entry: Entry, now: datetime) -> None:
        """A pending job cancelled; a running attempt of it ends, and its handler is told."""
        if entry.status is JobStatus.ACTIVE:
            self.close_attempt(entry, now, AttemptOutcome.CANCELLED, "cancelled while it ran")
        entry.status = JobStatus.CANCELLED
        entry.finished_at = now
        self._release(entry)

    def prune(self, now: datetime) -> int:
        """Forget the finished jobs past their queue's retention; how many."""
        gone = [
            entry.id
            for entry in self.jobs.values()
            if entry.status in FINISHED
            and entry.finished_at is not None
            and entry.finished_at + timedelta(seconds=self.queues[entry.queue].retention) < now
        ]
        for job_id in gone:
            del self.jobs[job_id]
        return len(gone)

    # Attempts

    def next_due(self, served: Collection[str], now: datetime) -> Entry | None:
        """The due job of a ``served`` queue that comes first in claim order (see
        :meth:`Entry.claim_order`): a queued or retrying job past its run_after, or an active
        one whose attempt outlived its expiry; none of a queue at its fleet-wide limit."""
        open_queues = {name for name in served if name in self.queues and self._room(name, now)}
        due = [
            entry
            for entry in self.jobs.values()
            if entry.origin_queue in open_queues
            and (
                (entry.status in WAITING and entry.run_after <= now)
                or (
                    entry.status is JobStatus.ACTIVE
                    and entry.expires_at is not None
                    and entry.expires_at < now
                )
            )
        ]
        return min(due, key=lambda e: e.claim_order(self.queues[e.origin_queue]), default=None)

    def _room(self, queue: str, now: datetime) -> bool:
        """Whether a claim may start another attempt of ``queue`` within its limits."""
        spec = self.queues[queue]
        if spec.global_concurrency is not None:
            active = sum(
                1
                for e in self.jobs.values()
                if e.origin_queue == queue
                and e.status is JobStatus.ACTIVE
                and e.expires_at is not None
                and e.expires_at >= now
            )
            if active >= spec.global_concurrency:
                return False
        if spec.rate_limit is not None and spec.rate_period is not None:
            starts = self._starts.setdefault(queue, deque())
            while starts and starts[0] <= now - timedelta(seconds=spec.rate_period):
                starts.popleft()
            if len(starts) >= spec.rate_limit:
                return False
        return True

    def new_token(self) -> int:
        return next(self._tokens)

    def start(self, entry: Entry, token: int, abort: AttemptAbort, now: datetime) -> None:
        """Start an attempt of ``entry`` held by ``token`` until the queue's expiry."""
        entry.status = JobStatus.ACTIVE
        entry.attempts += 1
        entry.token = token
        entry.abort = abort
        entry.started_at = now
        entry.finished_at = None
        spec = self.queues[entry.origin_queue]
        entry.expires_at = now + timedelta(seconds=spec.expire)
        if spec.rate_limit is not None:
            self._starts.setdefault(spec.name, deque()).append(now)
        entry.history.append(
            JobAttempt(entry.id, entry.attempts, entry.queue, now, None, None, None)
        )

    def holds(self, entry: Entry | None, token: int, now: datetime) -> bool:
        """Whether the attempt with ``token`` still holds the job: it was neither cancelled
        nor taken back, and has not outlived its expiry."""
        return (
            entry is not None
            and entry.token == token
            and entry.expires_at is not None
            and entry.expires_at >= now
        )

    def record_progress(
        self, job_id: int, token: int, processed: int, total: int | None, now: datetime
    ) -> bool:
        """A handler's progress, fenced by its attempt's token like the attempt's end."""
        entry = self.jobs.get(job_id)
        if not self.holds(entry, token, now):
            return False
        assert entry is not None
        entry.processed_units = processed
        if total is not None:
            entry.total_units = total
        return True

    def close_attempt(
        self, entry: Entry, now: datetime, outcome: AttemptOutcome, error: str | None
    ) -> None:
        """End the running attempt and forget its token. An attempt ended from outside (a
        cancel, a claim taking it back) has its abort signal set, so its handler stops."""
        entry.history[-1] = replace(
            entry.history[-1], finished_at=now, outcome=outcome, error=error
        )
        if outcome in (AttemptOutcome.FAILED, AttemptOutcome.EXPIRED):
            entry.error = error
        if entry.abort is not None and outcome in _TAKEN_AWAY:
            entry.abort.trip()
        entry.token = None
        entry.abort = None
        entry.expires_at = None

    def retry(self, entry: Entry, run_after: datetime) -> None:
        entry.status = JobStatus.RETRYING
        entry.run_after = run_after

    def complete(self, entry: Entry, now: datetime) -> None:
        entry.status = JobStatus.COMPLETED
        entry.finished_at = now
        self._release(entry)

    def bury(self, entry: Entry, spec: QueueSpec, now: datetime) -> None:
        """Dead-letter a job whose attempts are spent."""
        entry.status = JobStatus.DEAD
        entry.finished_at = now
        entry.queue = spec.dead_letter or spec.name
        self._release(entry)

    # Singleton slots

    def _hold(self, entry: Entry, slot: str | None) -> None:
        entry.slot = slot
        if slot is not None:
            self._slots[(entry.origin_queue, slot)] = entry.id

    def _release(self, entry: Entry) -> None:
        if entry.slot is not None:
            self._slots.pop((entry.origin_queue, entry.slot), None)
            entry.slot = None
