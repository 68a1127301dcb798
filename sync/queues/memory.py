"""The in-memory implementation of the queues port, for an application's unit tests: the same
behaviour as the Postgres implementation (one contract suite holds both), no database, time from
an injectable clock, and due jobs run through their handlers synchronously by ``run_due()``::

    clock = ManualClock()
    queues = InMemoryQueues(clock=clock)
    queues.declare_queue(queue_spec("knowledge.ingest"))
    queues.register("knowledge.ingest", ingest)
    my_module.upload(queues, document)  # calls queues.send(...)
    assert queues.run_due() == 1

Thread-safe: any number of threads may send, operate and call ``run_due()`` at once; handlers
and hooks run outside its lock."""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sync.base.clock import Clock, SystemClock
from sync.errors import Conflict, InvalidInput, NotFound
from sync.jobs.outcome import Action
from sync.queues.admission import check_key, due_time, singleton_slot
from sync.queues.cron import firing, next_tick, parse_cron
from sync.queues.declarations import QueueSpec
from sync.queues.failures import one_line
from sync.queues.models import (
    FINISHED,
    PENDING,
    AttemptOutcome,
    Job,
    JobAttempt,
    JobStatus,
    QueueStats,
    Redrive,
    Schedule,
)
from sync.queues.payloads import json_payload
from sync.queues.port import BatchHandler, DeadHook, Handler, JobRunner, Queues
from sync.queues.registry import HandlerRegistry, Registration
from sync.queues.retries import DEAD, fate_after

log = logging.getLogger("sync.queues")

MAX_LIST = 1000
_WAITING = (JobStatus.QUEUED, JobStatus.RETRYING)
_TAKEN_AWAY = (AttemptOutcome.CANCELLED, AttemptOutcome.EXPIRED)


class _AttemptAbort:
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
class _Entry:
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
    slot: str | None = None  # the singleton slot it holds while pending
    token: int | None = None  # the running attempt's fencing token
    abort: _AttemptAbort | None = None
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
        )

    def due_at(self) -> datetime:
        """When a claim may take it: its run_after, or an active attempt's expiry."""
        if self.status is JobStatus.ACTIVE:
            assert self.expires_at is not None
            return self.expires_at
        return self.run_after


@dataclass(frozen=True)
class _Claim:
    job: Job
    token: int
    abort: _AttemptAbort
    registration: Registration


_DeadCall = tuple[DeadHook, Job]


class InMemoryQueues(Queues, JobRunner):
    """Time comes from ``clock`` (the system clock by default); retry jitter from ``rand``."""

    def __init__(
        self, *, clock: Clock | None = None, rand: Callable[[], float] = random.random
    ) -> None:
        self._clock = clock or SystemClock()
        self._rand = rand
        self._lock = threading.Lock()
        self._handlers = HandlerRegistry()
        self._queues: dict[str, QueueSpec] = {}
        self._jobs: dict[int, _Entry] = {}
        self._slots: dict[tuple[str, str], int] = {}  # (queue, slot) -> the pending job
        self._schedules: dict[str, Schedule] = {}
        self._ids = itertools.count(1)
        self._tokens = itertools.count(1)

    # Declarations

    def declare_queue(self, spec: QueueSpec) -> QueueSpec:
        with self._lock:
            if spec.dead_letter is not None and spec.dead_letter not in self._queues:
                raise NotFound(
                    f"queue {spec.name!r} names dead-letter queue {spec.dead_letter!r}, which "
                    "does not exist; declare it first"
                )
            existing = self._queues.get(spec.name)
            if existing is not None and existing.policy is not spec.policy:
                pending = self._pending_in(spec.name)
                if pending:
                    raise Conflict(
                        f"queue {spec.name!r} has {pending} pending job(s); its policy can "
                        "change only while it has none"
                    )
            self._queues[spec.name] = spec
            return spec

    def get_queue(self, name: str) -> QueueSpec:
        with self._lock:
            return self._spec(name)

    def list_queues(self) -> list[QueueSpec]:
        with self._lock:
            return sorted(self._queues.values(), key=lambda spec: spec.name)

    def delete_queue(self, name: str) -> None:
        with self._lock:
            self._spec(name)
            pending = self._pending_in(name)
            if pending:
                raise Conflict(
                    f"queue {name!r} has {pending} queued, retrying or active job(s); cancel "
                    "them or let them finish first"
                )
            users = sorted(s.name for s in self._queues.values() if s.dead_letter == name)
            if users:
                raise Conflict(
                    f"queue {name!r} is the dead-letter queue of {', '.join(users)}; give "
                    "them another one first"
                )
            for entry in [e for e in self._jobs.values() if e.queue == name]:
                del self._jobs[entry.id]
            self._schedules.pop(name, None)
            del self._queues[name]

    # Handlers

    def register(self, queue: str, handler: Handler, *, on_dead: DeadHook | None = None) -> None:
        self._handlers.register(queue, handler, on_dead=on_dead)

    def register_batch(
        self,
        queue: str,
        handler: BatchHandler,
        *,
        size: int = 100,
        on_dead: DeadHook | None = None,
    ) -> None:
        self._handlers.register(queue, handler, on_dead=on_dead, batch=size)

    # Jobs

    def send(
        self,
        queue: str,
        payload: Any,
        *,
        key: str | None = None,
        start_after: datetime | timedelta | None = None,
    ) -> int:
        with self._lock:
            spec = self._spec(queue)
            check_key(spec, key)
            value = json_payload(queue, payload)
            now = self._clock.now()
            job_id, _ = self._insert(spec, value, key, due_time(now, start_after), now, None)
            return job_id

    def get_job(self, job_id: int) -> Job:
        with self._lock:
            return self._entry(job_id).snapshot()

    def list_jobs(
        self, *, queue: str | None = None, status: JobStatus | None = None, limit: int = 50
    ) -> list[Job]:
        if not 1 <= limit <= MAX_LIST:
            raise InvalidInput(f"limit must be from 1 to {MAX_LIST}, not {limit}")
        with self._lock:
            found = [
                entry
                for entry in sorted(self._jobs.values(), key=lambda e: -e.id)
                if (queue is None or entry.queue == queue)
                and (status is None or entry.status is status)
            ]
            return [entry.snapshot() for entry in found[:limit]]

    def attempts(self, job_id: int) -> list[JobAttempt]:
        with self._lock:
            return list(self._entry(job_id).history)

    def cancel_job(self, job_id: int) -> Job:
        with self._lock:
            entry = self._entry(job_id)
            if entry.status not in PENDING:
                raise Conflict(
                    f"job {job_id} is {entry.status}; only queued, retrying or active jobs can "
                    "be cancelled"
                )
            now = self._clock.now()
            if entry.status is JobStatus.ACTIVE:
                self._close_attempt(entry, now, AttemptOutcome.CANCELLED, "cancelled while it ran")
            entry.status = JobStatus.CANCELLED
            entry.finished_at = now
            self._release(entry)
            return entry.snapshot()

    def retry_job(self, job_id: int) -> Job:
        with self._lock:
            entry = self._entry(job_id)
            now = self._clock.now()
            if entry.status is JobStatus.RETRYING:
                entry.run_after = now
            elif entry.status in (JobStatus.DEAD, JobStatus.CANCELLED):
                self._requeue(entry, now)
            else:
                raise Conflict(
                    f"job {job_id} is {entry.status}; only dead, cancelled or retrying jobs can "
                    "be retried (send a new job instead)"
                )
            return entry.snapshot()

    def redrive(self, queue: str) -> Redrive:
        with self._lock:
            self._spec(queue)
            now = self._clock.now()
            redriven: list[int] = []
            skipped: list[int] = []
            for entry in sorted(self._jobs.values(), key=lambda e: e.id):
                if entry.queue != queue or entry.status is not JobStatus.DEAD:
                    continue
                try:
                    self._requeue(entry, now)
                except (Conflict, NotFound):
                    skipped.append(entry.id)
                else:
                    redriven.append(entry.id)
            return Redrive(tuple(redriven), tuple(skipped))

    # Cron

    def schedule(self, queue: str, cron: str, *, payload: Any = None) -> Schedule:
        expression = parse_cron(cron)
        with self._lock:
            self._spec(queue)
            value = json_payload(queue, payload)
            existing = self._schedules.get(queue)
            made = Schedule(
                queue=queue,
                cron=expression,
                payload=value,
                next_tick=next_tick(expression, self._clock.now()),
                last_tick=existing.last_tick if existing else None,
            )
            self._schedules[queue] = made
            return replace(made, payload=copy.deepcopy(value))

    def unschedule(self, queue: str) -> bool:
        with self._lock:
            return self._schedules.pop(queue, None) is not None

    def list_schedules(self) -> list[Schedule]:
        with self._lock:
            return [
                replace(s, payload=copy.deepcopy(s.payload))
                for s in sorted(self._schedules.values(), key=lambda s: s.queue)
            ]

    def enqueue_due_schedules(self) -> list[int]:
        sent: list[int] = []
        with self._lock:
            now = self._clock.now()
            for name, schedule in list(self._schedules.items()):
                fire = firing(schedule.cron, schedule.next_tick, now)
                if fire.tick is None:
                    continue
                job_id, created = self._insert(
                    self._queues[name], copy.deepcopy(schedule.payload), None, now, now, fire.tick
                )
                if created:
                    sent.append(job_id)
                self._schedules[name] = replace(
                    schedule, next_tick=fire.next_tick, last_tick=fire.tick
                )
        return sent

    # What operators watch

    def queue_stats(self) -> list[QueueStats]:
        with self._lock:
            now = self._clock.now()
            stats = []
            for spec in sorted(self._queues.values(), key=lambda s: s.name):
                inside = [e for e in self._jobs.values() if e.queue == spec.name]
                count = {status: 0 for status in JobStatus}
                for entry in inside:
                    count[entry.status] += 1
                due = [e.run_after for e in inside if e.status in _WAITING and e.run_after <= now]
                stats.append(
                    QueueStats(
                        name=spec.name,
                        policy=spec.policy,
                        queued=count[JobStatus.QUEUED],
                        active=count[JobStatus.ACTIVE],
                        retrying=count[JobStatus.RETRYING],
                        dead=count[JobStatus.DEAD],
                        oldest_due_at=min(due, default=None),
                    )
                )
            return stats

    # Running due jobs

    def run_due(self, *, limit: int = 1000) -> int:
        self.enqueue_due_schedules()
        ran = 0
        while ran < limit:
            with self._lock:
                claim, dead = self._claim(self._clock.now())
                batch = self._batch_of(claim, limit - ran, dead)
            self._call_hooks(dead)
            if claim is None:
                break
            if claim.registration.batch is None:
                error = self._run(claim)
                self._call_hooks(self._finish(claim, error))
                ran += 1
                continue
            error = self._run_batch(batch)
            for member in batch:
                self._call_hooks(self._finish(member, error))
            ran += len(batch)
        return ran

    def _batch_of(self, claim: _Claim | None, room: int, dead: list[_DeadCall]) -> list[_Claim]:
        """For a claim of a batch handler's queue, the batch it heads: more due jobs of that
        queue, up to the handler's size (or ``room``), sharing its abort signal. Under the
        lock."""
        if claim is None or claim.registration.batch is None:
            return [] if claim is None else [claim]
        batch = [claim]
        now = self._clock.now()
        while len(batch) < min(claim.registration.batch, room):
            more, gone = self._claim(now, only=claim.job.origin_queue, abort=claim.abort)
            dead.extend(gone)
            if more is None:
                break
            batch.append(more)
        held = [(member.job.id, member.token) for member in batch]
        claim.abort.report_to(functools.partial(self._report_all, held))
        return batch

    def prune(self) -> int:
        with self._lock:
            now = self._clock.now()
            gone = [
                entry.id
                for entry in self._jobs.values()
                if entry.status in FINISHED
                and entry.finished_at is not None
                and entry.finished_at + timedelta(seconds=self._queues[entry.queue].retention) < now
            ]
            for job_id in gone:
                del self._jobs[job_id]
            return len(gone)

    # Internals; the names ending without a lock take it themselves, the others expect it held.

    def _spec(self, name: str) -> QueueSpec:
        spec = self._queues.get(name)
        if spec is None:
            raise NotFound(f"no queue named {name!r}; declare it first")
        return spec

    def _entry(self, job_id: int) -> _Entry:
        entry = self._jobs.get(job_id)
        if entry is None:
            raise NotFound(f"no job {job_id}")
        return entry

    def _pending_in(self, queue: str) -> int:
        return sum(
            1 for e in self._jobs.values() if e.origin_queue == queue and e.status in PENDING
        )

    def _insert(
        self,
        spec: QueueSpec,
        payload: Any,
        key: str | None,
        run_after: datetime,
        now: datetime,
        tick: datetime | None,
    ) -> tuple[int, bool]:
        """A new queued job, or the pending one holding its singleton slot (and False)."""
        slot = singleton_slot(spec, key)
        if slot is not None and (spec.name, slot) in self._slots:
            return self._slots[(spec.name, slot)], False
        entry = _Entry(
            id=next(self._ids),
            queue=spec.name,
            origin_queue=spec.name,
            payload=payload,
            key=key,
            status=JobStatus.QUEUED,
            run_after=run_after,
            created_at=now,
            tick=tick,
        )
        self._hold(entry, slot)
        self._jobs[entry.id] = entry
        return entry.id, True

    def _hold(self, entry: _Entry, slot: str | None) -> None:
        entry.slot = slot
        if slot is not None:
            self._slots[(entry.origin_queue, slot)] = entry.id

    def _release(self, entry: _Entry) -> None:
        if entry.slot is not None:
            self._slots.pop((entry.origin_queue, entry.slot), None)
            entry.slot = None

    def _requeue(self, entry: _Entry, now: datetime) -> None:
        """A dead or cancelled job back to its queue, queued now with a fresh set of attempts."""
        spec = self._queues.get(entry.origin_queue)
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

    def _claim(
        self, now: datetime, *, only: str | None = None, abort: _AttemptAbort | None = None
    ) -> tuple[_Claim | None, list[_DeadCall]]:
        """Start an attempt of the due job that has waited longest, in a queue with a handler
        (``only`` that queue, when given). An active attempt past its expiry is taken back on
        the way: retried by this claim, or dead-lettered when its attempts are spent.
        ``abort``: the signal the attempt shares with its batch."""
        served = self._handlers.queues() if only is None else {only}
        dead: list[_DeadCall] = []
        while True:
            due = [
                entry
                for entry in self._jobs.values()
                if entry.origin_queue in served
                and (
                    (entry.status in _WAITING and entry.run_after <= now)
                    or (
                        entry.status is JobStatus.ACTIVE
                        and entry.expires_at is not None
                        and entry.expires_at < now
                    )
                )
            ]
            if not due:
                return None, dead
            entry = min(due, key=lambda e: (e.due_at(), e.id))
            spec = self._queues[entry.origin_queue]
            if entry.status is JobStatus.ACTIVE:
                error = f"the attempt outlived the queue's expiry of {spec.expire:g} s"
                self._close_attempt(entry, now, AttemptOutcome.EXPIRED, error)
                decision = fate_after(
                    AttemptOutcome.EXPIRED, attempts=entry.attempts, queue=spec, rand=self._rand
                )
                if decision == DEAD:
                    dead.extend(self._bury(entry, spec, now))
                    continue
            registration = self._handlers.get(entry.origin_queue)
            assert registration is not None
            token = next(self._tokens)
            if abort is None:
                abort = _AttemptAbort(functools.partial(self._report, entry.id, token))
            entry.status = JobStatus.ACTIVE
            entry.attempts += 1
            entry.token = token
            entry.abort = abort
            entry.started_at = now
            entry.finished_at = None
            entry.expires_at = now + timedelta(seconds=spec.expire)
            entry.history.append(
                JobAttempt(entry.id, entry.attempts, entry.queue, now, None, None, None)
            )
            return _Claim(entry.snapshot(), entry.token, abort, registration), dead

    def _report(self, job_id: int, token: int, processed: int, total: int | None) -> bool:
        """A handler's progress, fenced by its attempt's token like the attempt's end."""
        with self._lock:
            entry = self._jobs.get(job_id)
            if not self._holds(entry, token):
                return False
            assert entry is not None
            entry.processed_units = processed
            if total is not None:
                entry.total_units = total
            return True

    def _report_all(self, held: list[tuple[int, int]], processed: int, total: int | None) -> bool:
        """A batch handler's progress, on every job of its batch; True when each recorded it."""
        recorded = [self._report(job_id, token, processed, total) for job_id, token in held]
        return all(recorded)

    def _holds(self, entry: _Entry | None, token: int) -> bool:
        """Whether the attempt with ``token`` still holds the job: it was neither cancelled
        nor taken back, and has not outlived its expiry."""
        return (
            entry is not None
            and entry.token == token
            and entry.expires_at is not None
            and entry.expires_at >= self._clock.now()
        )

    def _run(self, claim: _Claim) -> str | None:
        """Run the handler; the failure as one line, or None when it returned."""
        try:
            claim.registration.handler(claim.job, claim.abort)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "job %s of queue %s failed attempt %s: %s",
                claim.job.id,
                claim.job.queue,
                claim.job.attempts,
                error,
            )
            return error
        return None

    def _run_batch(self, batch: list[_Claim]) -> str | None:
        """Run a batch handler once over the batch; the failure as one line, or None."""
        head = batch[0]
        try:
            head.registration.handler([c.job for c in batch], head.abort)  # type: ignore[arg-type]
        except Exception as exc:
            error = one_line(exc)
            log.warning(
                "a batch of %d job(s) of queue %s failed: %s", len(batch), head.job.queue, error
            )
            return error
        return None

    def _finish(self, claim: _Claim, error: str | None) -> list[_DeadCall]:
        """Apply the attempt's end, fenced by its token: an attempt that was cancelled, taken
        back, or that outlived its expiry (a claim will take it back) changes nothing."""
        with self._lock:
            now = self._clock.now()
            entry = self._jobs.get(claim.job.id)
            if not self._holds(entry, claim.token):
                log.info(
                    "job %s: attempt %s ended after it lost the job",
                    claim.job.id,
                    claim.job.attempts,
                )
                return []
            assert entry is not None
            spec = self._queues[entry.origin_queue]
            outcome = AttemptOutcome.COMPLETED if error is None else AttemptOutcome.FAILED
            self._close_attempt(entry, now, outcome, error)
            decision = fate_after(outcome, attempts=entry.attempts, queue=spec, rand=self._rand)
            if decision.action is Action.REQUEUE:
                entry.status = JobStatus.RETRYING
                entry.run_after = now + timedelta(seconds=decision.delay or 0.0)
                return []
            if decision.status is JobStatus.COMPLETED:
                entry.status = JobStatus.COMPLETED
                entry.finished_at = now
                self._release(entry)
                return []
            return self._bury(entry, spec, now)

    def _close_attempt(
        self, entry: _Entry, now: datetime, outcome: AttemptOutcome, error: str | None
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

    def _bury(self, entry: _Entry, spec: QueueSpec, now: datetime) -> list[_DeadCall]:
        """Dead-letter a job whose attempts are spent; the on_dead hook to call, if any."""
        entry.status = JobStatus.DEAD
        entry.finished_at = now
        entry.queue = spec.dead_letter or spec.name
        self._release(entry)
        registration = self._handlers.get(entry.origin_queue)
        if registration is None or registration.on_dead is None:
            return []
        return [(registration.on_dead, entry.snapshot())]

    def _call_hooks(self, calls: list[_DeadCall]) -> None:
        for hook, job in calls:
            try:
                hook(job)
            except Exception as exc:
                log.error(
                    "the on_dead hook of queue %s failed for job %s: %s",
                    job.origin_queue,
                    job.id,
                    one_line(exc),
                )
